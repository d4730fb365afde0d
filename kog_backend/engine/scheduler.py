"""KogScheduler: vLLM's async scheduler, able to take several tokens from one single-request decode step.

With tokens_per_step K > 1, a kog decode step generates up to K tokens for one scheduled token: the first is
sampled at the scheduled position p, each next one at p+1, p+2, ... with its K/V written by the kog path. Three
things change against vLLM's AsyncScheduler, all in this subclass (selected with `--scheduler-cls`, which
`--backend kog` sets; at K = 1 only items 2's retake and 3 apply):

  1. KV slots. While exactly one request is running, every allocation reserves K-1 look-ahead slots (the
     mechanism speculative decoding uses), so positions p .. p+K-1 have slots before the step starts. With
     more than one request nothing is reserved: batched steps cost what stock costs.
  2. Accounting. A step that returns n > 1 tokens for one scheduled token has computed n positions
     (p .. p+n-1), so num_computed_tokens advances by n-1 more than the scheduler assumed, and so do the
     request's output placeholders (async scheduling counts one per scheduled decode token); tokens are then
     appended one by one with vLLM's own stop checks (EOS, stop ids, max_tokens, max_model_len), which trim
     the burst exactly where one-token-per-step decoding would have stopped. Stop strings stay with the
     detokenizer, which truncates the text the same way. A decode step that returns no token (an aborted
     monokernel launch, discarded by the runner) has computed nothing: the position is retaken.
  3. What is in flight. Async scheduling schedules step n+1 before step n's tokens are known, assuming one token
     per step. A step that may be a kog step (one request decoding one token) may return a burst, or no token at
     all (an aborted launch, whose position is retaken), so it is the only step in flight: while it is,
     `schedule` returns an empty step (vLLM's engine then waits for its output) and the next step is scheduled
     from its tokens. Batched steps are scheduled ahead as vLLM does, so batched traffic keeps async scheduling's
     overlap of host and GPU work.

Under synchronous scheduling (--no-async-scheduling) nothing is ever in flight when `schedule` runs and the
placeholders return to zero within each step, so the same class serves both. Once the worker turns kog off for the
server (a kernel abort, a model the monokernel cannot take; scheduling.mark_turned_off), items 1-3 stop once the
step in flight then has been accounted for: the scheduler is vLLM's AsyncScheduler from its next step.
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.request import RequestStatus

from kog_backend.config import KogConfig
from kog_backend.engine import scheduling

logger = init_logger("kog_backend.engine.scheduler")

# Empty steps scheduled behind a possible kog step before the scheduler gives up waiting for its output (item 3):
# vLLM's batch queue holds two steps, so its engine takes the burst's output right after the first.
MAX_EMPTY_BEHIND = 4


def may_be_kog_step(scheduler_output: Any) -> bool:
    """Whether a scheduled step may run on the kog path, and so return a burst or no token: one request, one token,
    not its first step (the gate's first cut of a kog step, path/gate/step.py; the runner may still run it stock)."""
    return (
        len(scheduler_output.num_scheduled_tokens) == 1
        and scheduler_output.total_num_scheduled_tokens == 1
        and not scheduler_output.scheduled_new_reqs
        and not scheduler_output.scheduled_spec_decode_tokens
    )


class KogScheduler(AsyncScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = KogConfig.from_vllm_config(self.vllm_config)
        # K - 1 slots after the scheduled token for this step's burst, K more for the run-ahead burst behind it
        # (only where the runner can run ahead: the monokernel on one GPU, step_select.select_step).
        one_gpu = self.vllm_config.parallel_config.tensor_parallel_size == 1
        ahead = cfg.run_ahead and cfg.step_impl != "torch" and one_gpu
        per_step = cfg.tokens_per_step * (2 if ahead else 1)
        self.kog_lookahead = per_step - 1 if cfg.enabled and cfg.tokens_per_step > 1 else 0
        if self.num_spec_tokens:
            logger.warning("kog: speculative decoding is configured; multi-token kog steps are off")
            self.kog_lookahead = 0
        self._stock_lookahead = self.num_lookahead_tokens
        self.kog_enabled = cfg.enabled
        # The scheduled step that may be a kog step and whose output has not come back (item 3), or None, and how many
        # empty steps were scheduled behind it (vLLM's engine takes its output after one).
        self.kog_step_in_flight: Any = None
        self._empty_behind = 0

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.kog_step_in_flight is not None:
            self._empty_behind += 1
            if self._empty_behind <= MAX_EMPTY_BEHIND:
                return self._schedule_nothing(*args, **kwargs)
            # vLLM 0.26's engine takes the oldest step's output once its batch queue (two steps without pipeline
            # parallelism, which the gate refuses) is full, so this is an engine that schedules differently. A step
            # scheduled past a burst in flight would start from the wrong token, and waiting would hang the server:
            # fail visibly instead.
            raise RuntimeError(
                f"kog: vLLM's engine asked for {self._empty_behind} steps while a kog step was in flight (a batch "
                "queue deeper than vLLM 0.26's); run this server with --no-async-scheduling"
            )
        if self.kog_enabled:
            reason = scheduling.turned_off_reason(self.vllm_config)
            if reason is not None:  # the worker turned kog off (scheduling.py): vLLM's scheduling from here on
                logger.info("kog: off on this server (%s): scheduling as vLLM's async scheduler from here on", reason)
                self.kog_enabled, self.kog_lookahead = False, 0
        single = len(self.running) + len(self.waiting) == 1
        self.num_lookahead_tokens = self.kog_lookahead if single else self._stock_lookahead
        out = super().schedule(*args, **kwargs)
        if self.kog_enabled and may_be_kog_step(out):
            self.kog_step_in_flight, self._empty_behind = out, 0
        return out

    def _schedule_nothing(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's own empty step (the scheduler's paused state schedules no token), finished requests included."""
        state, self._pause_state = self._pause_state, PauseState.PAUSED_ALL
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self._pause_state = state

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        # Only a step that may have been a kog step (one request's decode, may_be_kog_step) can return more tokens
        # than scheduled or none where one was due: every other step is vLLM's, whose counts under async scheduling
        # already include the steps scheduled after it (a prompt's next chunk makes computed >= num_tokens while this
        # chunk's output, with no token, comes back), so none of it is adjusted here.
        kog_step = scheduler_output is self.kog_step_in_flight
        if kog_step:
            self.kog_step_in_flight = None
        sampled = model_runner_output.sampled_token_ids
        # (Once kog is off, none of this: kog_enabled drops in `schedule`, after the output of the step in flight
        # when the worker turned kog off, an aborted launch's, has come through here and been retaken.)
        if kog_step and sampled and self.kog_enabled and not scheduler_output.scheduled_spec_decode_tokens:
            for req_id, idx in model_runner_output.req_id_to_index.items():
                scheduled = scheduler_output.num_scheduled_tokens.get(req_id, 0)
                extra = len(sampled[idx]) - scheduled
                request = self.requests.get(req_id)
                # (A request vLLM preempted while the step was in flight, e.g. reset_prefix_cache with
                # reset_running_requests, has its in-flight tokens discarded by vLLM: its counts are vLLM's.)
                if (request is None or request.is_finished() or request.status != RequestStatus.RUNNING
                        or request.async_tokens_to_discard > 0):
                    continue
                if extra > 0:
                    request.num_computed_tokens += extra
                    request.num_output_placeholders += extra  # AsyncScheduler takes one off per token appended
                elif not sampled[idx] and request.num_computed_tokens >= request.num_tokens:
                    # A step that was due a token returned none: the kog runner discarded an aborted monokernel
                    # launch (launch_outcome.LaunchOutcome.aborted). The position is retaken by the next step
                    # (stock), as a rejected speculative token is; a partial prefill chunk (computed < num_tokens)
                    # is not this.
                    request.num_computed_tokens -= scheduled
                    request.num_output_placeholders = max(0, request.num_output_placeholders - scheduled)
        return super().update_from_output(scheduler_output, model_runner_output)
