"""`kog bench --url`: the streaming client against fake OpenAI-compatible servers on 127.0.0.1 (bounded:
a few requests of a few tokens each, every request with a timeout)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from aiohttp import web

from kog_backend.tools.bench import http_client
from kog_backend.tools.bench.table import format_table


class FakeServer:
    """Streams `max_tokens` tokens: the first after `ttft_s`, then bursts of `burst` tokens every
    `burst * per_token_s` seconds. Records every request body."""

    def __init__(self, ttft_s: float, per_token_s: float, burst: int = 1, usage: bool = True, status: int = 200,
                 ready_after_s: float = 0.0):
        self.ttft_s, self.per_token_s, self.burst, self.usage, self.status = ttft_s, per_token_s, burst, usage, status
        self.ready_at = time.monotonic() + ready_after_s
        self.health_polls = 0
        self.bodies: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _health(self, request):
        self.health_polls += 1
        return web.Response(status=200 if time.monotonic() >= self.ready_at else 503)

    async def _models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        if self.status != 200:
            return web.json_response({"error": {"message": "boom"}}, status=self.status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = body["max_tokens"]
        await asyncio.sleep(self.ttft_s)
        sent = 0
        while sent < n:
            k = 1 if sent == 0 else min(self.burst, n - sent)
            if sent:
                await asyncio.sleep(self.per_token_s * k)
            sent += k
            chunk = {"choices": [{"index": 0, "text": "x" * k}]}
            if self.usage:
                chunk["usage"] = {"prompt_tokens": len(body["prompt"]), "completion_tokens": sent}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def __enter__(self):
        self.thread.start()

        async def start():
            app = web.Application()
            app.router.add_get("/health", self._health)
            app.router.add_get("/v1/models", self._models)
            app.router.add_post("/v1/completions", self._completions)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
            return f"http://127.0.0.1:{port}"

        self.url = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _settings(urls, **kw) -> http_client.HttpSettings:
    base = dict(prompt_len=8, new_tokens=40, requests=2, warmup=1, timeout_s=20.0)
    base.update(kw)
    return http_client.HttpSettings(urls=urls, **base)


def test_ab_two_servers():
    with FakeServer(ttft_s=0.05, per_token_s=0.004) as slow, FakeServer(ttft_s=0.02, per_token_s=0.001, burst=4) as fast:
        t0 = time.monotonic()
        rep = http_client.run_http(_settings([slow.url, fast.url + "/v1"], labels=["stock", "kog"]))
        assert time.monotonic() - t0 < 15
    assert rep.kind == "http" and [m.path for m in rep.models] == [slow.url, fast.url + "/v1"]
    a, b = rep.models[0].rows[0], rep.models[1].rows[0]
    assert (a.impl, b.impl) == ("stock", "kog") and a.ok and b.ok and rep.models[0].model == "fake-model"
    for r in (a, b):
        assert len(r.requests) == 2 and all(q["tokens"] == 40 for q in r.requests)
    # 39 tokens after the first, 4 ms each: <= 250 tok/s (sleeps only lengthen); 1 ms each in bursts of 4
    assert 100 < a.tok_s <= 255
    assert b.tok_s > 1.5 * a.tok_s
    assert a.ttft_ms >= 50 and b.ttft_ms >= 20
    assert all(q["chunks"] == 40 for q in a.requests)
    assert all(q["chunks"] == 1 + 39 // 4 + 1 for q in b.requests)  # 1, then 9 bursts of 4, then 3
    assert all(q["max_gap_ms"] >= 4 for q in b.requests)
    # identical settings and prompts on both servers, 1 warm-up + 2 timed requests each
    assert len(slow.bodies) == len(fast.bodies) == 3
    for x, y in zip(slow.bodies, fast.bodies):
        assert x["prompt"] == y["prompt"] and len(x["prompt"]) == 8 and max(x["prompt"]) < 1000
        assert x["stream"] and x["ignore_eos"] and x["max_tokens"] == 40
        assert x["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert slow.bodies[0]["prompt"] != slow.bodies[1]["prompt"]
    # no sampling field: each server applies its model's generation config, as for a client that sets none
    assert not {"temperature", "top_p", "top_k", "min_p", "seed"} & set(slow.bodies[0])
    text = format_table(rep)
    assert "stock" in text and "kog" in text and "x vs stock" in text
    assert "sampling: each server's default: its model's generation config as vLLM applies it" in text
    assert rep.settings["sampling"] == {"greedy": False, "overrides": {}, "seed": None}


def test_greedy_and_explicit_fields_are_sent():
    with FakeServer(ttft_s=0.0, per_token_s=0.0) as srv:
        greedy = http_client.run_http(_settings([srv.url], requests=1, warmup=0, new_tokens=4, greedy=True,
                                                sampling_overrides={"temperature": 0.0}))
        explicit = http_client.run_http(_settings([srv.url], requests=1, warmup=0, new_tokens=4,
                                                  sampling_overrides={"temperature": 0.8, "top_p": 0.9}, sampling_seed=5))
    assert srv.bodies[0]["temperature"] == 0.0 and "top_p" not in srv.bodies[0] and "seed" not in srv.bodies[0]
    assert (srv.bodies[1]["temperature"], srv.bodies[1]["top_p"], srv.bodies[1]["seed"]) == (0.8, 0.9, 5)
    assert 'sampling: greedy (--greedy): the requests set "temperature": 0' in format_table(greedy)
    assert ('sampling: the requests set "temperature": 0.8, "top_p": 0.9, "seed": 5; every other field is each '
            "server's default") in format_table(explicit)


def test_server_without_usage_counts_text_chunks():
    with FakeServer(ttft_s=0.01, per_token_s=0.001, usage=False) as srv:
        rep = http_client.run_http(_settings([srv.url], requests=1, warmup=0, new_tokens=12))
    r = rep.models[0].rows[0]
    assert r.ok and r.requests[0]["tokens"] == 12 and r.impl == "A"


def test_failing_and_unreachable_servers_are_failed_rows():
    from kog_backend.tools.commands.bench import exit_status

    with FakeServer(ttft_s=0.0, per_token_s=0.0, status=500) as bad:
        rep = http_client.run_http(_settings([bad.url, "http://127.0.0.1:9"], requests=1, warmup=0, timeout_s=5.0))
    r_bad, r_down = rep.models[0].rows[0], rep.models[1].rows[0]
    assert not r_bad.ok and "HTTP 500" in r_bad.error
    assert not r_down.ok and r_down.error
    assert exit_status(rep) == 1
    assert "FAILED" in format_table(rep)


def test_wait_ready_polls_health():
    with FakeServer(ttft_s=0.01, per_token_s=0.002, ready_after_s=1.5) as srv:
        t0 = time.monotonic()
        rep = http_client.run_http(_settings([srv.url], requests=1, warmup=0, new_tokens=4, wait_ready_s=20.0))
        waited = time.monotonic() - t0
    assert rep.models[0].rows[0].ok
    assert 1.4 <= waited < 10 and srv.health_polls >= 2


@pytest.mark.parametrize("url,base", [("http://h:1/", "http://h:1"), ("http://h:1/v1", "http://h:1"), ("http://h:1/v1/", "http://h:1")])
def test_base_url(url, base):
    assert http_client.base_url(url) == base


def test_command_http_mode_writes_json_and_png(tmp_path, capsys):
    import argparse

    from kog_backend.tools.bench.results import BenchReport
    from kog_backend.tools.commands import bench as bench_cmd

    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    with FakeServer(ttft_s=0.01, per_token_s=0.002) as a, FakeServer(ttft_s=0.01, per_token_s=0.001) as b:
        args = p.parse_args(["--url", a.url, "--url2", b.url, "--label", "stock", "--label", "kog", "--requests", "1",
                             "--warmup", "0", "--new-tokens", "10", "--out", str(tmp_path), "--commit", "c0ffee"])
        assert bench_cmd.run(args) == 0
    out = capsys.readouterr().out
    assert "streaming /v1/completions" in out and "x vs stock" in out
    assert all("temperature" not in body for body in a.bodies + b.bodies)
    rep = BenchReport.load(str(tmp_path / "http.json"))
    assert rep.kind == "http" and rep.commit == "c0ffee" and [m.rows[0].impl for m in rep.models] == ["stock", "kog"]
    with open(tmp_path / "http.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
