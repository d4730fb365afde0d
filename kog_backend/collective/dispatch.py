"""Which all-reduce a tensor gets: kog one-shot, kog two-shot, or the stock path (NCCL / vLLM's chain).

Every gate returns a reason string when kog is not used (None when it is), so callers can count and log
fallbacks. Pure Python; torch is only touched through the tensor passed in.

Default thresholds (bytes) are a starting point, not a measurement: one-shot pushes (W-1) copies of the
message from every rank (LL doubles the bytes), two-shot moves 2(W-1)/W of it in two hops. With NVLink at
~450 GB/s per direction and ~1-2 us per hop the crossover sits at a few tens of KB at W=8 and higher at
small W; issue 6 measures it on 2/4/8 H200s and these numbers must then be replaced by measured ones.
Overrides: KOG_AR_ONESHOT_MAX, KOG_AR_TWOSHOT_MAX (bytes), KOG_AR_DISABLE=1.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from kog_backend.collective import layout

ONESHOT_MAX_DEFAULT = {2: 256 * 1024, 4: 128 * 1024, 6: 64 * 1024, 8: 64 * 1024}
TWOSHOT_MAX_DEFAULT = {2: 1024 * 1024, 4: 1024 * 1024, 6: 1024 * 1024, 8: 1024 * 1024}

SUPPORTED_DTYPES = ("torch.bfloat16", "torch.float16", "torch.float32")


@dataclasses.dataclass(frozen=True)
class Thresholds:
    oneshot_max: int  # largest message (bytes) sent one-shot; also the one-shot buffer capacity
    twoshot_max: int  # largest message (bytes) sent two-shot; also the two-shot buffer capacity
    max_tokens: int | None = None  # tensors with more rows than this go stock (single-request mode); None = any

    @classmethod
    def for_world(cls, world: int, *, oneshot_max: int | None = None, twoshot_max: int | None = None,
                  max_tokens: int | None = None, env: dict[str, str] | None = None) -> Thresholds:
        env = os.environ if env is None else env
        if oneshot_max is None:
            oneshot_max = int(env.get("KOG_AR_ONESHOT_MAX", ONESHOT_MAX_DEFAULT.get(world, 64 * 1024)))
        if twoshot_max is None:
            twoshot_max = int(env.get("KOG_AR_TWOSHOT_MAX", TWOSHOT_MAX_DEFAULT.get(world, 1024 * 1024)))
        oneshot_max = oneshot_max // layout.PACK_BYTES * layout.PACK_BYTES
        twoshot_max = layout.round_down_twoshot_cap(max(twoshot_max, 0), world)
        if oneshot_max < 0:
            raise ValueError(f"one-shot max {oneshot_max} < 0")
        return cls(oneshot_max=oneshot_max, twoshot_max=twoshot_max, max_tokens=max_tokens)


def choose_algo(nbytes: int, world: int, th: Thresholds) -> tuple[int | None, str | None]:
    """(algo, None) when kog handles `nbytes`, else (None, reason)."""
    if nbytes <= 0:
        return None, "empty tensor"
    if nbytes % layout.PACK_BYTES:
        return None, f"size {nbytes} B is not a multiple of {layout.PACK_BYTES} B"
    if nbytes <= th.oneshot_max:
        return layout.ALGO_ONESHOT, None
    if nbytes <= th.twoshot_max:
        unit = layout.PACK_BYTES * world
        if nbytes % unit:
            return None, f"size {nbytes} B above the one-shot max is not a multiple of 16*world = {unit} B"
        return layout.ALGO_TWOSHOT, None
    return None, f"size {nbytes} B exceeds kog's max {max(th.oneshot_max, th.twoshot_max)} B (NCCL is used)"


def tensor_reason(t: Any, device: Any) -> str | None:
    """Properties of the tensor itself that kog's kernels need (dtype, device, layout, alignment)."""
    if str(t.dtype) not in SUPPORTED_DTYPES:
        return f"dtype {t.dtype} unsupported"
    if not t.is_cuda or (device is not None and t.device != device):
        return f"tensor on {t.device}, communicator on {device}"
    if not t.is_contiguous():
        return "tensor not contiguous"
    if t.data_ptr() % layout.PACK_BYTES:
        return "tensor not 16-byte aligned"
    return None


def should_use(t: Any, *, world: int, device: Any, th: Thresholds, disabled_reason: str | None = None
               ) -> tuple[int | None, str | None]:
    """(algo, None) to use kog, or (None, reason) to fall back."""
    if disabled_reason is not None:
        return None, f"kog all-reduce disabled: {disabled_reason}"
    if th.max_tokens is not None and t.dim() >= 2 and t.shape[0] > th.max_tokens:
        return None, f"batched step: {t.shape[0]} rows > {th.max_tokens} (kog serves single-request steps)"
    reason = tensor_reason(t, device)
    if reason is not None:
        return None, reason
    return choose_algo(t.numel() * t.element_size(), world, th)


def static_disable_reason(world: int, env: dict[str, str] | None = None) -> str | None:
    """Reasons known before any buffer is allocated (identical on every rank given the same environment)."""
    env = os.environ if env is None else env
    if env.get("KOG_AR_DISABLE", "0") not in ("", "0"):
        return "KOG_AR_DISABLE is set"
    if world == 1:
        return "world size 1"
    if world not in layout.SUPPORTED_WORLD_SIZES:
        return f"world size {world} not in {layout.SUPPORTED_WORLD_SIZES}"
    return None
