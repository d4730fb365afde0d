"""KogScheduler: vLLM's scheduler, able to take several tokens from one single-request decode step.

With tokens_per_step K > 1, a kog decode step generates up to K tokens for one scheduled token: the first is
sampled at the scheduled position p, each next one at p+1, p+2, ... with its K/V written by the kog path. Two
things change against vLLM's Scheduler, both in this subclass (selected with `--scheduler-cls`, which
`--backend kog` sets when K > 1):

  1. KV slots. While exactly one request is running, every allocation reserves K-1 look-ahead slots (the
     mechanism speculative decoding uses), so positions p .. p+K-1 have slots before the step starts. With
     more than one request nothing is reserved: batched steps cost what stock costs.
  2. Accounting. A step that returns n > 1 tokens for one scheduled token has computed n positions
     (p .. p+n-1), so num_computed_tokens advances by n-1 more than the scheduler assumed; tokens are then
     appended one by one with vLLM's own stop checks (EOS, stop ids, max_tokens, max_model_len), which trim
     the burst exactly where one-token-per-step decoding would have stopped. Stop strings stay with the
     detokenizer, which truncates the text the same way. A decode step that returns no token (an aborted
     monokernel launch, discarded by the runner) has computed nothing: the position is retaken.

Async scheduling schedules step n+1 before step n's tokens are known, which a variable number of tokens per
step would break: K > 1 runs with async scheduling off (the engine's per-step cost is amortised over K instead).
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.scheduler import Scheduler

from kog_backend.config import KogConfig

logger = init_logger("kog_backend.engine.scheduler")


class KogScheduler(Scheduler):
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

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        single = len(self.running) + len(self.waiting) == 1
        self.num_lookahead_tokens = self.kog_lookahead if single else self._stock_lookahead
        return super().schedule(*args, **kwargs)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        sampled = model_runner_output.sampled_token_ids
        if sampled and not scheduler_output.scheduled_spec_decode_tokens:
            for req_id, idx in model_runner_output.req_id_to_index.items():
                extra = len(sampled[idx]) - scheduler_output.num_scheduled_tokens.get(req_id, 0)
                request = self.requests.get(req_id)
                if request is None or request.is_finished():
                    continue
                if extra > 0:
                    request.num_computed_tokens += extra
                elif not sampled[idx] and request.num_computed_tokens >= request.num_tokens:
                    # A step that was due a token returned none: the kog runner discarded an aborted monokernel
                    # launch (launch_outcome.LaunchOutcome.aborted). The position is retaken by the next step
                    # (stock), as a rejected speculative token is; a partial prefill chunk (computed < num_tokens)
                    # is not this.
                    request.num_computed_tokens -= scheduler_output.num_scheduled_tokens.get(req_id, 0)
        return super().update_from_output(scheduler_output, model_runner_output)
