"""Batched traffic against a live `vllm serve`: N concurrent streaming requests of `new_tokens` tokens each.

    python -m kog_backend.tools.bench.concurrency --url URL --label stock --concurrency 2 4 8 32 --json out.json

Per concurrency N: `warmup` rounds, then `rounds` rounds of N requests sent at once (the http bench's streaming
client, kog_backend.tools.bench.http_client: random prompt ids, ignore_eos, the server's default sampling unless
--greedy). Reported per N (medians over rounds):
  aggregate tok/s     tokens of all N requests / wall time of the round (first send to last stream end)
  per-request tok/s   median over the round's requests of (tokens after the first chunk) / decode span
benchmarks/concurrency_ab.sh runs it against a stock server and a `--backend kog` server in one device call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from typing import Any

from kog_backend.tools.bench.http_client import HttpSettings, request_body, served_model, stream_one, wait_ready


def round_result(timings: list[Any], wall_s: float, new_tokens: int) -> dict[str, Any]:
    """One round of concurrent requests: aggregate and per-request throughput, errors and short requests."""
    reqs = [t.summary() for t in timings]
    errors = [r["error"] for r in reqs if r.get("error")]
    tokens = sum(r["tokens"] for r in reqs if not r.get("error"))
    per_req = [r["decode_tok_s"] for r in reqs if r.get("decode_tok_s") and not r.get("error")]
    return {
        "wall_s": wall_s,
        "tokens": tokens,
        "aggregate_tok_s": tokens / wall_s if wall_s > 0 else 0.0,
        "per_request_tok_s": statistics.median(per_req) if per_req else None,
        "errors": errors,
        "short": [r["tokens"] for r in reqs if not r.get("error") and r["tokens"] != new_tokens],
    }


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rounds if not r["errors"] and not r["short"]]
    out: dict[str, Any] = {"rounds": rounds, "ok": bool(ok) and len(ok) == len(rounds)}
    if ok:
        out["aggregate_tok_s"] = statistics.median(r["aggregate_tok_s"] for r in ok)
        per = [r["per_request_tok_s"] for r in ok if r["per_request_tok_s"] is not None]
        out["per_request_tok_s"] = statistics.median(per) if per else None
    return out


async def _run(url: str, concurrency: list[int], s: HttpSettings, rounds: int, warmup: int) -> dict[str, Any]:
    import aiohttp

    rng = random.Random(s.seed)
    results: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=max(concurrency) + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        if s.wait_ready_s > 0:
            await wait_ready(session, url, s.wait_ready_s)
        model = s.model or await served_model(session, url, s.timeout_s)
        for n in concurrency:
            done = []
            for i in range(warmup + rounds):
                bodies = [request_body(model, s, random.Random(rng.random())) for _ in range(n)]
                t0 = time.perf_counter()
                timings = await asyncio.gather(*(stream_one(session, url, b, s.timeout_s) for b in bodies))
                wall = time.perf_counter() - t0
                if i >= warmup:
                    done.append(round_result(list(timings), wall, s.new_tokens))
            results[str(n)] = summarize(done)
            r = results[str(n)]
            print(f"  {n:3d} concurrent: aggregate {r.get('aggregate_tok_s', float('nan')):8.1f} tok/s, per request "
                  f"{r.get('per_request_tok_s') or float('nan'):7.1f} tok/s{'' if r['ok'] else '  (errors)'}",
                  file=sys.stderr, flush=True)  # fmt: skip
    return {"url": url, "model": model, "new_tokens": s.new_tokens, "prompt_len": s.prompt_len, "results": results}


def compare(base: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Table lines: other / base at every concurrency of both."""
    lines = [f"{'N':>4} {'base agg':>10} {'other agg':>10} {'ratio':>7} {'base req':>9} {'other req':>9} {'ratio':>7}"]
    for n in base["results"]:
        a, b = base["results"][n], other["results"].get(n, {})
        ra = b.get("aggregate_tok_s", 0) / a["aggregate_tok_s"] if a.get("aggregate_tok_s") else float("nan")
        pa, pb = a.get("per_request_tok_s"), b.get("per_request_tok_s")
        rp = pb / pa if pa and pb else float("nan")
        lines.append(f"{n:>4} {a.get('aggregate_tok_s', 0):10.1f} {b.get('aggregate_tok_s', 0):10.1f} {ra:7.3f} "
                     f"{pa or 0:9.1f} {pb or 0:9.1f} {rp:7.3f}")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="server base URL (http://host:port)")
    p.add_argument("--label", default="")
    p.add_argument("--concurrency", type=int, nargs="+", default=[2, 4, 8, 32])
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--greedy", action="store_true", help="temperature 0 (default: the server's sampling defaults)")
    p.add_argument("--wait-ready", type=float, default=0.0, help="poll /health this long first (s)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--compare", nargs=2, metavar=("BASE_JSON", "OTHER_JSON"), help="print other / base and exit")
    a = p.parse_args(argv)
    if a.compare:
        base, other = (json.load(open(f)) for f in a.compare)
        print(f"{other.get('label', 'other')} / {base.get('label', 'base')}, {base['new_tokens']} new tokens")
        print("\n".join(compare(base, other)))
        return 0
    if not a.url:
        p.error("--url is required (or --compare)")
    s = HttpSettings(urls=[a.url], prompt_len=a.prompt_len, new_tokens=a.new_tokens, wait_ready_s=a.wait_ready,
                     sampling_overrides={"temperature": 0.0} if a.greedy else {})  # fmt: skip
    print(f"{a.label or a.url}:", file=sys.stderr)
    out = asyncio.run(_run(a.url, a.concurrency, s, a.rounds, a.warmup))
    out["label"] = a.label
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(r["ok"] for r in out["results"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
