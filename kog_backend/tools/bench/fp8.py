"""`kog bench --fp8 LAYOUT [--also-bf16]`: stock vLLM and kog on the FP8 checkpoint of each shape in one run, and
kog on the shape's bf16 checkpoint beside them.

--fp8 tensor|channel|block: each embedded shape's FP8 checkpoint (`kog make-checkpoint --fp8 LAYOUT`, written when
missing; with --dummy-weights its FP8 config for load_format="dummy", bench/weights.py), rows labelled
"<shape> fp8-<layout>". Stock runs vLLM's FP8 path on it (on Hopper FP8 activations too: CUTLASS W8A8), kog its FP8
monokernel (bf16 activations). Bytes per token count what the FP8 model reads (model_bytes: one byte per projection
weight and its fp32 scales, the bf16 embedding row, LM head and norms, then the KV cache), so GB/s and the share of
copy bandwidth are those of the bytes actually read.
--also-bf16: kog alone then runs on the shape's bf16 checkpoint, rows "<shape> bf16", and under the table
"kog FP8 / kog bf16" per shape: issue 40's bar (Llama-3.1-8B FP8 at least 1.8x kog's own bf16 tok/s in the same run)
in one invocation.
A checkpoint directory given as --model is run as it is, its config.json saying its format; the header names every
model's weight format.

Standard library only: the bench's parent process imports neither torch nor vLLM.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from kog_backend.path import quant_format
from kog_backend.tools.bench import metrics
from kog_backend.tools.bench.results import BenchReport, ModelResult

LAYOUTS = quant_format.LAYOUTS
BF16_SUFFIX = " bf16"  # "<shape> bf16": --also-bf16's rows
FP8_PREFIX = "FP8"  # how weight_format_text begins for FP8 weights


@dataclasses.dataclass(frozen=True)
class Variant:
    """One checkpoint of a shape that the run measures."""

    fp8: str | None  # its FP8 layout; None: the bf16 checkpoint
    label_suffix: str  # appended to the shape's label
    impls: tuple[str, ...] | None = None  # the engines run on it; None: the run's (--only)


def fp8_suffix(layout: str) -> str:
    return f" fp8-{layout}"


def variants(fp8: str | None, also_bf16: bool) -> list[Variant]:
    """The checkpoints of each shape a run measures: bf16 alone, or the FP8 one (then kog on bf16 with also_bf16)."""
    if fp8 is None:
        return [Variant(None, "")]
    out = [Variant(fp8, fp8_suffix(fp8))]
    if also_bf16:
        out.append(Variant(None, BF16_SUFFIX, ("kog",)))
    return out


def refusal(fp8: str | None, also_bf16: bool, only: str | None, models: list[str], urls: list[str]) -> str | None:
    """Why --fp8 / --also-bf16 cannot run with the other arguments; None when they can."""
    from kog_backend.tools.fixtures import shapes

    if also_bf16 and fp8 is None:
        return "--also-bf16 runs kog on the bf16 checkpoint of each --fp8 shape; give --fp8 LAYOUT"
    if fp8 is None:
        return None
    if urls:
        return "--fp8 runs the offline engines; it does not take --url (a live server serves the weights it loaded)"
    if also_bf16 and only == "stock":
        return "--also-bf16 times kog on the bf16 checkpoint; --only stock runs no kog"
    for name in models:
        if os.path.isdir(name):
            return (f"--fp8 picks an embedded shape's FP8 checkpoint; {name} is a checkpoint directory, run as it is "
                    "(its config.json says its format): leave out --fp8")
        if name in shapes.SHAPES and shapes.is_moe(name):
            return f"--fp8: {name} is a mixture of experts; the FP8 checkpoints quantise dense decoder layers"
    return None


def weight_format_text(cfg: Mapping[str, Any]) -> str:
    """The weights of a config.json as the header names them: "bf16", or the FP8 layout, its format and what stays
    in the model's dtype."""
    dtype = _dtype_name(cfg)
    fmt = quant_format.weight_format(cfg.get("quantization_config"))
    if fmt is None:
        return dtype
    if isinstance(fmt, str):
        return f"{fmt} quantised"
    method = f"{fmt.method}, quantised at load" if fmt.online else fmt.method
    return (f"{FP8_PREFIX} e4m3 projections, {quant_format.layout_name(fmt.layout)} scales fp32 ({method}); embedding, "
            f"LM head and norms {dtype}")


def _dtype_name(cfg: Mapping[str, Any]) -> str:
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)


def is_fp8(m: ModelResult) -> bool:
    return (m.weight_format or "").startswith(FP8_PREFIX)


def conclude_pairs(report: BenchReport) -> None:
    """Each FP8 model's kog tok/s over its bf16 checkpoint's (kog_fp8_over_bf16), for --also-bf16's pairs."""
    by_label = {m.model: m for m in report.models}
    for b in report.models:
        f = by_label.get(b.bf16_of or "")
        if f is not None:
            f.kog_fp8_over_bf16 = metrics.speedup(f.tok_s("kog"), b.tok_s("kog"))


def header_lines(report: BenchReport) -> list[str]:
    """Every model's weight format and the weight bytes one step reads, when a model's weights are not bf16 or the
    run has --also-bf16's pairs (a plain bf16 run's header is unchanged)."""
    models = [m for m in report.models if m.weight_format is not None]
    if not any(is_fp8(m) or m.weight_format != "bf16" or m.bf16_of for m in models):
        return []
    out = []
    for m in models:
        if m.greedy_of is not None:
            continue  # --also-greedy's rounds read the same checkpoint as the model they follow
        size = "" if m.weight_bytes_per_token is None else f"; {m.weight_bytes_per_token / 1e9:.3f} GB of weights per token"
        out.append(f"weights, {m.model}: {m.weight_format}{size}")
    return out


def ratio_lines(report: BenchReport) -> list[str]:
    """--also-bf16: per shape, kog on the FP8 checkpoint over kog on the bf16 one, same run."""
    by_label = {m.model: m for m in report.models}
    out = []
    for b in report.models:
        f = by_label.get(b.bf16_of or "")
        if f is None:
            continue
        value = None if f.kog_fp8_over_bf16 is None else f"{f.kog_fp8_over_bf16:.2f}x"
        out.append(metrics.ratio_line(f"kog FP8 / kog bf16, {f.model} / {b.model}", value, f.tok_s("kog"),
                                      b.tok_s("kog"), "same run"))
    return out
