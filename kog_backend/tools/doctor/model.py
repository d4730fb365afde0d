"""`kog doctor --model PATH_OR_NAME`: would this model run on the kog path, and if not, why (the gate's reason
strings, kog_backend.path.coverage); whether it fits a card's memory. Reads config.json only: no server, no GPU,
no download. For a checkpoint directory with FP8 weights, it also reads the safetensors headers and says whether
every FP8 weight has its scale of the layout's shape (gate.model.fp8_checkpoint_reason).

PATH_OR_NAME: a checkpoint directory (its config.json), a Hugging Face id of the published configs kog knows
(tools/fixtures/shapes.MODEL_CONFIGS, e.g. Qwen/Qwen2.5-Coder-7B-Instruct), or a `kog make-checkpoint` shape
(qwen3-4b, ...).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from kog_backend.path import coverage


@dataclasses.dataclass(frozen=True)
class ModelReport:
    source: str  # where the config came from
    verdict: coverage.Verdict
    memory: coverage.MemoryFit
    gpu: str
    utilization: float
    fp8_scales: tuple[bool, str] | None = None  # (ok, line) for an FP8 checkpoint directory, else None
    fp8_option: str | None = None  # an FP8 model's refusal without the kog option fp8_weights (the default), else None

    @property
    def runs(self) -> bool:
        return (self.verdict.ok and self.memory.fits and (self.fp8_scales is None or self.fp8_scales[0])
                and self.fp8_option is None)

    def lines(self) -> list[str]:
        v = self.verdict
        out = [f"model: {self.source}"]
        if v.ok:
            s, p = v.shape, v.plan
            out.append(f"[ok  ] kog path: {s.arch}, {s.num_layers} layers, hidden {s.hidden_size}, "
                       f"{s.num_heads}/{s.num_kv_heads} heads x {s.head_dim}, FFN {s.intermediate_size}, "
                       f"vocabulary {s.vocab_size}{', QKV bias' if s.qkv_bias else ''}{', qk-norm' if s.qk_norm else ''}")
            out.append(f"       plan ({p.grid} SMs): {p.num_slots} weight slots of {p.slot_bytes // 1024} KiB, "
                       f"units per chunk {[st.nu for st in p.stages]}, {p.heads_per_pass} heads per attention pass")
        else:
            out.append(f"[FAIL] kog path: {v.reason}")
        if self.fp8_scales is not None:
            ok, line = self.fp8_scales
            out.append(f"[{'ok  ' if ok else 'FAIL'}] fp8 scales: {line}")
        if self.fp8_option is not None:
            out.append(f"[FAIL] {self.fp8_option}: with --kog-options '{{\"fp8_weights\": true}}' the FP8 kernel "
                       "serves it")
        mark = "ok  " if self.memory.fits else "FAIL"
        out.append(f"[{mark}] memory on {self.gpu}: {self.memory.describe(self.utilization)}")
        out.append("")
        out.append("kog would run this model (exit 0)" if self.runs else
                   "kog would NOT run this model: vLLM serves every step stock (exit 1)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.source,
            "runs": self.runs,
            "reason": self.verdict.reason,
            "fp8_scales": None if self.fp8_scales is None else {"ok": self.fp8_scales[0], "line": self.fp8_scales[1]},
            "fp8_option": self.fp8_option,
            "gpu": self.gpu,
            "fits": self.memory.fits,
            "max_context": self.memory.max_context,
            "weight_bytes": self.memory.weights,
            "slot_bytes": self.verdict.plan.slot_bytes if self.verdict.plan else None,
        }


def load_config(path_or_name: str) -> tuple[dict[str, Any], str]:
    """(config dict, where it came from); KeyError with the known names when nothing matches."""
    from kog_backend.tools.fixtures import shapes

    cfg_path = os.path.join(path_or_name, "config.json") if os.path.isdir(path_or_name) else path_or_name
    if os.path.isfile(cfg_path) and cfg_path.endswith(".json"):
        with open(cfg_path) as f:
            return json.load(f), os.path.abspath(cfg_path)
    if path_or_name in shapes.MODEL_CONFIGS:
        return shapes.MODEL_CONFIGS[path_or_name], f"{path_or_name} (published config.json, embedded)"
    if path_or_name in shapes.SHAPES:
        return shapes.get_shape(path_or_name), f"{path_or_name} (kog make-checkpoint shape)"
    raise KeyError(
        f"{path_or_name!r} is neither a directory with a config.json nor a known model; known: "
        + ", ".join(sorted(shapes.MODEL_CONFIGS))
    )


def model_report(path_or_name: str, gpu: str = "h100", sm_count: int = coverage.H100_SMS, tp_size: int = 1,
                 utilization: float = 0.9) -> ModelReport:
    cfg, source = load_config(path_or_name)
    v = coverage.verdict(cfg, sm_count, tp_size)
    mem = coverage.memory_fit(cfg, coverage.GPU_MEMORY[gpu] * tp_size, utilization)
    scales = fp8_scales(path_or_name, cfg) if os.path.isdir(path_or_name) else None
    return ModelReport(source, v, mem, gpu if tp_size == 1 else f"{tp_size} x {gpu}", utilization, scales,
                       fp8_option_reason(cfg) if v.ok else None)


def fp8_option_reason(cfg: dict[str, Any]) -> str | None:
    """The gate's reason for an FP8 model under kog's default options (fp8_weights off), else None."""
    from kog_backend.path import quant_format
    from kog_backend.path.gate import monokernel as mk_gate

    fmt = quant_format.weight_format(cfg.get("quantization_config"))
    if not isinstance(fmt, quant_format.Fp8Format):
        return None
    return mk_gate.fp8_option_reason(fmt.layout, False)


def fp8_scales(checkpoint_dir: str, cfg: dict[str, Any]) -> tuple[bool, str] | None:
    """(ok, what to print) for a directory whose config describes FP8 weights stored with scales, else None."""
    from kog_backend.path import checkpoint_index, quant_format
    from kog_backend.path.gate import model as model_gate

    fmt = quant_format.weight_format(cfg.get("quantization_config"))
    if not isinstance(fmt, quant_format.Fp8Format) or fmt.online:
        return None
    index = checkpoint_index.read_index(checkpoint_dir)
    if not index:
        return False, f"no .safetensors files in {checkpoint_dir}"
    reason = model_gate.fp8_checkpoint_reason(fmt, index)
    if reason is not None:
        return False, reason
    count = len(quant_format.quantised_weights(fmt, index))
    if count == 0:
        return False, f"no decoder-layer projection weights in {checkpoint_dir}"
    return True, f"{count} FP8 weights ({fmt.describe()}), each with its {fmt.scale_name} of the layout's shape"
