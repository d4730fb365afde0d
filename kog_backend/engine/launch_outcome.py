"""What a monokernel launch's outcome does to the server: a launch the launcher refused (launch_failed), or one
that aborted on the GPU (aborted, checked at the start of every step), turns kog off for the server with the
gate's reason (path/gate/monokernel.py), counted; the runner then drops its monokernel step. One abort keeps kog on:
an FP8 projection input beyond the f16 form's range (fp8_gemv 1) moves the kernel's projections to the fp32 form
(fp8_gemv 0). Under tensor
parallelism the ranks agree on the outcome (agree_status_word) and on every launch's token count (agree_count).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import torch

from kog_backend.monokernel import layout
from kog_backend.monokernel.host import SITE_FP8_RANGE
from kog_backend.path.counters import StepCounters
from kog_backend.path.gate import monokernel as mk_gate

if TYPE_CHECKING:
    from kog_backend.engine.monokernel_step import MonokernelStep

logger = logging.getLogger("kog_backend")


def agree_count(count: torch.Tensor, tp_size: int) -> None:
    """Tensor parallelism: the launch's token count becomes the least over the group (on the device, no host
    synchronisation). A rank whose kernel aborted reports 0 while its peers, fed its garbage partial sums, may
    complete: with the minimum no rank's step emits a token (the output rank's is what vLLM uses)."""
    if tp_size == 1:
        return
    from vllm.distributed import get_tp_group

    torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN, group=get_tp_group().device_group)


def agree_status_word(word: int, tp_size: int) -> int:
    """Tensor parallelism: the ranks' abort words combined (max, over the CPU group) so that every rank decides the
    same."""
    if tp_size == 1:
        return word
    from vllm.distributed import get_tp_group

    t = torch.tensor([word], dtype=torch.int64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=get_tp_group().cpu_group)
    return int(t[0])


class LaunchOutcome:
    """disable: the runner's switch that turns kog off for the server with a reason (logged once, counted)."""

    def __init__(self, counters: StepCounters, disable: Callable[[str], None], device: torch.device):
        self.counters = counters
        self.disable = disable
        self.device = device

    def aborted(self, step: MonokernelStep) -> bool:
        """The outcome of the monokernel launches whose tokens vLLM has taken: every launch's last block writes its
        abort word into pinned memory (Monokernel.status, sync.cuh), and vLLM waited for each earlier step's output,
        which the stream orders behind its launch, before scheduling this step: a host read, no device call. An
        aborted launch reported no token (its count is 0: the scheduler retakes that position, KogScheduler), so
        nothing it computed reached a client; here kog turns off (True: the runner drops `step`) and this step, and
        every later one, runs stock, except for an FP8 input beyond the f16 GEMV's range (the kernel moves to form 0
        and stays: False). Tensor parallelism: the ranks' words are combined (max) so that every rank
        decides the same."""
        mk = step.kernel
        word = agree_status_word(mk.status_word(), step.tp_size)
        if word == 0:
            return False
        step.abandon_run_ahead()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # nothing of the kernel's in flight (run-ahead included)
        try:
            detail = mk.diagnostics() or f"abort word {word} on another rank"
        except RuntimeError as e:  # the diagnostic must not take the server down
            detail = f"abort word {word} (diagnostics unavailable: {e})"
        self.counters.record_launch_abort()
        if word == SITE_FP8_RANGE and mk.table_value("fp8_gemv") != layout.CONFIG["kFp8GemvCudaCores"]:
            # An input beyond the f16 FP8 GEMV's range: the kernel stays, its projections take the bf16 input in fp32
            # from the next launch on; the position the aborted launch left is retaken.
            mk.set_table_value("fp8_gemv", layout.CONFIG["kFp8GemvCudaCores"])
            mk.reset_counters()
            logger.warning("kog: %s", mk_gate.fp8_input_range(detail))  # once: the table no longer takes this branch
            return False
        self.disable(mk_gate.kernel_abort(detail))
        mk.reset_counters()  # a later kernel (tests, a future re-enable) starts from a clean state
        return True

    def launch_failed(self, step: MonokernelStep, error: RuntimeError) -> None:
        """A launch the launcher refused (its checks, resources): kog is then off for this server, the runner drops
        `step`, and this step, whose bookkeeping is done, is computed by the torch step. A sticky device fault
        raises again there and reaches vLLM as what it is."""
        if step.tp_size > 1:
            # The peers' kernels are waiting for this rank's partials: falling back alone would desynchronise
            # the group (their kernels time out, the torch step's all-reduce waits forever). Fail visibly.
            raise error
        self.disable(mk_gate.launch_failed(error))
        step.abandon_run_ahead()
