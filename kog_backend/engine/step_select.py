"""Which implementation computes the kog path's steps (the step_impl option): the monokernel (monokernel_step), the
TP monokernel under tensor parallelism, or the torch step (torch_step).

`auto` and `monokernel` select the monokernel and turn kog off, with the reason, where it cannot run (the requests
are then served stock: the torch step is slower than stock, so it runs only when asked for with `torch`). The
monokernel's parity with stock inside vLLM is what integration_tests/ checks (teacher forcing, multi-token, sampled
bursts; figures in README.md). Every reason is the gate's (path/gate/monokernel.py).
"""

from __future__ import annotations

import torch

from kog_backend.config import KogConfig
from kog_backend.engine.fault_injection import FaultInjection
from kog_backend.engine.monokernel_step import MonokernelStep
from kog_backend.engine.tokens_per_step import burst_max_len
from kog_backend.engine.torch_step import TorchStep
from kog_backend.path import model_spec
from kog_backend.path.counters import StepCounters
from kog_backend.path.gate import monokernel as mk_gate
from kog_backend.path.run_ahead import RunAhead
from kog_backend.path.step_timeline import StepTimeline


def select_step(
    torch_step: TorchStep, config: KogConfig, weights: model_spec.DecoderWeights, kv_caches: list[torch.Tensor],
    device: torch.device, max_model_len: int, vocab_size: int, tokens_per_step: int, counters: StepCounters,
    timeline: StepTimeline | None,
) -> MonokernelStep | TorchStep | str:
    """The step that computes the kog path: `torch_step` where the option asks for it, else the monokernel's step;
    or why kog is off for this server (the runner records it). On one GPU with K > 1 and the run_ahead option,
    bursts run ahead (counted in `counters`)."""
    if config.step_impl == "torch":
        return torch_step
    from kog_backend import ops

    reason = ops.load_reason() or mk_gate.fp8_option_reason(weights.fp8, config.fp8_weights)
    if reason is None:
        from kog_backend.monokernel import Monokernel, unsupported_reason

        if weights.shape.tp_size > 1:
            return _select_tp_monokernel(config, weights, kv_caches, device, max_model_len, vocab_size,
                                         tokens_per_step, timeline)
        reason = unsupported_reason(weights, kv_caches, device)
    if reason is not None:
        return mk_gate.refused(reason)
    try:
        mk = Monokernel(
            weights, kv_caches, device, max_model_len,
            max_tokens_per_launch=tokens_per_step,
        )  # fmt: skip
    except (ValueError, RuntimeError) as e:
        return mk_gate.setup_failed(e)
    step = MonokernelStep(
        mk, device, vocab_size, kv_caches[0].shape[2], tokens_per_step, burst_max_len(max_model_len),
        FaultInjection(config, device), timeline,
    )  # fmt: skip
    if config.run_ahead and tokens_per_step > 1:
        step.run_ahead = RunAhead(counters)
    return step


def _select_tp_monokernel(
    config: KogConfig, weights: model_spec.DecoderWeights, kv_caches: list[torch.Tensor], device: torch.device,
    max_model_len: int, vocab_size: int, tokens_per_step: int, timeline: StepTimeline | None,
) -> MonokernelStep | str:
    """Tensor parallelism: the TP monokernel on every rank of the group or on none (tp.setup_tp_monokernel), when
    the tp_monokernel option is on. Its K = 1 logits are this rank's vocabulary rows, gathered for vLLM's
    sampler."""
    s = weights.shape
    reason = mk_gate.tp_option_reason(s.tp_size, config.tp_monokernel)
    if reason is not None:
        return mk_gate.refused(reason)
    from vllm.distributed import get_tp_group, tensor_model_parallel_all_gather

    from kog_backend.monokernel.tp import setup_tp_monokernel

    mk, reason = setup_tp_monokernel(
        weights, kv_caches, device, max_model_len, tokens_per_step,
        get_tp_group().cpu_group, lambda t: tensor_model_parallel_all_gather(t, dim=0),
    )  # fmt: skip
    if mk is None:
        return mk_gate.refused(reason, tp=True)
    return MonokernelStep(
        mk, device, vocab_size, kv_caches[0].shape[2], tokens_per_step, burst_max_len(max_model_len),
        FaultInjection(config, device), timeline, tp_size=s.tp_size, padded_vocab_local=s.padded_vocab_local,
        gather_logits=lambda t: tensor_model_parallel_all_gather(t, dim=-1),
    )  # fmt: skip
