"""The inject_fault option (fault tests only, integration_tests/test_fault_*.py): one chosen monokernel launch
of the server aborts, so that the launch-outcome handling (launch_outcome.py) runs inside vLLM.

"hang": that launch runs with an argument table whose launch aborts (Monokernel.fault_table). "hold_sms": it runs
with the default table behind a kernel of the test-only extension that holds half the SMs on another stream while
it starts (blocks not resident). Only on-time launches count (not those run ahead).
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger

from kog_backend.config import KogConfig

logger = init_logger("kog_backend.engine.fault_injection")


class FaultInjection:
    def __init__(self, config: KogConfig, device: torch.device):
        self.config = config
        self.device = device
        self.launches = 0  # monokernel launches issued on time (not run ahead)
        self.hold_release: torch.Tensor | None = None  # hold_sms: the holding kernel's release word

    def table(self, kernel) -> torch.Tensor | None:
        """The argument table for the next on-time launch of `kernel` (a Monokernel): None (its default) except on
        the chosen launch, where it is the table whose launch aborts ("hang"), or, for "hold_sms", the default
        table behind a kernel that holds half the SMs on another stream."""
        self.launches += 1
        cfg = self.config
        if not cfg.inject_fault or self.launches != cfg.inject_fault_launch:
            return None
        logger.warning("kog: injecting fault %r into monokernel launch %d", cfg.inject_fault, self.launches)
        if cfg.inject_fault == "hang":
            return kernel.fault_table()
        from kog_backend import ops

        self.hold_release = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        plan = kernel.plan
        side = torch.cuda.Stream(self.device)
        with torch.cuda.stream(side):  # half the SMs, each block with the most shared memory a block may have
            # the test-only extension kog_backend._C_test (raises with its load reason when it is not built)
            ops.kog_test_ops().hold_sms_test(self.hold_release, max(1, plan.grid // 2), plan.smem_bytes, 50,
                                             self.device.index or 0)
        return None
