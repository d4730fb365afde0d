"""kog_backend.tools.bench.concurrency: round arithmetic (aggregate = all tokens / wall time, per request = median
decode rate) and the comparison table, on fabricated timings."""

from __future__ import annotations

import json

from kog_backend.tools.bench import concurrency
from kog_backend.tools.bench.http_client import RequestTiming


def _timing(tokens, ttft, t_last, end, error=None):
    return RequestTiming(ttft_s=ttft, first_tokens=1, t_last_s=t_last, t_end_s=end, tokens=tokens, chunks=tokens,
                         error=error)  # fmt: skip


def test_round_result():
    ts = [_timing(512, 0.1, 5.2, 5.3), _timing(512, 0.2, 4.2, 4.3), _timing(512, 0.1, 10.32, 10.4)]
    r = concurrency.round_result(ts, wall_s=10.5, new_tokens=512)
    assert r["tokens"] == 1536 and abs(r["aggregate_tok_s"] - 1536 / 10.5) < 1e-9
    assert abs(r["per_request_tok_s"] - 511 / 5.1) < 1e-9  # median of 511/5.1, 511/4.0, 511/10.22
    assert r["errors"] == [] and r["short"] == []


def test_errors_and_short_requests_fail_the_row():
    ts = [_timing(512, 0.1, 5.0, 5.1), _timing(100, 0.1, 1.0, 1.1), _timing(0, None, None, 0.5, error="HTTP 500")]
    r = concurrency.round_result(ts, wall_s=5.2, new_tokens=512)
    assert r["short"] == [100] and r["errors"] == ["HTTP 500"] and r["tokens"] == 612
    s = concurrency.summarize([r])
    assert s["ok"] is False and "aggregate_tok_s" not in s


def test_compare_table(tmp_path, capsys):
    def result(agg, req):
        return {"aggregate_tok_s": agg, "per_request_tok_s": req, "ok": True, "rounds": []}

    base = {"label": "stock", "new_tokens": 512, "results": {"2": result(200.0, 100.0), "32": result(3200.0, 100.0)}}
    other = {"label": "kog", "new_tokens": 512, "results": {"2": result(196.0, 98.0), "32": result(3104.0, 97.0)}}
    (tmp_path / "a.json").write_text(json.dumps(base))
    (tmp_path / "b.json").write_text(json.dumps(other))
    assert concurrency.main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("kog / stock")
    assert out[2].split()[0] == "2" and out[2].split()[3] == "0.980" and out[2].split()[6] == "0.980"
    assert out[3].split()[0] == "32" and out[3].split()[3] == "0.970" and out[3].split()[6] == "0.970"
