"""KogCommunicator: vLLM's CudaCommunicator with kog's all-reduce in front, for single-request steps.

Hook: the platform's `get_device_communicator_cls()` returns COMMUNICATOR_QUALNAME (vLLM resolves it in
GroupCoordinator.__init__, parallel_state.py:483-492; the class must subclass CudaCommunicator).

Dispatch, per call: kog takes a tensor when the group is a TP group, kog's set-up succeeded on every rank,
`kog_active` is True, the tensor has at most `max_tokens` rows (single-request mode: KogConfig's
tokens_per_step, i.e. the decode of one request), and its size is within kog's thresholds (dispatch.py:
only where kog beats NCCL); everything else goes to the stock chain (custom AR / symm-mem / NCCL) through
`super().all_reduce`. CUDA graphs: kog needs no capture hooks (no input registration, epochs in device
memory); whichever path a call takes at capture time is the path its replays take, so `kog_active` must be
set before capture to affect graphs.
"""

from __future__ import annotations

import collections
import logging

import torch
from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

from kog_backend.collective import dispatch
from kog_backend.collective.allreduce import KogAllReduce

logger = logging.getLogger("kog_backend.collective")

COMMUNICATOR_QUALNAME = "kog_backend.collective.communicator.KogCommunicator"


def _max_tokens_from_config() -> int:
    try:
        from vllm.config import get_current_vllm_config_or_none

        from kog_backend.config import KogConfig

        cfg = get_current_vllm_config_or_none()
        return KogConfig.from_vllm_config(cfg).tokens_per_step if cfg is not None else 1
    except Exception as e:  # an unparsable kog config is reported by the worker; here: stay single-token
        logger.debug("kog communicator: using max_tokens=1 (%s)", e)
        return 1


class KogCommunicator(CudaCommunicator):
    def __init__(self, cpu_group, device: torch.device | None = None, device_group=None, unique_name: str = "",
                 global_ranks: list[int] | None = None, global_world_size: int | None = None,
                 tcp_store_group=None):
        super().__init__(cpu_group, device, device_group, unique_name, global_ranks, global_world_size,
                         tcp_store_group)
        self.kog_ar: KogAllReduce | None = None
        self.kog_active = True
        self.kog_calls = 0
        self.kog_fallbacks: collections.Counter[str] = collections.Counter()
        self.kog_disabled_reason: str | None = None
        if "tp" not in unique_name:
            self.kog_disabled_reason = f"group {unique_name!r} is not a TP group"
        elif self.world_size == 1:
            self.kog_disabled_reason = "world size 1"
        elif tcp_store_group is not None or global_ranks is not None:
            self.kog_disabled_reason = "stateless process group (no torch.distributed CPU group)"
        else:
            th = dispatch.Thresholds.for_world(self.world_size, max_tokens=_max_tokens_from_config())
            self.kog_ar = KogAllReduce(cpu_group, self.device, thresholds=th)
            if self.kog_ar.disabled_reason is not None:
                self.kog_disabled_reason = self.kog_ar.disabled_reason
                self.kog_ar.close()
                self.kog_ar = None
        if self.kog_disabled_reason is not None and self.world_size > 1:
            logger.info("kog all-reduce not used for group %r: %s", unique_name, self.kog_disabled_reason)

    def set_kog_active(self, active: bool) -> None:
        """The runner's switch for single-request mode (eager calls; graphs keep their captured path)."""
        self.kog_active = active

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        kog = self.kog_ar
        if kog is not None and self.kog_active:
            algo, reason = kog.choose(input_)
            if reason is None:
                self.kog_calls += 1
                return kog.all_reduce(input_, algo=algo)
            self.kog_fallbacks[reason] += 1
        return super().all_reduce(input_)

    def destroy(self):
        if self.kog_ar is not None:
            self.kog_ar.close()
            self.kog_ar = None
        super().destroy()
