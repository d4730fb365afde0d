"""Parsing of kog's options from `additional_config["kog"]`.

The same dict arrives through `--additional-config '{"kog": {...}}'`, `LLM(additional_config=...)`,
and the `--backend kog` / `--kog-options` flags, and is visible in every vLLM process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

CONFIG_KEY = "kog"
WORKER_CLS = "kog_backend.engine.worker.KogWorker"
# Needed (with async scheduling off) for tokens_per_step > 1; `--backend kog` sets both.
SCHEDULER_CLS = "kog_backend.engine.scheduler.KogScheduler"
DEFAULT_TOKENS_PER_STEP = 32


class KogConfigError(ValueError):
    """An option under additional_config["kog"] is unknown or has a bad value."""


@dataclasses.dataclass(frozen=True)
class KogConfig:
    # Master switch. `--backend stock` sets it False; kog's worker then runs every step stock.
    enabled: bool = True
    # Which implementation runs the kog path: "auto" or "monokernel" (the monokernel; where it cannot run --
    # extension missing, unsupported GPU or shape -- kog turns off with the reason and vLLM serves stock), or
    # "torch" (the reference step: exact up to bf16 rounding and slower than stock; for validation).
    step_impl: str = "auto"
    # Tokens generated per engine step on the kog path (K). K > 1 needs KogScheduler (`--backend kog` sets it; async
    # scheduling on or off); where it is missing, the default runs 1 token per step (logged at info level) and an
    # explicit K > 1 is a warning. 32, from `kog bench` on the H200 (docs/tuning.md, Llama-3.2-1B shape):
    # K = 16 / 32 / 64 / 128 gave 1,076 / 1,119 / 1,147 / 1,161 tok/s; 32 keeps 96% of K = 128's speed while a
    # streaming client's bursts, and a second request's wait, stay near 30 ms.
    tokens_per_step: int = DEFAULT_TOKENS_PER_STEP
    # With K > 1 and the monokernel: also burst requests that sample, with temperature, top-k, top-p and min-p as
    # vLLM's SamplingStates holds them (the kernel draws vLLM's Gumbel-max tokens itself, keyed like vLLM's
    # sampler; csrc/include/kog/burst_sampling.cuh, and vLLM's sampler draws the few tokens the kernel defers).
    # Checked by test_monokernel_gpu.py (each drawn token equals vLLM's sampler's draw from the kernel's logits),
    # test_sampled_bursts.py (seeded requests: K = 32 gives K = 1's tokens) and test_sampled_distribution.py
    # (chi-square against stock). False: such requests run the kog path one token per step with vLLM's sampler.
    sampled_bursts: bool = True
    # With K > 1 and the monokernel on one GPU: queue each burst's successor on the GPU right behind it, before vLLM
    # asks for it, so the GPU does not idle while the engine handles a step (kog_backend/path/run_ahead.py); a step that
    # turns out different (a second request, a stop string, a fallback) abandons it within one token. Measured on
    # the H200 (docs/tuning.md `run_ahead`; kog bench K = 32, Llama-3.2-1B shape): 1,269.5 tok/s with it against
    # stock's 600.2 in the same run (without it: ~1,126 tok/s, a ~2.5 ms GPU gap per burst). On by default:
    # test_run_ahead.py, test_multi_token.py, test_sampled_distribution.py and test_serve.py pass with it.
    run_ahead: bool = True
    # Diagnosis: time each kog step on the host and each launch on the GPU (kog_backend/path/step_timeline.py); the last
    # request's medians appear in `kog stats --json` and `kog bench`. Costs one stream synchronisation per request.
    step_timeline: bool = False
    # Tensor parallelism > 1: run the TP monokernel (ranks exchange partial sums through CUDA IPC inside the kernel,
    # csrc/include/kog/tp.cuh). Verified on one H200 with 2 and 4 ranks sharing it under MPS
    # (integration_tests/test_tp_monokernel_gpu.py), not yet on several GPUs, hence off by default; off, TP > 1 is
    # served stock.
    tp_monokernel: bool = False
    # Tensor parallelism > 1: the platform's communicator hook hands vLLM KogCommunicator (kog_backend/collective/),
    # which takes the all-reduces of single-request steps at decode sizes (dispatch.py's thresholds) and leaves the
    # rest to vLLM's chain (custom all-reduce, symmetric memory, NCCL). Tested on one GPU under MPS
    # (integration_tests/test_collective_gpu.py), not yet measured against NCCL on several GPUs, hence off by default.
    collective: bool = False
    # FP8 checkpoints (the three layouts of kog_backend/path/quant_format.py, TP = 1) on the FP8 kernel instantiation
    # (csrc/include/kog/fp8.cuh). Off by default until its GPU tests (integration_tests/test_monokernel_fp8_gpu.py,
    # the FP8 teacher forcing of test_teacher_forcing.py) have passed on a GPU; off, an FP8 model is served stock.
    fp8_weights: bool = False
    # Mixture of experts: run Qwen3-MoE models (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B; one GPU, bf16) on the MoE kernel
    # instantiation (csrc/include/kog/moe_stages.cuh, docs/moe.md). Off by default until its GPU tests
    # (integration_tests/test_monokernel_moe_gpu.py) and teacher forcing against stock have passed; off, every
    # mixture-of-experts model is served stock.
    moe_kernel: bool = False
    # Where workers write their fallback counters for `kog stats` ("" = $KOG_STATE_DIR or /tmp/kog_backend).
    state_dir: str = ""
    # Fault injection, for the fault tests only (integration_tests/test_fault_*.py; off in production): the
    # monokernel launch number inject_fault_launch (1-based, counted per server) is made to abort: "hang", one of its
    # waits never completes (ModelArgs::inject_fault; aborts after ~1 s), or "hold_sms", a competing kernel holds
    # half the SMs while it starts (aborts within ~1 ms: blocks not resident). The runner then discards the launch,
    # redoes the step stock and turns kog off for the server (docs/monokernel.md "Faults").
    inject_fault: str = ""
    inject_fault_launch: int = 2

    STEP_IMPLS = ("auto", "monokernel", "torch")
    FAULTS = ("", "hang", "hold_sms")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> "KogConfig":
        if raw is not None and not isinstance(raw, Mapping):
            raise KogConfigError(f"kog options must be a JSON object, got {type(raw).__name__}: {raw!r}")
        raw = dict(raw or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise KogConfigError(f"unknown kog option(s) {unknown}; known: {sorted(fields)}")
        kwargs: dict[str, Any] = {}
        for name, value in raw.items():
            kwargs[name] = _coerce(name, fields[name].type, value)
        cfg = cls(**kwargs)
        if cfg.step_impl not in cls.STEP_IMPLS:
            raise KogConfigError(f"kog option step_impl={cfg.step_impl!r}; expected one of {cls.STEP_IMPLS}")
        if not 1 <= cfg.tokens_per_step <= 256:
            raise KogConfigError(f"kog option tokens_per_step={cfg.tokens_per_step}; expected 1..256")
        if cfg.inject_fault not in cls.FAULTS:
            raise KogConfigError(f"kog option inject_fault={cfg.inject_fault!r}; expected one of {cls.FAULTS}")
        if cfg.inject_fault_launch < 1:
            raise KogConfigError(f"kog option inject_fault_launch={cfg.inject_fault_launch}; expected >= 1")
        return cfg

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> "KogConfig":
        additional = getattr(vllm_config, "additional_config", None) or {}
        if not isinstance(additional, Mapping):  # vLLM also allows a hashable object of another plugin's
            return cls()
        return cls.from_dict(additional.get(CONFIG_KEY))

    @staticmethod
    def given_keys(vllm_config: Any) -> frozenset[str]:
        """The options the user set (as opposed to defaults) in vllm_config.additional_config["kog"]."""
        additional = getattr(vllm_config, "additional_config", None) or {}
        raw = additional.get(CONFIG_KEY) if isinstance(additional, Mapping) else None
        return frozenset(raw) if isinstance(raw, Mapping) else frozenset()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _coerce(name: str, type_name: Any, value: Any) -> Any:
    type_name = type_name if isinstance(type_name, str) else type_name.__name__
    if type_name == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise KogConfigError(f"kog option {name}={value!r}; expected a boolean")
    if type_name == "int":
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise KogConfigError(f"kog option {name}={value!r}; expected an integer")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise KogConfigError(f"kog option {name}={value!r}; expected an integer") from None
    if type_name == "str":
        if not isinstance(value, str):
            raise KogConfigError(f"kog option {name}={value!r}; expected a string")
        return value
    raise AssertionError(f"unhandled option type {type_name}")
