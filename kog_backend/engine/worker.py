"""KogWorker: vLLM's GPU worker with the V2 model runner swapped for KogModelRunner.

Selected by `--backend kog`, or by `--worker-cls kog_backend.engine.worker.KogWorker` with
`--additional-config '{"kog": {...}}'` on an unmodified vLLM. When kog cannot run at all (another vLLM version, a
non-Hopper GPU, the V1 runner forced) the worker says why once and stays exactly vLLM's worker.
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.worker.gpu_worker import Worker

from kog_backend.path import gate
from kog_backend.config import KogConfig

logger = init_logger("kog_backend.engine.worker")


class KogWorker(Worker):
    def init_device(self) -> None:
        super().init_device()
        self.kog_config = KogConfig.from_vllm_config(self.vllm_config)
        self.kog_unavailable_reason = self._kog_unavailable_reason()
        if self.kog_unavailable_reason is not None:
            if self.rank == 0:
                logger.warning("kog: not available, this server runs stock vLLM: %s", self.kog_unavailable_reason)
            from kog_backend.engine import scheduling

            scheduling.mark_turned_off(self.vllm_config, self.kog_unavailable_reason)
            return
        from kog_backend.engine.runner import KogModelRunner

        # The stock runner was built by super().init_device() after the memory snapshot; replacing it before
        # the model loads keeps vLLM's memory accounting unchanged.
        del self.model_runner
        self.model_runner = KogModelRunner(self.vllm_config, self.device)

    def _kog_unavailable_reason(self) -> str | None:
        return gate.worker_reason(self.kog_config.enabled, self.use_v2_model_runner)

    def kog_stats(self) -> dict[str, Any]:
        """Counters of this worker (for `LLM.collective_rpc("kog_stats")`)."""
        counters = getattr(self.model_runner, "kog_counters", None)
        if counters is None:
            return {"kog_steps": 0, "kog_tokens": 0, "fallback_steps": 0, "fallbacks": {},
                    "disabled_reason": getattr(self, "kog_unavailable_reason", None)}
        return counters.snapshot()

    def shutdown(self) -> None:
        counters = getattr(self.model_runner, "kog_counters", None)
        if counters is not None:
            logger.info("%s", counters.summary_line())
            counters.flush()
        super().shutdown()
