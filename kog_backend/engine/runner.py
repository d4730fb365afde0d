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
penalties.cuh), where the kernel
leaves a token whose draw hinges on vLLM's own fp32 rounding to vLLM's sampler, run on that token's logits right
behind the launch (`_kog_draw_deferred`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.logger import init_logger
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.model_runner import ExecuteModelState
from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2

from kog_backend.path import gate, model_spec

from kog_backend.config import KogConfig
from kog_backend.engine.fault_injection import FaultInjection
from kog_backend.engine.kog_request import KogRequest
from kog_backend.engine.step_io import BurstTokens, StepInputs
from kog_backend.engine.torch_step import TorchStep
from kog_backend.engine.tokens_per_step import burst_max_len, effective_tokens_per_step
from kog_backend.path.counters import StepCounters, state_dir
from kog_backend.path.burst_sampling import BurstSampling
from kog_backend.path.gate import kv_cache as kv_gate
from kog_backend.path.gate import monokernel as mk_gate
from kog_backend.path.gate.step import MAX_TESTED_CONTEXT
from kog_backend.path.run_ahead import BurstKey, PlannedLaunch, RunAhead, blocks_needed, next_burst_key
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
        self._kog_burst: BurstTokens | None = None
        self._kog_tokens_per_step = effective_tokens_per_step(self.kog_config, vllm_config)
        self._kog_weights: model_spec.DecoderWeights | None = None
        self._kog_kv_caches: list[torch.Tensor] = []
        self._kog_torch: TorchStep | None = None  # computes the kog step without the monokernel
        self._kog_mk = None  # kog_backend.monokernel.Monokernel when step_impl selects it
        self._kog_mk_logits: torch.Tensor | None = None  # bf16 [1, vocab]: the monokernel's logits of a K=1 step
        # Tensor parallelism: bf16 [1, V_pad / tp], this rank's rows of a K=1 step, and their all-gather.
        self._kog_mk_local_logits: torch.Tensor | None = None
        self._kog_gather_logits = None
        self._kog_logits_pending = False
        self._kog_stop_tensors: dict[tuple[int, ...], torch.Tensor] = {}
        self._kog_run_ahead: RunAhead | None = None  # with the monokernel on one GPU, K > 1 and the run_ahead option
        self._kog_timeline = StepTimeline() if self.kog_config.step_timeline else None
        self._kog_faults = FaultInjection(self.kog_config, self.device)  # the inject_fault option
        self._kog_k1_count: torch.Tensor | None = None  # int32 [1]: a K = 1 launch's token count, 0 if it aborted
        reason = gate.server_unsupported_reason(vllm_config)
        if reason is not None:
            self._kog_disable(reason)

    @property
    def _kog_max_len(self) -> int:
        """The max_model_len a burst is capped by (tokens_per_step.burst_max_len)."""
        return burst_max_len(self.max_model_len)

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
        impl = self._kog_select_impl()
        if impl is None:
            return
        self._kog_torch = TorchStep(self.model, self._kog_weights, caches, self.device)
        logger.info(
            "kog: single-request decode steps run on the kog path (%s, %d layers, block size %d, %d tokens per step%s)",
            impl,
            len(caches),
            caches[0].shape[2],
            self._kog_tokens_per_step,
            ", bursts run ahead" if self._kog_run_ahead is not None else "",
        )
        if self.max_model_len > MAX_TESTED_CONTEXT:
            logger.info(
                "kog: max_model_len %d: steps at contexts beyond %d positions (the kog path's tested range) run stock",
                self.max_model_len, MAX_TESTED_CONTEXT,
            )  # fmt: skip

    def _kog_select_impl(self) -> str | None:
        """'torch' or 'monokernel'. `auto` and `monokernel` select the monokernel and turn kog off, with the
        reason, where it cannot run (the requests are then served stock: the torch step is slower than stock, so
        it runs only when asked for with `torch`). The monokernel's parity with stock inside vLLM is what
        integration_tests/ checks (teacher forcing, multi-token, sampled bursts; figures in README.md)."""
        if self.kog_config.step_impl == "torch":
            return "torch"
        from kog_backend import ops

        reason = ops.load_reason()
        if reason is None:
            from kog_backend.monokernel import Monokernel, unsupported_reason

            if self._kog_weights.shape.tp_size > 1:
                return self._kog_select_tp_monokernel()
            reason = unsupported_reason(self._kog_weights, self._kog_kv_caches, self.device)
        if reason is not None:
            self._kog_disable(mk_gate.refused(reason))
            return None
        try:
            self._kog_mk = Monokernel(
                self._kog_weights, self._kog_kv_caches, self.device, self.max_model_len,
                max_tokens_per_launch=self._kog_tokens_per_step,
            )
        except (ValueError, RuntimeError) as e:
            self._kog_disable(mk_gate.setup_failed(e))
            return None
        vocab = self.model_config.get_vocab_size()
        self._kog_mk_logits = torch.empty(1, vocab, dtype=torch.bfloat16, device=self.device)
        self._kog_k1_count = torch.zeros(1, dtype=torch.int32, device=self.device)
        if self.kog_config.run_ahead and self._kog_tokens_per_step > 1:
            self._kog_run_ahead = RunAhead(self.kog_counters)
        return "monokernel"

    def _kog_select_tp_monokernel(self) -> str | None:
        """Tensor parallelism: the TP monokernel on every rank of the group or on none (tp.setup_tp_monokernel), when
        the tp_monokernel option is on. Its K = 1 logits are this rank's vocabulary rows, gathered for vLLM's
        sampler."""
        s = self._kog_weights.shape
        reason = mk_gate.tp_option_reason(s.tp_size, self.kog_config.tp_monokernel)
        if reason is not None:
            self._kog_disable(mk_gate.refused(reason))
            return None
        from vllm.distributed import get_tp_group, tensor_model_parallel_all_gather

        from kog_backend.monokernel.tp import setup_tp_monokernel

        mk, reason = setup_tp_monokernel(
            self._kog_weights, self._kog_kv_caches, self.device, self.max_model_len, self._kog_tokens_per_step,
            get_tp_group().cpu_group, lambda t: tensor_model_parallel_all_gather(t, dim=0),
        )  # fmt: skip
        if mk is None:
            self._kog_disable(mk_gate.refused(reason, tp=True))
            return None
        self._kog_mk = mk
        vocab = self.model_config.get_vocab_size()
        self._kog_mk_logits = torch.empty(1, vocab, dtype=torch.bfloat16, device=self.device)
        self._kog_mk_local_logits = torch.empty(1, s.padded_vocab_local, dtype=torch.bfloat16, device=self.device)
        self._kog_k1_count = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._kog_gather_logits = lambda t: tensor_model_parallel_all_gather(t, dim=-1)
        return "monokernel"

    # ---- request tracking ------------------------------------------------------------------------------------

    def add_requests(self, scheduler_output: Any) -> None:
        super().add_requests(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            self._kog_requests[new.req_id] = KogRequest.from_new_request(new, self.model_config.get_vocab_size())

    def _remove_request(self, req_id: str) -> bool:
        if self._kog_run_ahead is not None:
            self._kog_run_ahead.abandon_request(req_id)
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
        k = 1
        if self._kog_tokens_per_step > 1:
            single = self._kog_burst_reason(request)
            if single is None:
                k = request.burst_length(self._kog_tokens_per_step, position, self._kog_max_len)
            else:
                self.kog_counters.record_single_token(single)
        hidden = None
        if self._kog_mk is not None:
            hidden, k = self._kog_try_monokernel(input_batch, inputs.block_table, inputs.slot_mapping, request, k)
        if hidden is None:
            hidden, self._kog_burst = self._kog_torch.run(inputs, k)

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

    # ---- launch outcome ----------------------------------------------------------------------------------------

    def _kog_check_launch_status(self) -> None:
        """The outcome of the monokernel launches whose tokens vLLM has taken: every launch's last block writes its
        abort word into pinned memory (Monokernel.status, sync.cuh), and vLLM waited for each earlier step's output,
        which the stream orders behind its launch, before scheduling this step: a host read, no device call. An
        aborted launch reported no token (its count is 0: the scheduler retakes that position, KogScheduler), so
        nothing it computed reached a client; here kog turns off and this step, and every later one, runs stock.
        Tensor parallelism: the ranks' words are combined (max) so that every rank decides the same."""
        mk = self._kog_mk
        if mk is None:
            return
        word = mk.status_word()
        if self._kog_weights is not None and self._kog_weights.shape.tp_size > 1:
            from vllm.distributed import get_tp_group

            t = torch.tensor([word], dtype=torch.int64)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=get_tp_group().cpu_group)
            word = int(t[0])
        if word != 0:
            self._kog_on_abort(word)

    def _kog_on_abort(self, word: int) -> None:
        mk = self._kog_mk
        self._kog_abandon_run_ahead()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # nothing of the kernel's in flight (run-ahead included)
        try:
            detail = mk.diagnostics() or f"abort word {word} on another rank"
        except RuntimeError as e:  # the diagnostic must not take the server down
            detail = f"abort word {word} (diagnostics unavailable: {e})"
        self.kog_counters.record_launch_abort()
        self._kog_disable(mk_gate.kernel_abort(detail))
        mk.reset_counters()  # a later kernel (tests, a future re-enable) starts from a clean state
        self._kog_mk, self._kog_burst, self._kog_logits_pending, self._kog_run_ahead = None, None, False, None

    def _kog_agree_count(self, count: torch.Tensor) -> None:
        """Tensor parallelism: the launch's token count becomes the least over the group (on the device, no host
        synchronisation). A rank whose kernel aborted reports 0 while its peers, fed its garbage partial sums, may
        complete: with the minimum no rank's step emits a token (the output rank's is what vLLM uses)."""
        if self._kog_weights is None or self._kog_weights.shape.tp_size == 1:
            return
        from vllm.distributed import get_tp_group

        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN, group=get_tp_group().device_group)

    def _kog_burst_reason(self, request: KogRequest) -> str | None:
        """None when this request's kog step may generate K tokens, else why it runs one (the gate's
        burst_reason: the request's own single-token reason, the sampled_bursts option, the monokernel, vLLM's
        Gumbel noise, what the kernel can apply)."""
        return gate.burst_reason(
            request.single_token, request.sampling, sampled_bursts=self.kog_config.sampled_bursts,
            monokernel=self._kog_mk, fp64_gumbel=bool(getattr(self.sampler, "use_fp64_gumbel", False)),
        )  # fmt: skip

    def _kog_try_monokernel(
        self, input_batch: Any, block_table: torch.Tensor, slot_mapping: torch.Tensor, request: KogRequest, k: int
    ) -> tuple[torch.Tensor | None, int]:
        """(output, k), or (None, 1) when the launcher refused the launch (its checks, resources): kog is then off
        for this server, and this step, whose bookkeeping is done, is computed by the torch step. A sticky device
        fault raises again there and reaches vLLM as what it is."""
        try:
            return self._kog_monokernel(input_batch, block_table, slot_mapping, request, k), k
        except RuntimeError as e:
            if self._kog_weights.shape.tp_size > 1:
                # The peers' kernels are waiting for this rank's partials: falling back alone would desynchronise
                # the group (their kernels time out, the torch step's all-reduce waits forever). Fail visibly.
                raise
            self._kog_disable(mk_gate.launch_failed(e))
            self._kog_abandon_run_ahead()
            self._kog_mk, self._kog_burst, self._kog_logits_pending, self._kog_run_ahead = None, None, False, None
            return None, 1

    def _kog_monokernel(
        self, input_batch: Any, block_table: torch.Tensor, slot_mapping: torch.Tensor, request: KogRequest, k: int
    ) -> torch.Tensor:
        """One launch. k == 1: the kernel writes the logits and vLLM's sampler picks the token in sample_tokens
        (exact vLLM semantics for every sampling setting). k > 1 (greedy, or sampled with the sampled_bursts option):
        the kernel generates up to k tokens, ending early after a stop id or before a token it leaves to vLLM's
        sampler (drawn here, _kog_draw_deferred); `sample` hands them to vLLM."""
        mk = self._kog_mk
        input_ids, positions = input_batch.input_ids[:1], input_batch.positions[:1]
        if k == 1:
            self._kog_abandon_run_ahead()  # only bursts are launched ahead
            table = self._kog_faults.table(mk)
            local = self._kog_mk_local_logits
            count = self._kog_k1_count  # 1, or 0 when the launch aborted: vLLM's sampler's token is then dropped
            if local is None:
                with self._kog_launch_timed():
                    mk.step(input_ids, positions, block_table, slot_mapping, logits_out=self._kog_mk_logits[0],
                            model_table=table, num_out=count)
            else:  # tensor parallelism: this rank's vocabulary rows, then every rank's in order (padding cut off)
                with self._kog_launch_timed():
                    mk.step(input_ids, positions, block_table, slot_mapping, logits_out=local[0], model_table=table,
                            num_out=count)
                full = self._kog_gather_logits(local)
                self._kog_mk_logits.copy_(full[:, : self._kog_mk_logits.shape[1]])
                self._kog_agree_count(count)
            self._kog_logits_pending = True
        else:
            stop = self._kog_stop_tensors.get(request.stop_ids)
            if stop is None:
                stop = torch.tensor(request.stop_ids or (-1,), dtype=torch.int64, device=self.device)
                self._kog_stop_tensors[request.stop_ids] = stop
            seed, sampling, penalty_rows = None, None, None
            if request.sampling is not None:  # _kog_burst_reason: the request's seed as vLLM's sampler holds it
                seed = self.sampler.sampling_states.seeds.gpu[input_batch.idx_mapping[:1].long()]
                sampling = request.sampling
                if sampling.penalized:  # this request's rows of vLLM's PenaltiesState (views, no copy)
                    penalty_rows = self._kog_penalty_rows(input_batch)
            key = BurstKey(input_batch.req_ids[0], int(input_batch.num_computed_tokens_np[0]), k)
            ahead = self._kog_run_ahead.take(key) if self._kog_run_ahead is not None else None
            if ahead is not None:
                tokens, count, defer = ahead.tokens, ahead.count, ahead.defer
            else:
                draw = sampling.draw_kwargs(self.device, penalty_rows) if sampling is not None else {}
                defer = draw.get("defer_out")
                table = self._kog_faults.table(mk)
                with self._kog_launch_timed():
                    tokens, count = mk.generate(
                        input_ids, positions, block_table, slot_mapping, k, stop_ids=stop, sample_seed=seed,
                        model_table=table, **draw,
                    )
            if defer is not None:
                count = self._kog_draw_deferred(tokens, count, defer, positions, input_batch)
            self._kog_agree_count(count)
            self._kog_burst = BurstTokens(tokens.view(1, k), count, 1 - count)
            if self._kog_run_ahead is not None:
                self._kog_plan_run_ahead(key, tokens, count, input_batch, block_table, request, stop, seed, sampling,
                                         penalty_rows)
        # sample_tokens reads no hidden state on the kog path (no prompt logprobs, no speculator).
        return self._kog_mk_logits

    def _kog_penalty_rows(self, input_batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt_mask int32 [ceil(V / 32)], output_counts int32 [V]): the step's request's rows of vLLM's
        PenaltiesState, which vLLM's post-update keeps current in stream order (before the next launch)."""
        state = self.sampler.penalties_state
        i = int(input_batch.idx_mapping_np[0])
        return state.prompt_bin_mask[i], state.output_bin_counts[i]

    def _kog_draw_deferred(
        self, tokens: torch.Tensor, count: torch.Tensor, defer: torch.Tensor, positions: torch.Tensor, input_batch: Any
    ) -> torch.Tensor:
        """The token a filtered burst left to vLLM (defer[0] == 1: its launch ended before token `count`), drawn by
        vLLM's own sampler from that token's logits (the kernel's logits scratch holds the last token it computed)
        at that token's input position, and put in place: returns the burst's token count including it. Queued
        right behind the launch, with no host synchronisation, whether or not the kernel deferred (its result is
        then discarded): one sampler call per burst of K tokens."""
        mk = self._kog_mk
        k = tokens.numel()
        # The kernel's logits of a penalised launch are already penalised (with its own earlier tokens counted,
        # which vLLM's counts do not hold yet): vLLM's sampler must not apply the penalties again. Its host-side
        # flag gates the penalties kernel's launch, so clearing it for this call is exact.
        use_penalty = self.sampler.penalties_state.use_penalty
        i = int(input_batch.idx_mapping_np[0])
        flag, use_penalty[i] = use_penalty[i], False
        try:
            drawn, _ = self.sampler.sample(
                mk.logits_scratch.view(1, -1), input_batch.expanded_idx_mapping[:1], input_batch.idx_mapping_np[:1],
                positions[:1] + count, input_batch.input_ids[:1], input_batch.expanded_local_pos[:1],
            )  # fmt: skip
        finally:
            use_penalty[i] = flag
        at = count.clamp(max=k - 1).long()
        tokens.scatter_(0, at, torch.where(defer.bool(), drawn.view(1).to(tokens.dtype), tokens.gather(0, at)))
        return count + defer

    def _kog_plan_run_ahead(
        self, key: BurstKey, tokens: torch.Tensor, count: torch.Tensor, input_batch: Any, block_table: torch.Tensor,
        request: KogRequest, stop: torch.Tensor, seed: torch.Tensor | None, sampling: BurstSampling | None,
        penalty_rows: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> None:  # fmt: skip
        """Plans the burst after `key` (kog_backend.path.run_ahead), queued by sample_tokens. Only into KV slots this
        request holds: KogScheduler reserves 2K - 1 look-ahead slots while it runs alone, and a step scheduled
        otherwise has fewer blocks, so nothing is planned."""
        k = key.num_tokens
        nxt = next_burst_key(key, request.burst_length(self._kog_tokens_per_step, key.position + k, self._kog_max_len))
        if nxt is None:
            return
        block_size = self._kog_kv_caches[0].shape[2]
        need = blocks_needed(nxt, block_size)
        held = int(self.block_tables.num_blocks.np[0, input_batch.idx_mapping_np[0]])
        if need > held or need > block_table.numel():
            return
        # A copy: the next step rewrites vLLM's gathered rows (after this launch, in stream order, but a copy
        # keeps the launch's inputs its own).
        row = block_table[:need].clone()
        first = nxt.position // block_size
        slot = row[first : first + 1].long() * block_size + nxt.position % block_size
        self._kog_run_ahead.plan(PlannedLaunch(
            key=nxt, input_ids=tokens[k - 1 : k], positions=input_batch.positions[:1] + k, block_table=row,
            slot_mapping=slot, gate=count, gate_min=k, stop_ids=stop, sample_seed=seed, sampling=sampling,
            penalty_rows=penalty_rows,
        ))  # fmt: skip

    def sample_tokens(self, grammar_output: Any) -> Any:
        out = super().sample_tokens(grammar_output)
        # After vLLM queued the copy of this step's tokens (AsyncOutput waits for the stream as it is now), so the
        # copy does not wait for the run-ahead burst.
        if self._kog_run_ahead is not None and self._kog_run_ahead.planned is not None:
            try:
                with self._kog_launch_timed():
                    self._kog_run_ahead.launch_planned(self._kog_mk)
            except RuntimeError as e:  # a launcher check: this step's output stands; no more running ahead
                logger.warning("kog: run-ahead launch failed, bursts launch on time from now on: %s", e)
                self._kog_run_ahead = None
        if self._kog_timeline is not None:
            self._kog_timeline.sampled()
        return out

    def _kog_abandon_run_ahead(self) -> None:
        """Nothing launched ahead will be used (kog_backend.path.run_ahead: cancelled on the GPU)."""
        if self._kog_run_ahead is not None:
            self._kog_run_ahead.abandon()

    def _kog_launch_timed(self):
        return self._kog_timeline.launch() if self._kog_timeline is not None else contextlib.nullcontext()

    def sample(self, hidden_states: torch.Tensor, input_batch: Any, grammar_output: Any) -> Any:
        if self._kog_logits_pending:
            self._kog_logits_pending = False
            out = self.sampler(self._kog_mk_logits, input_batch)
            # The launch's count (1, or 0 when it aborted: the token drawn from its logits is dropped and the
            # scheduler retakes the position), in place of the sampler's 1.
            count = self._kog_k1_count
            out.num_sampled, out.num_rejected = count, 1 - count
            return out, out.num_sampled, out.num_rejected
        burst, self._kog_burst = self._kog_burst, None
        if burst is None:
            return super().sample(hidden_states, input_batch, grammar_output)
        return burst.sample(self.sampler, input_batch)

    def shutdown(self) -> None:
        self._kog_abandon_run_ahead()
        self.kog_counters.flush()
        self.kog_counters.remove()  # `kog stats` reads running servers; nothing is left under the state directory
        super().shutdown()
