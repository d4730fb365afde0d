"""The monokernel step: one launch of the monokernel per kog step, on vLLM's buffers.

Reads the step's `input_ids` (the last sampled token, written on the GPU), `positions`, the request's block-table
row and its slot (step_io.StepInputs), and vLLM's sampler state (`sampler`, passed per step: seeds, the request's
PenaltiesState rows); writes each position's K and V into vLLM's paged cache itself.

- K = 1 (one_token): the kernel writes this position's logits (bf16 [1, vocab]; under tensor parallelism this
  rank's vocabulary rows, all-gathered in rank order) and its token count (1, or 0 when the launch aborted);
  vLLM's sampler draws from the logits in `sample` (step_io.KernelLogits), with exact vLLM semantics for every
  sampling setting.
- K > 1 (burst: greedy, or sampled with the sampled_bursts option): the kernel generates up to k tokens, ending
  early after a stop id or before a token it leaves to vLLM's sampler, drawn right behind the launch
  (draw_deferred); `sample` hands them to vLLM (step_io.BurstTokens: tokens, num_sampled, num_rejected). With the
  run_ahead option, the burst after it is planned here (plan_run_ahead) and queued by sample_tokens
  (launch_planned) once vLLM has queued the copy of this step's tokens; the next step takes it if it is that
  burst (kog_backend.path.run_ahead).

Everything is queued on the current stream in this order, with no host synchronisation; every on-time launch
takes its argument table from the fault injection (None but in fault tests) and is timed by the step timeline.
Under tensor parallelism every launch's count is agreed over the group (launch_outcome.agree_count).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from vllm.logger import init_logger

from kog_backend.engine.fault_injection import FaultInjection
from kog_backend.engine.kog_request import KogRequest
from kog_backend.engine.launch_outcome import agree_count
from kog_backend.engine.step_io import BurstTokens, KernelLogits, StepInputs
from kog_backend.path.burst_sampling import BurstSampling
from kog_backend.path.run_ahead import BurstKey, PlannedLaunch, RunAhead, blocks_needed, next_burst_key
from kog_backend.path.step_timeline import StepTimeline

logger = init_logger("kog_backend.engine.monokernel_step")


class MonokernelStep:
    """kernel: the Monokernel (kog_backend.monokernel.host, or the TP one of monokernel.tp). block_size (vLLM's KV
    cache's), tokens_per_step and max_len (tokens_per_step.burst_max_len): where the burst after a burst may go.
    Under tensor parallelism (tp_size > 1) a K = 1 launch writes this rank's padded_vocab_local logits rows, which
    gather_logits collects from every rank in order."""

    name = "monokernel"

    def __init__(
        self, kernel: Any, device: torch.device, vocab_size: int, block_size: int, tokens_per_step: int,
        max_len: int, faults: FaultInjection, timeline: StepTimeline | None = None, tp_size: int = 1,
        padded_vocab_local: int | None = None, gather_logits: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:  # fmt: skip
        self.kernel = kernel
        self.device = device
        self.block_size = block_size  # of vLLM's KV cache
        self.tokens_per_step = tokens_per_step
        self.max_len = max_len
        self.faults = faults
        self.timeline = timeline
        self.tp_size = tp_size
        self.logits = torch.empty(1, vocab_size, dtype=torch.bfloat16, device=device)  # a K = 1 step's logits
        # Tensor parallelism: bf16 [1, V_pad / tp], this rank's rows of a K=1 step, and their all-gather.
        self.local_logits: torch.Tensor | None = None
        if padded_vocab_local is not None:
            self.local_logits = torch.empty(1, padded_vocab_local, dtype=torch.bfloat16, device=device)
        self.gather_logits = gather_logits
        self.k1_count = torch.zeros(1, dtype=torch.int32, device=device)  # a K = 1 launch's count, 0 if it aborted
        self.stop_tensors: dict[tuple[int, ...], torch.Tensor] = {}
        self.run_ahead: RunAhead | None = None  # on one GPU, with K > 1 and the run_ahead option (step_select)

    def run(self, inputs: StepInputs, k: int, sampler: Any) -> tuple[torch.Tensor, KernelLogits | BurstTokens]:
        """One launch: (hidden state for vLLM's ExecuteModelState, what `sample` hands vLLM). Raises RuntimeError
        when the launcher refuses the launch (launch_outcome.LaunchOutcome.launch_failed)."""
        output = self.one_token(inputs) if k == 1 else self.burst(inputs, k, sampler)
        # sample_tokens reads no hidden state on the kog path (no prompt logprobs, no speculator).
        return self.logits, output

    def one_token(self, inputs: StepInputs) -> KernelLogits:
        """k == 1: the kernel writes the logits and vLLM's sampler picks the token in sample_tokens (exact vLLM
        semantics for every sampling setting)."""
        mk = self.kernel
        batch = inputs.batch
        input_ids, positions = batch.input_ids[:1], batch.positions[:1]
        self.abandon_run_ahead()  # only bursts are launched ahead
        table = self.faults.table(mk)
        local = self.local_logits
        count = self.k1_count  # 1, or 0 when the launch aborted: vLLM's sampler's token is then dropped
        if local is None:
            with self.launch_timed():
                mk.step(input_ids, positions, inputs.block_table, inputs.slot_mapping, logits_out=self.logits[0],
                        model_table=table, num_out=count)
        else:  # tensor parallelism: this rank's vocabulary rows, then every rank's in order (padding cut off)
            with self.launch_timed():
                mk.step(input_ids, positions, inputs.block_table, inputs.slot_mapping, logits_out=local[0],
                        model_table=table, num_out=count)
            full = self.gather_logits(local)
            self.logits.copy_(full[:, : self.logits.shape[1]])
            agree_count(count, self.tp_size)
        return KernelLogits(self.logits, count)

    def burst(self, inputs: StepInputs, k: int, sampler: Any) -> BurstTokens:
        """k > 1 (greedy, or sampled with the sampled_bursts option): the kernel generates up to k tokens, ending
        early after a stop id or before a token it leaves to vLLM's sampler (drawn here, draw_deferred), or the
        burst launched ahead for this very step is taken instead of a launch."""
        mk = self.kernel
        batch, request = inputs.batch, inputs.request
        input_ids, positions = batch.input_ids[:1], batch.positions[:1]
        stop = self.stop_tensor(request.stop_ids)
        seed, sampling, penalty_rows = None, None, None
        if request.sampling is not None:  # gate.burst_reason: the request's seed as vLLM's sampler holds it
            seed = sampler.sampling_states.seeds.gpu[batch.idx_mapping[:1].long()]
            sampling = request.sampling
            if sampling.penalized:  # this request's rows of vLLM's PenaltiesState (views, no copy)
                penalty_rows = self.penalty_rows(sampler, batch)
        key = BurstKey(batch.req_ids[0], int(batch.num_computed_tokens_np[0]), k)
        ahead = self.run_ahead.take(key) if self.run_ahead is not None else None
        if ahead is not None:
            tokens, count, defer = ahead.tokens, ahead.count, ahead.defer
        else:
            draw = sampling.draw_kwargs(self.device, penalty_rows) if sampling is not None else {}
            defer = draw.get("defer_out")
            table = self.faults.table(mk)
            with self.launch_timed():
                tokens, count = mk.generate(
                    input_ids, positions, inputs.block_table, inputs.slot_mapping, k, stop_ids=stop,
                    sample_seed=seed, model_table=table, **draw,
                )  # fmt: skip
        if defer is not None:
            count = self.draw_deferred(tokens, count, defer, positions, batch, sampler)
        agree_count(count, self.tp_size)
        result = BurstTokens(tokens.view(1, k), count, 1 - count)
        if self.run_ahead is not None:
            self.plan_run_ahead(key, tokens, count, inputs, stop, seed, sampling, penalty_rows)
        return result

    def stop_tensor(self, stop_ids: tuple[int, ...]) -> torch.Tensor:
        """int64 GPU tensor of a request's stop ids (-1 alone: none), made once per distinct set."""
        stop = self.stop_tensors.get(stop_ids)
        if stop is None:
            stop = torch.tensor(stop_ids or (-1,), dtype=torch.int64, device=self.device)
            self.stop_tensors[stop_ids] = stop
        return stop

    @staticmethod
    def penalty_rows(sampler: Any, input_batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt_mask int32 [ceil(V / 32)], output_counts int32 [V]): the step's request's rows of vLLM's
        PenaltiesState, which vLLM's post-update keeps current in stream order (before the next launch)."""
        state = sampler.penalties_state
        i = int(input_batch.idx_mapping_np[0])
        return state.prompt_bin_mask[i], state.output_bin_counts[i]

    def draw_deferred(
        self, tokens: torch.Tensor, count: torch.Tensor, defer: torch.Tensor, positions: torch.Tensor,
        input_batch: Any, sampler: Any,
    ) -> torch.Tensor:  # fmt: skip
        """The token a filtered burst left to vLLM (defer[0] == 1: its launch ended before token `count`), drawn by
        vLLM's own sampler from that token's logits (the kernel's logits scratch holds the last token it computed)
        at that token's input position, and put in place: returns the burst's token count including it. Queued
        right behind the launch, with no host synchronisation, whether or not the kernel deferred (its result is
        then discarded): one sampler call per burst of K tokens."""
        mk = self.kernel
        k = tokens.numel()
        # The kernel's logits of a penalised launch are already penalised (with its own earlier tokens counted,
        # which vLLM's counts do not hold yet): vLLM's sampler must not apply the penalties again. Its host-side
        # flag gates the penalties kernel's launch, so clearing it for this call is exact.
        use_penalty = sampler.penalties_state.use_penalty
        i = int(input_batch.idx_mapping_np[0])
        flag, use_penalty[i] = use_penalty[i], False
        try:
            drawn, _ = sampler.sample(
                mk.logits_scratch.view(1, -1), input_batch.expanded_idx_mapping[:1], input_batch.idx_mapping_np[:1],
                positions[:1] + count, input_batch.input_ids[:1], input_batch.expanded_local_pos[:1],
            )  # fmt: skip
        finally:
            use_penalty[i] = flag
        at = count.clamp(max=k - 1).long()
        tokens.scatter_(0, at, torch.where(defer.bool(), drawn.view(1).to(tokens.dtype), tokens.gather(0, at)))
        return count + defer

    def plan_run_ahead(
        self, key: BurstKey, tokens: torch.Tensor, count: torch.Tensor, inputs: StepInputs, stop: torch.Tensor,
        seed: torch.Tensor | None, sampling: BurstSampling | None,
        penalty_rows: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> None:  # fmt: skip
        """Plans the burst after `key` (kog_backend.path.run_ahead), queued by sample_tokens. Only into KV slots this
        request holds: KogScheduler reserves 2K - 1 look-ahead slots while it runs alone, and a step scheduled
        otherwise has fewer blocks, so nothing is planned."""
        request: KogRequest = inputs.request
        block_table = inputs.block_table
        k = key.num_tokens
        nxt = next_burst_key(key, request.burst_length(self.tokens_per_step, key.position + k, self.max_len))
        if nxt is None:
            return
        block_size = self.block_size
        need = blocks_needed(nxt, block_size)
        held = inputs.blocks_held()
        if need > held or need > block_table.numel():
            return
        # A copy: the next step rewrites vLLM's gathered rows (after this launch, in stream order, but a copy
        # keeps the launch's inputs its own).
        row = block_table[:need].clone()
        first = nxt.position // block_size
        slot = row[first : first + 1].long() * block_size + nxt.position % block_size
        self.run_ahead.plan(PlannedLaunch(
            key=nxt, input_ids=tokens[k - 1 : k], positions=inputs.batch.positions[:1] + k, block_table=row,
            slot_mapping=slot, gate=count, gate_min=k, stop_ids=stop, sample_seed=seed, sampling=sampling,
            penalty_rows=penalty_rows,
        ))  # fmt: skip

    def launch_planned(self) -> None:
        """Queues the planned run-ahead burst, if any (sample_tokens, after vLLM queued the copy of this step's
        tokens). A launcher check that refuses it leaves this step's output standing and ends running ahead."""
        if self.run_ahead is None or self.run_ahead.planned is None:
            return
        try:
            with self.launch_timed():
                self.run_ahead.launch_planned(self.kernel)
        except RuntimeError as e:  # a launcher check: this step's output stands; no more running ahead
            logger.warning("kog: run-ahead launch failed, bursts launch on time from now on: %s", e)
            self.run_ahead = None

    def abandon_run_ahead(self, req_id: str | None = None) -> None:
        """Nothing launched ahead (for `req_id`: of that request, which vLLM removes) will be used
        (kog_backend.path.run_ahead: cancelled on the GPU)."""
        if self.run_ahead is None:
            return
        if req_id is None:
            self.run_ahead.abandon()
        else:
            self.run_ahead.abandon_request(req_id)

    def launch_timed(self):
        return self.timeline.launch() if self.timeline is not None else contextlib.nullcontext()
