"""KogCudaPlatform: vLLM's CUDA platform plus the `--backend` / `--kog-options` flags.

vLLM lets an installed platform plugin add flags to its engine parsers through
`Platform.pre_register_and_update(parser)` (called at the end of `AsyncEngineArgs.add_cli_args`, so for
`vllm serve`, `vllm run-batch`, `vllm launch` and the OpenAI api_server module). `check_and_update_config` runs
vLLM's, then puts stock's scheduling back where `--backend kog` chose kog's and kog will not run on this server
(kog_backend/engine/scheduling.py). Nothing else is overridden:
the class is vLLM's `CudaPlatform` (NVML or non-NVML, as vLLM picked it at import), `_enum` stays
`PlatformEnum.CUDA`, so `is_cuda()` and every CUDA code path, config default and kernel choice are vLLM's.
The flags change `worker_cls` / `additional_config` only when given (kog_backend/engine/cli_args.py).

Importing this module imports vllm.platforms.cuda (and so torch); vLLM imports it only after
`kog_backend.engine.plugin.register_platform` has named it, on a machine where vLLM's CUDA platform is active.
"""

from __future__ import annotations

from vllm.platforms.cuda import CudaPlatform


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
