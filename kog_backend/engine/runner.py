"""KogModelRunner: vLLM 0.26's V2 GPU model runner with a kog path for single-request decode steps.

Every step goes through the gate's `step_unsupported_reason`. Ineligible steps (batches, prefills, requests
that ask for something the kog path does not do) run the stock `execute_model` unchanged. An eligible step runs
the stock bookkeeping (request states, block tables, `prepare_inputs`, `prepare_attn`: the same GPU buffers the
stock path fills), then the kog step, which reads vLLM's weights and writes this position's K/V into vLLM's paged
cache itself, and hands vLLM a final hidden state (or, with the monokernel, its logits); `sample_tokens` then runs
stock (vLLM's sampler, async output copy, `postprocess_sampled`), so the scheduler, detokenizer and stop handling
see an ordinary step. With tokens_per_step K > 1, one kog step generates up to K tokens and `sample` hands them
to vLLM as one step's output (KogScheduler reserved their KV slots and accounts for them): greedy, or sampled as
vLLM's sampler draws (temperature, top-k, top-p, min-p, penalties; csrc/include/kog/burst_sampling.cuh,
penalties.cuh), where the kernel leaves a token whose draw hinges on vLLM's own fp32 rounding to vLLM's sampler,
run on that token's logits right behind the launch (MonokernelStep.draw_deferred).

The runner keeps what is a vLLM override or vLLM's bookkeeping; the kog step is computed by
- monokernel_step.MonokernelStep: the monokernel's launches (K = 1 with logits, bursts, run-ahead);
- torch_step.TorchStep: the torch step (the torch option, and the step whose launch the launcher refused);
- launch_outcome.LaunchOutcome: a launch that failed or aborted turns kog off;
- step_select.select_step: which of the two steps runs, or why kog is off;
- kog_request.KogRequest, tokens_per_step: what the runner records of a request, and a step's burst length;
- step_io: the step's inputs (vLLM's buffers) and what it leaves for `sample`.
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

from kog_backend.config import KogConfig
from kog_backend.engine import scheduling
from kog_backend.engine.kog_request import KogRequest
from kog_backend.engine.launch_outcome import LaunchOutcome
from kog_backend.engine.monokernel_step import MonokernelStep
from kog_backend.engine.step_io import BurstTokens, KernelLogits, StepInputs
from kog_backend.engine.step_select import select_step
from kog_backend.engine.tokens_per_step import burst_max_len, effective_tokens_per_step
from kog_backend.engine.torch_step import TorchStep
from kog_backend.path import gate, model_spec
from kog_backend.path.counters import StepCounters, state_dir
from kog_backend.path.gate import kv_cache as kv_gate
from kog_backend.path.gate.step import MAX_TESTED_CONTEXT
from kog_backend.path.step_timeline import StepTimeline

logger = init_logger("kog_backend.engine.runner")

_ONE_TOKEN = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=1, num_reqs=1)


class KogModelRunner(GPUModelRunnerV2):
    def __init__(self, vllm_config: Any, device: torch.device):
        super().__init__(vllm_config, device)
        self.kog_config = KogConfig.from_vllm_config(vllm_config)
        rank = vllm_config.parallel_config.rank
        path = os.path.join(state_dir(self.kog_config.state_dir), f"stats-{os.getpid()}-rank{rank}.json")
        self.kog_counters = StepCounters(path=path)
        self._kog_requests: dict[str, KogRequest] = {}
        self._kog_tokens_per_step = effective_tokens_per_step(self.kog_config, vllm_config)
        self._kog_weights: model_spec.DecoderWeights | None = None
        self._kog_kv_caches: list[torch.Tensor] = []
        self._kog_torch: TorchStep | None = None  # computes the kog step without the monokernel
        self._kog_monokernel: MonokernelStep | None = None  # when step_select chose it, until a launch fails
        self._kog_outcome = LaunchOutcome(self.kog_counters, self._kog_disable, self.device)
        self._kog_output: KernelLogits | BurstTokens | None = None  # what `sample` hands vLLM for this kog step
        self._kog_timeline = StepTimeline() if self.kog_config.step_timeline else None
        reason = gate.server_unsupported_reason(vllm_config)
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
        scheduling.mark_turned_off(self.vllm_config, reason)  # KogScheduler then schedules as stock

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if self.kog_disabled_reason is not None:
            return
        try:
            self._kog_weights = model_spec.from_vllm_model(self.model, self.vllm_config, self.kog_config.moe_kernel)
        except model_spec.UnsupportedModel as e:
            self._kog_disable(str(e))

    def initialize_kv_cache(self, kv_cache_config: Any) -> None:
        super().initialize_kv_cache(kv_cache_config)
        if self.kog_disabled_reason is not None:
            return
        reason = kv_gate.groups_reason(len(self.kv_cache_config.kv_cache_groups))
        if reason is not None:
            self._kog_disable(reason)
            return
        caches = []
        for layer in self.model.model.layers:
            cache = getattr(layer.self_attn.attn, "kv_cache", None)
            if isinstance(cache, (list, tuple)):
                cache = cache[0]
            reason = kv_gate.layer_reason(len(caches), cache) or kv_gate.served_layout_reason(
                cache, self._kog_weights.shape.head_dim
            )
            if reason is not None:
                self._kog_disable(reason)
                return
            caches.append(cache)
        self._kog_kv_caches = caches
        torch_step = TorchStep(self.model, self._kog_weights, caches, self.device)
        chosen = select_step(
            torch_step, self.kog_config, self._kog_weights, caches, self.device, self.max_model_len,
            self.model_config.get_vocab_size(), self._kog_tokens_per_step, self.kog_counters, self._kog_timeline,
        )  # fmt: skip
        if isinstance(chosen, str):
            self._kog_disable(chosen)
            return
        self._kog_torch = torch_step
        self._kog_monokernel = chosen if isinstance(chosen, MonokernelStep) else None
        runs_ahead = self._kog_monokernel is not None and self._kog_monokernel.run_ahead is not None
        logger.info(
            "kog: single-request decode steps run on the kog path (%s, %d layers, block size %d, %d tokens per step%s)",
            chosen.name,
            len(caches),
            caches[0].shape[2],
            self._kog_tokens_per_step,
            ", bursts run ahead" if runs_ahead else "",
        )
        if self.max_model_len > MAX_TESTED_CONTEXT:
            logger.info(
                "kog: max_model_len %d: steps at contexts beyond %d positions (the kog path's tested range) run stock",
                self.max_model_len, MAX_TESTED_CONTEXT,
            )  # fmt: skip

    # ---- request tracking ------------------------------------------------------------------------------------

    def add_requests(self, scheduler_output: Any) -> None:
        super().add_requests(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            self._kog_requests[new.req_id] = KogRequest.from_new_request(new, self.model_config.get_vocab_size())

    def _remove_request(self, req_id: str) -> bool:
        if self._kog_monokernel is not None:
            self._kog_monokernel.abandon_run_ahead(req_id)
        if self._kog_requests.pop(req_id, None) is not None and not self._kog_requests:
            if self._kog_timeline is not None:
                self.kog_counters.record_timeline(self._kog_timeline.summary())
            self.kog_counters.flush()  # idle: `kog stats` is current (at most one write per idle period)
        return super()._remove_request(req_id)

    # ---- the step --------------------------------------------------------------------------------------------

    def _kog_step_reason(self, scheduler_output: Any) -> str | None:
        if self.kog_disabled_reason is not None:
            return self.kog_disabled_reason
        requests = self._kog_requests
        scheduled = [rid for rid in scheduler_output.num_scheduled_tokens if rid in requests]
        reasons = {rid: requests[rid].reason for rid in scheduled}
        prompt_lens = {rid: requests[rid].prompt_len for rid in scheduled}
        return gate.step_unsupported_reason(scheduler_output, reasons, prompt_lens=prompt_lens)

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
            # An empty step (KogScheduler's while a burst is in flight, or nothing to run) leaves a planned run-ahead
            # burst standing; a dummy run (profiling, CUDA graph capture) is not a step of any request.
            if dummy_run:
                self._kog_abandon_run_ahead()
            return super().execute_model(
                scheduler_output, intermediate_tensors, dummy_run, skip_attn_for_dummy_run, is_profile
            )
        self._kog_check_launch_status()
        # A step's request may be new in this very step, so the request-level reason is only known after
        # add_requests; new requests make the step a prefill, which is refused before that matters.
        reason = self._kog_step_reason(scheduler_output)
        if self._kog_timeline is not None:
            self._kog_timeline.execute_entry(kog_step=reason is None)
        if reason is not None:
            self._kog_abandon_run_ahead()  # before the stock step is queued behind it
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
        request = self._kog_requests[input_batch.req_ids[0]]
        inputs = StepInputs(input_batch, block_tables[0][0], slot_mappings[0][:1], request, self.block_tables)
        position = int(input_batch.num_computed_tokens_np[0])
        block_size = self._kog_kv_caches[0].shape[2]  # positions per block of vLLM's KV cache
        k = self._kog_burst_length(request, position, inputs.blocks_held() * block_size)
        hidden, output = None, None
        if self._kog_monokernel is not None:
            try:
                hidden, output = self._kog_monokernel.run(inputs, k, self.sampler)
            except RuntimeError as e:
                self._kog_outcome.launch_failed(self._kog_monokernel, e)
                self._kog_drop_monokernel()
                k = 1
        if hidden is None:
            hidden, output = self._kog_torch.run(inputs, k)
        self._kog_output = output

        self.execute_model_state = ExecuteModelState(
            input_batch=input_batch,
            attn_metadata=None,
            slot_mappings_by_layer=None,
            hidden_states=hidden,
            aux_hidden_states=None,
            finished_req_ids=scheduler_output.finished_req_ids,
        )
        self.kog_counters.record_kog(k)
        return None

    def _kog_burst_length(self, request: KogRequest, position: int, slots: int) -> int:
        """Tokens this kog step generates: 1, or with K > 1 a burst (tokens_per_step.burst_length) unless the gate's
        burst_reason (the request's own single-token reason, the sampled_bursts option, the monokernel, vLLM's
        Gumbel noise, what the kernel can apply) keeps it at one token, counted. slots: KV slots the request holds
        (positions 0 .. slots - 1, its blocks x block size); a burst never writes past them."""
        if self._kog_tokens_per_step == 1:
            return 1
        single = gate.burst_reason(
            request.single_token, request.sampling, sampled_bursts=self.kog_config.sampled_bursts,
            monokernel=self._kog_monokernel.kernel if self._kog_monokernel is not None else None,
            fp64_gumbel=bool(getattr(self.sampler, "use_fp64_gumbel", False)),
        )  # fmt: skip
        if single is not None:
            self.kog_counters.record_single_token(single)
            return 1
        k = request.burst_length(self._kog_tokens_per_step, position, burst_max_len(self.max_model_len))
        k, single = gate.fit_to_slots(k, position, slots)
        if single is not None:
            self.kog_counters.record_single_token(single)
        return k

    def _kog_check_launch_status(self) -> None:
        """The outcome of the monokernel launches whose tokens vLLM has taken (LaunchOutcome.aborted): after an
        abort kog is off and this step runs stock."""
        if self._kog_monokernel is not None and self._kog_outcome.aborted(self._kog_monokernel):
            self._kog_drop_monokernel()

    def _kog_drop_monokernel(self) -> None:
        self._kog_monokernel, self._kog_output = None, None

    def _kog_abandon_run_ahead(self) -> None:
        if self._kog_monokernel is not None:
            self._kog_monokernel.abandon_run_ahead()

    # ---- sampling --------------------------------------------------------------------------------------------

    def sample_tokens(self, grammar_output: Any) -> Any:
        out = super().sample_tokens(grammar_output)
        # After vLLM queued the copy of this step's tokens (AsyncOutput waits for the stream as it is now), so the
        # copy does not wait for the run-ahead burst.
        if self._kog_monokernel is not None:
            self._kog_monokernel.launch_planned()
        if self._kog_timeline is not None:
            self._kog_timeline.sampled()
        return out

    def sample(self, hidden_states: torch.Tensor, input_batch: Any, grammar_output: Any) -> Any:
        output, self._kog_output = self._kog_output, None
        if output is None:
            return super().sample(hidden_states, input_batch, grammar_output)
        return output.sample(self.sampler, input_batch)

    def shutdown(self) -> None:
        self._kog_abandon_run_ahead()
        self.kog_counters.flush()
        self.kog_counters.remove()  # `kog stats` reads running servers; nothing is left under the state directory
        super().shutdown()
