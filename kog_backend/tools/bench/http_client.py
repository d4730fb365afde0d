"""`kog bench --url URL [--url URL2]`: per-request speed of live `vllm serve` servers as a client sees it.

One streaming `/v1/completions` request at a time (batch 1), servers interleaved A, B, A, B ... so that drift
hits both alike; a bounded number of requests, each with a timeout. The prompt is random token ids; `ignore_eos`
makes every request produce `new_tokens`. The requests set no sampling field unless told (flags, `--greedy`): each
server applies its default, its model's generation config, as for a client that sets none. With
`stream_options.continuous_usage_stats` every chunk carries the running completion-token count, so bursts of
several tokens (kog's K tokens per step) are counted exactly.

Per request (seconds from sending it):
  ttft        first chunk that carries a token
  decode tok/s (tokens after the first chunk) / (last token chunk - first token chunk)
  e2e tok/s   tokens / (end of stream - send)
  max gap     longest pause between token chunks (what a streaming reader sees with K > 1)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import statistics
import time
from typing import Any

from kog_backend.tools.bench.results import BenchReport, ModelResult, RunResult


@dataclasses.dataclass
class HttpSettings:
    urls: list[str]
    labels: list[str] | None = None
    model: str | None = None  # served model name; default: the server's first /v1/models entry
    prompt_len: int = 32
    new_tokens: int = 512
    greedy: bool = False  # --greedy: temperature 0 (in sampling_overrides)
    sampling_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # the only sampling fields sent
    sampling_seed: int | None = None  # sent as "seed" when given
    requests: int = 5
    warmup: int = 1
    max_token_id: int = 1000
    timeout_s: float = 300.0
    wait_ready_s: float = 0.0  # poll /health this long before the first request
    seed: int = 0  # prompt token ids

    def public(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("urls")
        d["sampling"] = {"greedy": d.pop("greedy"), "overrides": d.pop("sampling_overrides"), "seed": d.pop("sampling_seed")}
        return d


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclasses.dataclass
class RequestTiming:
    ttft_s: float | None = None
    first_tokens: int = 0  # tokens in the first token chunk
    t_last_s: float | None = None  # last chunk carrying a token
    t_end_s: float = 0.0
    tokens: int = 0
    chunks: int = 0
    max_gap_s: float | None = None
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tokens": self.tokens, "chunks": self.chunks, "error": self.error}
        if self.ttft_s is not None:
            d["ttft_ms"] = self.ttft_s * 1e3
        span = (self.t_last_s or 0.0) - (self.ttft_s or 0.0)
        if self.ttft_s is not None and span > 0 and self.tokens > self.first_tokens:
            d["decode_tok_s"] = (self.tokens - self.first_tokens) / span
        if self.t_end_s > 0 and self.tokens:
            d["e2e_tok_s"] = self.tokens / self.t_end_s
        d["max_gap_ms"] = None if self.max_gap_s is None else self.max_gap_s * 1e3
        return d


async def wait_ready(client: Any, url: str, wait_s: float) -> None:
    """Polls `/health` (every second) until it answers 200 or `wait_s` has passed; the caller then finds out."""
    import aiohttp

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            async with client.get(f"{base_url(url)}/health", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status == 200:
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(1.0)


async def served_model(client: Any, url: str, timeout_s: float) -> str:
    import aiohttp

    async with client.get(f"{base_url(url)}/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        resp.raise_for_status()
        data = await resp.json()
    models = [m["id"] for m in data.get("data", [])]
    if not models:
        raise RuntimeError(f"{url} serves no model")
    return models[0]


async def stream_one(client: Any, url: str, body: dict[str, Any], timeout_s: float) -> RequestTiming:
    """One streaming completion; parses the server-sent events as they arrive."""
    import aiohttp

    t = RequestTiming()
    start = time.perf_counter()
    last_token_at: float | None = None
    try:
        async with client.post(
            f"{base_url(url)}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                t.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return t
            buf = b""
            async for chunk in resp.content.iter_any():
                now = time.perf_counter() - start
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    tokens = _event_tokens(ev, t)
                    if tokens is None:
                        continue
                    if tokens > t.tokens:
                        if t.ttft_s is None:
                            t.ttft_s, t.first_tokens = now, tokens
                        else:
                            gap = now - (last_token_at or now)
                            t.max_gap_s = gap if t.max_gap_s is None else max(t.max_gap_s, gap)
                        last_token_at = now
                        t.t_last_s = now
                        t.chunks += 1
                        t.tokens = tokens
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        t.error = f"{type(e).__name__}: {e}"
    t.t_end_s = time.perf_counter() - start
    return t


def _event_tokens(ev: bytes, t: RequestTiming) -> int | None:
    """Running completion-token count after this event, or None for events that carry none."""
    for line in ev.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return None
        data = json.loads(payload)
        if "error" in data:
            t.error = str(data["error"])[:300]
            return None
        usage = data.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            return int(usage["completion_tokens"])
        # A server without continuous usage stats: count one token per chunk that carries text.
        if any(c.get("text") for c in data.get("choices", [])):
            return t.tokens + 1
    return None


def request_body(model: str, s: HttpSettings, rng: random.Random) -> dict[str, Any]:
    """A streaming completion that sets only the sampling fields the bench was given: every other one is the
    server's default (its model's generation config, as vLLM applies it)."""
    body = {
        "model": model,
        "prompt": [rng.randrange(s.max_token_id) for _ in range(s.prompt_len)],
        "max_tokens": s.new_tokens,
        **s.sampling_overrides,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if s.sampling_seed is not None:
        body["seed"] = s.sampling_seed
    return body


def aggregate(label: str, timings: list[RequestTiming], expected_tokens: int) -> RunResult:
    row = RunResult(impl=label)
    row.requests = [t.summary() for t in timings]
    good = [r for r in row.requests if r.get("decode_tok_s") and not r.get("error")]
    errors = [r["error"] for r in row.requests if r.get("error")]
    if errors:
        row.warnings.append(f"{len(errors)} of {len(timings)} requests failed: {errors[0]}")
    short = [r["tokens"] for r in row.requests if not r.get("error") and r["tokens"] != expected_tokens]
    if short:
        row.warnings.append(f"{len(short)} requests returned {short[0]} tokens, not {expected_tokens}")
    if not good:
        row.error = errors[0] if errors else "no request produced tokens"
        return row
    row.ok = True
    row.tok_s = statistics.median(r["decode_tok_s"] for r in good)
    row.ms_per_token = 1e3 / row.tok_s
    row.ttft_ms = statistics.median(r["ttft_ms"] for r in good)
    row.times_full_s = [t.t_end_s for t in timings if not t.error]
    return row


async def _run(s: HttpSettings) -> BenchReport:
    import aiohttp

    from kog_backend import __version__
    from kog_backend.tools.bench import environment

    labels = s.labels or [chr(ord("A") + i) for i in range(len(s.urls))]
    report = BenchReport(kind="http", date=environment.utc_now(), commit=environment.commit(), kog_version=__version__)
    report.settings = {**s.public(), "labels": labels}
    rng = random.Random(s.seed)
    timings: dict[str, list[RequestTiming]] = {u: [] for u in s.urls}
    results: dict[str, ModelResult] = {}
    async with aiohttp.ClientSession() as client:
        names = {}
        for url, label in zip(s.urls, labels):
            try:
                if s.wait_ready_s > 0:
                    await wait_ready(client, url, s.wait_ready_s)
                names[url] = s.model or await served_model(client, url, s.timeout_s)
            except Exception as e:  # noqa: BLE001 - an unreachable server is a failed row, not a crash
                results[url] = ModelResult(model="?", path=url, rows=[RunResult(impl=label, error=f"{type(e).__name__}: {e}")])
        live = [u for u in s.urls if u in names]
        bar = _bar(len(live) * (s.warmup + s.requests))
        for i in range(s.warmup + s.requests):
            round_seed = rng.random()  # the same prompt for every server in this round
            for url in live:
                t = await stream_one(client, url, request_body(names[url], s, random.Random(round_seed)), s.timeout_s)
                if i >= s.warmup:
                    timings[url].append(t)
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        for url, label in zip(s.urls, labels):
            if url in names:
                results[url] = ModelResult(model=names[url], path=url, rows=[aggregate(label, timings[url], s.new_tokens)])
    report.models = [results[u] for u in s.urls]
    return report


def _bar(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="requests", unit="req", dynamic_ncols=True)


def run_http(s: HttpSettings) -> BenchReport:
    return asyncio.run(_run(s))
