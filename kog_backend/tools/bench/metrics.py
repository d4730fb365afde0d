"""Arithmetic of the benchmark. Times in seconds unless a name says ms; bytes and bytes/s unless it says GB.

Per-token decode time follows shared/notes/measured-baselines.md:
    ms/token = (T(generate N+1 tokens) - T(generate 1 token)) / N
The 1-token call is prefill + first sample + engine overhead; subtracting it leaves N decode steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

STATS = ("best", "median")


def reduce_times(times_s: Sequence[float], stat: str) -> float:
    """`best` (minimum, as in measured-baselines.md) or `median` of repeated timings."""
    if not times_s:
        raise ValueError("no timings")
    if stat == "best":
        return min(times_s)
    if stat == "median":
        return statistics.median(times_s)
    raise ValueError(f"stat {stat!r}; expected one of {STATS}")


def ms_per_token(t_full_s: float, t_one_s: float, new_tokens: int) -> float:
    """Decode time per token from a (new_tokens + 1)-token call and a 1-token call."""
    if new_tokens <= 0:
        raise ValueError(f"new_tokens={new_tokens}; must be positive")
    if t_full_s <= t_one_s:
        raise ValueError(f"the {new_tokens + 1}-token call ({t_full_s:.6f} s) was not slower than the 1-token call ({t_one_s:.6f} s)")
    return (t_full_s - t_one_s) / new_tokens * 1e3


def tok_per_s(ms_token: float) -> float:
    return 1e3 / ms_token


def copy_bandwidth(nbytes: int, seconds: float) -> float:
    """Device-to-device copy of `nbytes`: bytes read plus bytes written, per second."""
    return 2 * nbytes / seconds


def achieved_bytes_per_s(bytes_per_token: float, tokens_per_s: float) -> float:
    """gpt-fast's 'bandwidth achieved': bytes one step reads times steps per second."""
    return bytes_per_token * tokens_per_s


def share_of_copy(achieved_Bps: float, copy_Bps: float, num_gpus: int = 1) -> float:
    """Fraction of the measured copy bandwidth of `num_gpus` GPUs (TP shards the weights over them)."""
    return achieved_Bps / (copy_Bps * num_gpus)


def floor_tok_per_s(bytes_per_token: float, copy_Bps: float, num_gpus: int = 1) -> float:
    """Tokens/s if every step only read its bytes at the measured copy bandwidth: the bandwidth floor."""
    return copy_Bps * num_gpus / bytes_per_token


def speedup(kog_tok_s: float | None, stock_tok_s: float | None) -> float | None:
    if not kog_tok_s or not stock_tok_s:
        return None
    return kog_tok_s / stock_tok_s


def ratio_line(what: str, value: str | None, num_tok_s: float | None, den_tok_s: float | None, where: str) -> str:
    """A line under the table comparing two kog rows: `what: value (num / den tok/s, where)`, or that a row is
    missing (value None)."""
    if value is None:
        return f"{what}: - (a kog row is missing or failed)"
    return f"{what}: {value} ({num_tok_s:.1f} / {den_tok_s:.1f} tok/s, {where})"
