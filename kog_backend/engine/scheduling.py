"""Stock scheduling for a `--backend kog` server on which kog will not run.

`--backend kog` selects KogScheduler when the command line is parsed (cli_args._select_scheduler), before any config
exists. When vLLM then builds the engine's config, kog's platform (KogCudaPlatform.check_and_update_config, in the
API server process, before the engine starts) asks the gate whether kog can run on this server at all
(`start_reason`: the server features, vLLM version, GPU, model architecture, quantisation, extension); if not, it
puts back the scheduler the user had (None: vLLM's own), so the server runs exactly as stock. Async scheduling is
never changed by kog (KogScheduler is vLLM's async scheduler).

What the gate cannot know before the model and KV cache exist (a layer the monokernel cannot take, a KV cache
that is not bf16, a monokernel set-up failure, a kernel abort later on) turns kog off in the worker. The worker
says so here (`mark_turned_off`), and KogScheduler then schedules as vLLM's AsyncScheduler from its next step
(`turned_off_reason`): single-request steps are scheduled ahead again, with stock's look-ahead. That needs the worker
in the scheduler's process, as vLLM's one-process executor has it (one GPU); under a multiprocess executor the
scheduler never hears of it and keeps kog's scheduling, whose batched steps are stock's and whose single-request
steps are not scheduled ahead of the previous one's tokens (correct, and slower than stock by that overlap).
"""

from __future__ import annotations

import weakref
from typing import Any

from kog_backend.config import SCHEDULER_CLS, KogConfig

# Set by cli_args._select_scheduler when it chose kog's scheduler: the one the user had.
_forced: dict[str, Any] | None = None


def record_forced(scheduler_cls: Any) -> None:
    global _forced
    _forced = {"scheduler_cls": scheduler_cls}


def start_reason(vllm_config: Any) -> str | None:
    """Why kog will turn itself off for this server whatever its requests are, as far as the config tells before
    the engine starts, or None: the gate's start reason (kog_backend.path.gate.server.start_reason)."""
    from kog_backend.path import gate

    return gate.start_reason(vllm_config, KogConfig.from_vllm_config(vllm_config))


def restore_stock_scheduling(vllm_config: Any) -> str | None:
    """Puts back the user's scheduler where kog chose its own and will not run; returns the gate's reason then."""
    sc = vllm_config.scheduler_config
    if _forced is None or sc.scheduler_cls != SCHEDULER_CLS:
        return None
    reason = start_reason(vllm_config)
    if reason is None:
        return None
    sc.scheduler_cls = _forced["scheduler_cls"]
    from vllm.logger import init_logger

    init_logger("kog_backend.engine.scheduling").info(
        "kog will not run on this server (%s): stock scheduling (scheduler %s, async scheduling %s)",
        reason, sc.scheduler_cls or "vLLM's default", "on" if sc.async_scheduling else "off",
    )  # fmt: skip
    return reason


# Engines on which the worker turned kog off for good: id(VllmConfig) -> (a weak reference to it, the reason). The
# worker and the scheduler of a one-process engine hold the same VllmConfig object; it is not hashable (a mutable
# dataclass), hence its id, checked against the weak reference so that a later config at a reused address is not
# taken for it.
_turned_off: dict[int, tuple[weakref.ref, str]] = {}


def mark_turned_off(vllm_config: Any, reason: str) -> None:
    """The worker turned kog off for the rest of this engine's life (kog_backend/engine/runner.py, worker.py)."""
    key = id(vllm_config)
    if key in _turned_off and _turned_off[key][0]() is vllm_config:
        return
    try:
        ref = weakref.ref(vllm_config, lambda _, key=key: _turned_off.pop(key, None))
    except TypeError:  # not a VllmConfig (a stand-in without weak references): the scheduler is not told
        return
    _turned_off[key] = (ref, reason)


def turned_off_reason(vllm_config: Any) -> str | None:
    """Why this engine's worker turned kog off, if it did and shares the scheduler's process, else None."""
    entry = _turned_off.get(id(vllm_config))
    return entry[1] if entry is not None and entry[0]() is vllm_config else None
