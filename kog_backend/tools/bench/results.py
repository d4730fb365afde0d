"""The benchmark's JSON: one file per `kog bench` run, read back by benchmarks/render_performance.py.

Every figure is derived from the raw timings kept beside it, so a reader can recompute it.
Units: seconds for raw timings, ms for per-token/first-token times, bytes and GB/s (1e9 B/s) for bandwidth.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

SCHEMA = "kog-bench/1"
IMPLS = ("stock", "kog")


@dataclasses.dataclass
class RunResult:
    """One engine (stock or kog) on one model, measured in its own process; in http mode, one live server."""

    impl: str  # "stock" | "kog"; in http mode the server's label
    ok: bool = False
    error: str | None = None
    tok_s: float | None = None  # decode tokens/s of the one request
    ms_per_token: float | None = None
    ttft_ms: float | None = None  # the 1-token generate call: prefill, first sample, engine overhead
    gbps: float | None = None  # (weight + mean KV bytes per token) x tok/s / 1e9
    copy_gbps: float | None = None  # device-to-device copy bandwidth measured in this process (one GPU)
    bw_share: float | None = None  # gbps / (copy_gbps x tp)
    floor_tok_s: float | None = None  # copy_gbps x tp / bytes per token
    times_one_s: list[float] = dataclasses.field(default_factory=list)  # 1-token generate calls
    times_full_s: list[float] = dataclasses.field(default_factory=list)  # (N+1)-token generate calls
    copy_times_s: list[float] = dataclasses.field(default_factory=list)
    generated_tokens: int | None = None  # tokens the (N+1)-token call returned
    output_token_ids: list[int] = dataclasses.field(default_factory=list)  # of the last (N+1)-token call
    counters: list[dict[str, Any]] | None = None  # kog_stats, one dict per worker (kog only)
    kog_token_share: float | None = None  # kog-path tokens / decode tokens generated in this process
    load_s: float | None = None
    # offline: the sampling in force in this engine: {"params": SamplingParams fields, "seed", "generation_config":
    # the model's sampling defaults as vLLM read them} (bench/sampling.py)
    sampling: dict[str, Any] | None = None
    requests: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # http mode: one dict per request
    warnings: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunResult":
        return cls(**_known(cls, d))


@dataclasses.dataclass
class ModelResult:
    model: str  # shape name or checkpoint directory name
    path: str
    weight_bytes_per_token: int | None = None
    kv_bytes_per_token: float | None = None  # mean over the decode steps
    rows: list[RunResult] = dataclasses.field(default_factory=list)
    speedup: float | None = None  # kog tok/s / stock tok/s
    tokens_match: bool | None = None  # greedy only: kog's tokens equal stock's
    first_mismatch: int | None = None
    sampling: dict[str, Any] | None = None  # offline: the sampling in force for this model (as RunResult.sampling)
    max_model_len: int | None = None  # offline: vLLM's max_model_len for both engines (positions)
    max_model_len_note: str | None = None  # how it was chosen (offline.max_model_len_note)
    # --also-greedy (bench/greedy_rounds.py): on the greedy rounds' ModelResult, the label of the model whose
    # engines timed them after its own rounds (its label is "<model> greedy"); None: the request's own rounds.
    greedy_of: str | None = None
    # --also-greedy, on the sampled ModelResult: its kog tok/s / the same engine's greedy kog tok/s (a fraction)
    sampled_kog_of_greedy: float | None = None
    # The weights as the header names them (bench/fp8.py weight_format_text): "bf16", or the FP8 layout and format.
    weight_format: str | None = None
    # --also-bf16 (bench/fp8.py): on the bf16 checkpoint's ModelResult ("<shape> bf16"), the label of the FP8 model
    # it is compared with; on that FP8 ModelResult, its kog tok/s / the bf16 checkpoint's kog tok/s.
    bf16_of: str | None = None
    kog_fp8_over_bf16: float | None = None

    def row(self, impl: str) -> RunResult | None:
        return next((r for r in self.rows if r.impl == impl), None)

    def tok_s(self, impl: str) -> float | None:
        """The tok/s of row `impl` where it ran, else None."""
        r = self.row(impl)
        return r.tok_s if r is not None and r.ok else None

    @property
    def bytes_per_token(self) -> float | None:
        if self.weight_bytes_per_token is None:
            return None
        return self.weight_bytes_per_token + (self.kv_bytes_per_token or 0.0)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelResult":
        kw = _known(cls, d)
        kw["rows"] = [RunResult.from_dict(r) for r in d.get("rows", [])]
        return cls(**kw)


@dataclasses.dataclass
class BenchReport:
    kind: str = "offline"  # offline | http
    date: str = ""  # ISO 8601, UTC
    commit: str = "unknown"
    kog_version: str = ""
    host: dict[str, Any] = dataclasses.field(default_factory=dict)  # gpu, gpu_count, driver, torch, vllm, cuda
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    models: list[ModelResult] = dataclasses.field(default_factory=list)
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BenchReport":
        got = d.get("schema") if isinstance(d, dict) else type(d).__name__  # a list of rows has no schema
        if got != SCHEMA:
            raise ValueError(f"not a {SCHEMA} file (schema={got!r})")
        kw = _known(cls, d)
        kw["models"] = [ModelResult.from_dict(m) for m in d.get("models", [])]
        return cls(**kw)

    @classmethod
    def load(cls, path: str) -> "BenchReport":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())
            f.write("\n")


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}
