"""KogCudaPlatform: vLLM's CUDA platform plus the `--backend` / `--kog-options` flags.

vLLM lets an installed platform plugin add flags to its engine parsers through
`Platform.pre_register_and_update(parser)` (called at the end of `AsyncEngineArgs.add_cli_args`, so for
`vllm serve`, `vllm run-batch`, `vllm launch` and the OpenAI api_server module). `check_and_update_config` runs
vLLM's, then puts stock's scheduling back where `--backend kog` chose kog's and kog will not run on this server
(kog_backend/engine/scheduling.py). Nothing else is overridden:
the class is vLLM's `CudaPlatform` (NVML or non-NVML, as vLLM picked it at import), `_enum` stays
`PlatformEnum.CUDA`, so `is_cuda()` and every CUDA code path, config default and kernel choice are vLLM's.
The flags change `worker_cls` / `additional_config` only when given (kog_backend/engine/cli_args.py).
`get_device_communicator_cls` names kog's communicator only on a kog server with the `collective` option on
(`communicator_qualname`); vLLM resolves it once per process group (GroupCoordinator.__init__).

Importing this module imports vllm.platforms.cuda (and so torch); vLLM imports it only after
`kog_backend.engine.plugin.register_platform` has named it, on a machine where vLLM's CUDA platform is active.
"""

from __future__ import annotations

from typing import Any

from vllm.platforms.cuda import CudaPlatform


def communicator_qualname(vllm_config: Any) -> str | None:
    """KogCommunicator's qualified name where this server runs kog's worker with the `collective` option, else None
    (vLLM's CudaCommunicator). An unparsable kog config is None here; the worker reports it."""
    from kog_backend.collective import COMMUNICATOR_QUALNAME
    from kog_backend.config import WORKER_CLS, KogConfig, KogConfigError

    if vllm_config is None or getattr(vllm_config.parallel_config, "worker_cls", None) != WORKER_CLS:
        return None
    try:
        kog = KogConfig.from_vllm_config(vllm_config)
    except KogConfigError:
        return None
    return COMMUNICATOR_QUALNAME if kog.enabled and kog.collective else None


class KogCudaPlatform(CudaPlatform):
    @classmethod
    def pre_register_and_update(cls, parser=None) -> None:
        super().pre_register_and_update(parser)
        if parser is not None:
            from kog_backend.engine.cli_args import add_backend_arguments

            add_backend_arguments(parser)

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        super().check_and_update_config(vllm_config)
        # `--backend kog` on a server where kog will not run: stock's scheduling (kog_backend/engine/scheduling.py).
        from kog_backend.engine.scheduling import restore_stock_scheduling

        restore_stock_scheduling(vllm_config)

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        from vllm.config import get_current_vllm_config_or_none

        return communicator_qualname(get_current_vllm_config_or_none()) or super().get_device_communicator_cls()
