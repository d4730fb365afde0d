"""KogModelRunner: vLLM 0.26's V2 GPU model runner with a kog path for single-request decode steps.

Every step goes through `eligibility.step_unsupported_reason`. Ineligible steps (batches, prefills, requests
that ask for something the kog path does not do) run the stock `execute_model` unchanged. An eligible step runs
the stock bookkeeping (request states, block tables, `prepare_inputs`, `prepare_attn`: the same GPU buffers the
stock path fills), then the kog step, which reads vLLM's weights and writes this position's K/V into vLLM's paged
cache itself, and hands vLLM a final hidden state; `sample_tokens` then runs stock (LM head, vLLM's sampler,
async output copy, `postprocess_sampled`), so the scheduler, detokenizer and stop handling see an ordinary step.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.logger import init_logger
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.model_runner import ExecuteModelState
from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2

from kog_backend import eligibility, model_spec, torch_step
from kog_backend.config import KogConfig
from kog_backend.counters import StepCounters, state_dir

logger = init_logger("kog_backend.runner")

_ONE_TOKEN = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=1, num_reqs=1)


class KogModelRunner(GPUModelRunnerV2):
    def __init__(self, vllm_config: Any, device: torch.device, disabled_reason: str | None = None):
        super().__init__(vllm_config, device)
        self.kog_config = KogConfig.from_vllm_config(vllm_config)
        rank = vllm_config.parallel_config.rank
        path = os.path.join(state_dir(self.kog_config.state_dir), f"stats-{os.getpid()}-rank{rank}.json")
        self.kog_counters = StepCounters(path=path)
        self._kog_request_reasons: dict[str, str | None] = {}
        self._kog_weights: model_spec.DecoderWeights | None = None
        self._kog_kv_caches: list[torch.Tensor] = []
        self._kog_all_reduce = None
        reason = disabled_reason or eligibility.server_unsupported_reason(vllm_config)
        if reason is not None:
            self._kog_disable(reason)

    # ---- set-up --------------------------------------------------------------------------------------------

    @property
    def kog_disabled_reason(self) -> str | None:
        return self.kog_counters.disabled_reason

    def _kog_disable(self, reason: str) -> None:
        if self.kog_counters.disabled_reason is None:
            logger.warning("kog: disabled for this server, every step runs stock: %s", reason)
        self.kog_counters.disable(reason)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if self.kog_disabled_reason is not None:
            return
        try:
            self._kog_weights = model_spec.from_vllm_model(self.model, self.vllm_config)
        except model_spec.UnsupportedModel as e:
            self._kog_disable(str(e))
            return
        if self._kog_weights.shape.tp_size > 1:
            from vllm.distributed import tensor_model_parallel_all_reduce

            self._kog_all_reduce = tensor_model_parallel_all_reduce

    def initialize_kv_cache(self, kv_cache_config: Any) -> None:
        super().initialize_kv_cache(kv_cache_config)
        if self.kog_disabled_reason is not None:
            return
        if len(self.kv_cache_config.kv_cache_groups) != 1:
            self._kog_disable("several KV-cache groups (hybrid or sliding-window attention)")
            return
        caches = []
        for layer in self.model.model.layers:
            cache = getattr(layer.self_attn.attn, "kv_cache", None)
            if isinstance(cache, (list, tuple)):
                cache = cache[0]
            if not isinstance(cache, torch.Tensor) or cache.dtype != torch.bfloat16:
                self._kog_disable(f"KV cache of layer {len(caches)} is not a bf16 tensor")
                return
            try:
                model_spec.kv_cache_view(cache, self._kog_weights.shape.head_dim)
            except model_spec.UnsupportedModel as e:
                self._kog_disable(str(e))
                return
            caches.append(cache)
        self._kog_kv_caches = caches
        logger.info(
            "kog: single-request decode steps run on the kog path (%s step, %d layers, block size %d)",
            "torch",
            len(caches),
            caches[0].shape[2],
        )

    # ---- request tracking ------------------------------------------------------------------------------------

    def add_requests(self, scheduler_output: Any) -> None:
        super().add_requests(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            self._kog_request_reasons[new.req_id] = eligibility.request_unsupported_reason(
                new.sampling_params, new.lora_request, new.pooling_params
            )

    def _remove_request(self, req_id: str) -> bool:
        self._kog_request_reasons.pop(req_id, None)
        return super()._remove_request(req_id)

    # ---- the step --------------------------------------------------------------------------------------------

    def _kog_step_reason(self, scheduler_output: Any) -> str | None:
        if self.kog_disabled_reason is not None:
            return "kog disabled"
        return eligibility.step_unsupported_reason(scheduler_output, self._kog_request_reasons)

    @torch.inference_mode()
    def execute_model(
        self,
        scheduler_output: Any,
        intermediate_tensors: Any = None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        is_profile: bool = False,
    ) -> Any:
        if dummy_run or scheduler_output.total_num_scheduled_tokens == 0:
            return super().execute_model(
                scheduler_output, intermediate_tensors, dummy_run, skip_attn_for_dummy_run, is_profile
            )
        # A step's request may be new in this very step, so the request-level reason is only known after
        # add_requests; new requests make the step a prefill, which is refused before that matters.
        reason = self._kog_step_reason(scheduler_output)
        if reason is not None:
            self.kog_counters.record_fallback(reason)
            return super().execute_model(
                scheduler_output, intermediate_tensors, dummy_run, skip_attn_for_dummy_run, is_profile
            )
        return self._kog_execute(scheduler_output)

    def _kog_execute(self, scheduler_output: Any) -> None:
        # The stock bookkeeping, in stock order (GPUModelRunner.execute_model).
        self.update_pp_decode_requests()
        self.finish_requests(scheduler_output)
        self.free_states(scheduler_output)
        self.add_requests(scheduler_output)
        self.update_requests(scheduler_output)
        self.block_tables.apply_staged_writes()

        input_batch = self.prepare_inputs(scheduler_output, _ONE_TOKEN)
        block_tables, slot_mappings = self.prepare_attn(input_batch)
        hidden = self._kog_torch_step(input_batch, block_tables[0][0], slot_mappings[0][0])

        self.execute_model_state = ExecuteModelState(
            input_batch=input_batch,
            attn_metadata=None,
            slot_mappings_by_layer=None,
            hidden_states=hidden,
            aux_hidden_states=None,
            finished_req_ids=scheduler_output.finished_req_ids,
        )
        self.kog_counters.record_kog(1)
        return None

    def _kog_torch_step(
        self, input_batch: Any, block_table: torch.Tensor, slot: torch.Tensor
    ) -> torch.Tensor:
        """Final hidden state [1, H] of the request's next token. All indices stay on the GPU; the host only
        knows an upper bound of the context length (vLLM's seq_lens_cpu_upper_bound)."""
        weights = self._kog_weights
        residual = self.model.model.embed_tokens(input_batch.input_ids[:1])[0]
        max_seq_len = int(input_batch.seq_lens_cpu_upper_bound[0])
        hidden = torch_step.decode_hidden(
            weights,
            self._kog_kv_caches,
            residual,
            input_batch.positions[0],
            slot,
            block_table,
            max_seq_len,
            self._kog_all_reduce,
        )
        return hidden.view(1, -1)

    def shutdown(self) -> None:
        self.kog_counters.flush()
        super().shutdown()
