"""KogScheduler on vLLM's real scheduler objects (CPU): look-ahead KV slots for a lone request, and the accounting
of a step that returns several tokens for one scheduled token, with vLLM's own stop checks trimming the burst."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

BLOCK = 16
K = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from kog_backend.tools.fixtures.checkpoints import write_checkpoint

    out = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    write_checkpoint("tiny-llama", str(out), seed=0, device="cpu")
    return str(out)


@pytest.fixture
def make_scheduler(checkpoint, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from kog_backend.engine.scheduler import KogScheduler

    def make(tokens_per_step=K, num_blocks=64, run_ahead=False, step_impl="auto", async_scheduling=False):
        mc = ModelConfig(model=checkpoint, max_model_len=512, dtype="bfloat16", skip_tokenizer_init=True)
        sc = SchedulerConfig.default_factory(
            max_model_len=512, max_num_seqs=8, max_num_batched_tokens=2048, async_scheduling=async_scheduling,
            scheduler_cls="kog_backend.engine.scheduler.KogScheduler",
        )
        vc = VllmConfig(
            model_config=mc, cache_config=CacheConfig(block_size=BLOCK), scheduler_config=sc,
            device_config=DeviceConfig(device="cpu"),
            additional_config={
                "kog": {"tokens_per_step": tokens_per_step, "run_ahead": run_ahead, "step_impl": step_impl},
            },
        )
        vc.cache_config.num_gpu_blocks = num_blocks
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
        kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
        return KogScheduler(vllm_config=vc, kv_cache_config=kvc, structured_output_manager=StructuredOutputManager(vc),
                            block_size=BLOCK)

    return make


def _request(req_id, prompt_len, **sp_kwargs):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)  # what EngineCore does with prefix caching on (vLLM's default)
    sp = SamplingParams(**sp_kwargs)
    return Request(req_id, list(range(100, 100 + prompt_len)), sp, None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def _output(so, tokens_by_req):
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[list(tokens_by_req.get(r, [])) for r in ids])


def _step(sched, tokens_by_req):
    so = sched.schedule()
    sched.update_from_output(so, _output(so, tokens_by_req))
    return so


def _num_slots(sched, req_id):
    return len(sched.kv_cache_manager.get_block_ids(req_id)[0]) * BLOCK


def test_lone_request_reserves_look_ahead_and_takes_a_burst(make_scheduler):
    s = make_scheduler()
    r = _request("a", 31, max_tokens=100, ignore_eos=True)
    s.add_request(r)
    _step(s, {"a": [7]})  # prefill: 31 prompt tokens, first output token
    assert r.num_computed_tokens == 31
    so = _step(s, {"a": [8, 9, 10, 11]})  # decode at position 31, burst of K
    assert so.num_scheduled_tokens == {"a": 1} and not so.scheduled_spec_decode_tokens
    # Slots for positions 31 .. 31+K-1 were allocated before the step.
    assert _num_slots(s, "a") >= 31 + K
    assert r.num_computed_tokens == 31 + K  # every position whose K/V the burst wrote
    assert list(r.output_token_ids) == [7, 8, 9, 10, 11]
    so = _step(s, {"a": [12]})  # a short burst (e.g. capped by max_tokens) is fine too
    assert r.num_computed_tokens == 31 + K + 1 and list(r.output_token_ids)[-1] == 12


def test_no_look_ahead_with_two_requests(make_scheduler):
    s = make_scheduler()
    a, b = _request("a", 31, max_tokens=50, ignore_eos=True), _request("b", 31, max_tokens=50, ignore_eos=True)
    s.add_request(a)
    s.add_request(b)
    _step(s, {"a": [7], "b": [7]})
    _step(s, {"a": [8], "b": [8]})  # a batched decode step: position 31, no look-ahead -> 32 slots, 2 blocks
    assert _num_slots(s, "a") == 32 and _num_slots(s, "b") == 32
    assert a.num_computed_tokens == b.num_computed_tokens == 32


@pytest.mark.parametrize(
    "sp_kwargs,burst,want,reason",
    [
        (dict(max_tokens=100, ignore_eos=True, stop_token_ids=[9]), [8, 9, 10, 11], [7, 8, 9], "stop"),
        (dict(max_tokens=3, ignore_eos=True), [8, 9, 10, 11], [7, 8, 9], "length"),
    ],
)
def test_stops_trim_the_burst(make_scheduler, sp_kwargs, burst, want, reason):
    from vllm.v1.request import RequestStatus

    s = make_scheduler()
    r = _request("a", 20, **sp_kwargs)
    s.add_request(r)
    _step(s, {"a": [7]})
    _step(s, {"a": burst})
    assert list(r.output_token_ids) == want
    assert r.status == (RequestStatus.FINISHED_STOPPED if reason == "stop" else RequestStatus.FINISHED_LENGTH_CAPPED)


def test_k_one_is_vllms_scheduler(make_scheduler):
    s = make_scheduler(tokens_per_step=1)
    r = _request("a", 31, max_tokens=10, ignore_eos=True)
    s.add_request(r)
    _step(s, {"a": [7]})
    _step(s, {"a": [8]})
    assert s.kog_lookahead == 0 and _num_slots(s, "a") == 32 and r.num_computed_tokens == 32


def test_run_ahead_reserves_two_bursts(make_scheduler):
    """With run_ahead, a lone request's decode step holds slots for its burst and the run-ahead burst behind it
    (positions 31 .. 31 + 2K - 1); the accounting is unchanged."""
    s = make_scheduler(run_ahead=True)
    assert s.kog_lookahead == 2 * K - 1
    r = _request("a", 31, max_tokens=100, ignore_eos=True)
    s.add_request(r)
    _step(s, {"a": [7]})
    _step(s, {"a": [8, 9, 10, 11]})
    assert _num_slots(s, "a") >= 31 + 2 * K and r.num_computed_tokens == 31 + K
    assert make_scheduler(tokens_per_step=1, run_ahead=True).kog_lookahead == 0
    # The torch step never runs ahead (nor does TP > 1): one burst's slots only.
    assert make_scheduler(run_ahead=True, step_impl="torch").kog_lookahead == K - 1


@pytest.mark.parametrize("tokens_per_step", [K, 1])
def test_a_step_with_no_token_is_retaken(make_scheduler, tokens_per_step):
    # An aborted monokernel launch reports no token (LaunchOutcome.aborted): the position is scheduled
    # again, with the same input token, and the request goes on as if the step had not happened.
    s = make_scheduler(tokens_per_step=tokens_per_step)
    r = _request("a", 31, max_tokens=100, ignore_eos=True)
    s.add_request(r)
    _step(s, {"a": [7]})
    so = _step(s, {"a": []})  # the aborted step at position 31
    assert so.num_scheduled_tokens == {"a": 1}
    assert r.num_computed_tokens == 31 and list(r.output_token_ids) == [7] and not r.is_finished()
    so = _step(s, {"a": [8]})  # retaken (stock): position 31 again
    assert so.num_scheduled_tokens == {"a": 1}
    assert r.num_computed_tokens == 32 and list(r.output_token_ids) == [7, 8]
    _step(s, {"a": [9]})
    assert r.num_computed_tokens == 33 and list(r.output_token_ids) == [7, 8, 9]


def test_a_partial_prefill_chunk_is_not_retaken(make_scheduler):
    # A prefill chunk that is not the last returns no token by design: nothing to retake.
    s = make_scheduler()
    s.max_num_scheduled_tokens = 16  # chunked prefill of a 40-token prompt
    r = _request("a", 40, max_tokens=10, ignore_eos=True)
    s.add_request(r)
    so = _step(s, {"a": []})
    assert so.num_scheduled_tokens == {"a": 16} and r.num_computed_tokens == 16


# Async scheduling (vLLM's engine with its batch queue of two steps): the engine schedules the next step before it
# takes the current one's output, and takes the oldest output once two are queued.


def test_async_lone_request_waits_for_its_burst(make_scheduler):
    s = make_scheduler(async_scheduling=True)
    r = _request("a", 31, max_tokens=100, ignore_eos=True)
    s.add_request(r)
    _step(s, {"a": [7]})  # prefill
    burst = s.schedule()  # decode at position 31: may be a burst
    assert burst.num_scheduled_tokens == {"a": 1} and s.kog_step_in_flight is burst
    empty = s.schedule()  # scheduled while the burst is in flight: nothing (vLLM's engine then takes the burst)
    assert empty.total_num_scheduled_tokens == 0 and not empty.num_scheduled_tokens
    s.update_from_output(burst, _output(burst, {"a": [8, 9, 10, 11]}))
    s.update_from_output(empty, _output(empty, {}))
    assert s.kog_step_in_flight is None
    assert r.num_computed_tokens == 31 + K and r.num_output_placeholders == 0
    assert list(r.output_token_ids) == [7, 8, 9, 10, 11]
    nxt = s.schedule()  # from the burst's last token, at position 31 + K
    assert nxt.num_scheduled_tokens == {"a": 1} and r.num_computed_tokens == 31 + K + 1


def test_async_batches_are_scheduled_ahead(make_scheduler):
    s = make_scheduler(async_scheduling=True)
    a, b = _request("a", 31, max_tokens=50, ignore_eos=True), _request("b", 31, max_tokens=50, ignore_eos=True)
    s.add_request(a)
    s.add_request(b)
    _step(s, {"a": [7], "b": [7]})
    first = s.schedule()
    second = s.schedule()  # a batch in flight does not hold the next one back
    assert first.num_scheduled_tokens == second.num_scheduled_tokens == {"a": 1, "b": 1}
    assert s.kog_step_in_flight is None and a.num_output_placeholders == 2
    s.update_from_output(first, _output(first, {"a": [8], "b": [8]}))
    s.update_from_output(second, _output(second, {"a": [9], "b": [9]}))
    assert a.num_computed_tokens == 33 and a.num_output_placeholders == 0 and list(a.output_token_ids) == [7, 8, 9]


def test_async_aborted_burst_is_retaken(make_scheduler):
    s = make_scheduler(async_scheduling=True)
    r = _request("a", 31, max_tokens=100, ignore_eos=True)
    s.add_request(r)
    _step(s, {"a": [7]})
    so = s.schedule()
    s.update_from_output(so, _output(so, {"a": []}))  # the aborted launch: no token
    assert r.num_computed_tokens == 31 and r.num_output_placeholders == 0 and list(r.output_token_ids) == [7]
    so = s.schedule()  # position 31 again
    assert so.num_scheduled_tokens == {"a": 1} and r.num_computed_tokens == 32


def test_async_engine_that_never_takes_the_burst_fails_visibly(make_scheduler):
    from kog_backend.engine.scheduler import MAX_EMPTY_BEHIND

    s = make_scheduler(async_scheduling=True)
    s.add_request(_request("a", 31, max_tokens=100, ignore_eos=True))
    _step(s, {"a": [7]})
    s.schedule()
    for _ in range(MAX_EMPTY_BEHIND):
        assert s.schedule().total_num_scheduled_tokens == 0
    with pytest.raises(RuntimeError, match="in flight"):
        s.schedule()


def test_async_scheduling_is_stock_once_the_worker_turns_kog_off(make_scheduler):
    from kog_backend.engine import scheduling

    s = make_scheduler(async_scheduling=True)
    r = _request("a", 31, max_tokens=100, ignore_eos=True)
    s.add_request(r)
    _step(s, {"a": [7]})
    scheduling.mark_turned_off(s.vllm_config, "a kernel abort")
    first = s.schedule()
    second = s.schedule()  # scheduled ahead of the first's token, as vLLM's async scheduler does
    assert first.num_scheduled_tokens == second.num_scheduled_tokens == {"a": 1}
    assert s.kog_step_in_flight is None and s.num_lookahead_tokens == 0 and r.num_output_placeholders == 2
    assert scheduling.turned_off_reason(make_scheduler(async_scheduling=True).vllm_config) is None  # this engine only


class _FakeRunner:
    """The worker side of vLLM's engine loop for KogScheduler: each scheduled token is computed at the position the
    scheduler says (asserted to be the request's next position, as the V2 runner's own state has it), a lone
    request's decode step returns a burst of up to K tokens (the kog path), every other step one token per
    request whose prompt is complete. The token computed at position p is token(req, p) = 1000 + 10 * index + p."""

    def __init__(self, k, abort_from=None, turn_off=None):
        self.k = k
        self.abort_from = abort_from  # the first lone step at a position >= this aborts: no token
        self.aborted = 0
        self.turn_off = turn_off  # called at the abort, as the kog runner turns kog off then; later steps are stock
        self.empty_after_off = 0  # steps with no token scheduled while a request was running, after turn_off
        self.next_pos: dict[str, int] = {}
        self.prompt: dict[str, int] = {}
        self.max_tokens: dict[str, int] = {}
        self.pending = None
        self.bursts = 0

    @staticmethod
    def token(req_id, p):
        return 1000 + 10 * int(req_id[1:]) + p

    def execute_model(self, so, non_block=True):
        from concurrent.futures import Future

        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

        for new in so.scheduled_new_reqs:
            self.next_pos[new.req_id] = new.num_computed_tokens
            self.prompt[new.req_id] = len(new.prompt_token_ids)
            self.max_tokens[new.req_id] = new.sampling_params.max_tokens
        fut = Future()
        if so.total_num_scheduled_tokens == 0:
            self.empty_after_off += self.turn_off is not None and self.aborted > 0
            fut.set_result(EMPTY_MODEL_RUNNER_OUTPUT)
            return fut
        cached = so.scheduled_cached_reqs
        tokens = {}
        lone = len(so.num_scheduled_tokens) == 1 and not so.scheduled_new_reqs
        for rid, n in so.num_scheduled_tokens.items():
            if rid in cached.req_ids:
                assert cached.num_computed_tokens[cached.req_ids.index(rid)] == self.next_pos[rid], rid
            p0 = self.next_pos[rid]
            end = p0 + n  # positions computed: p0 .. end - 1
            if end < self.prompt[rid]:
                out = []  # a prefill chunk before the prompt's last token
            elif lone and n == 1 and not self.aborted and self.abort_from is not None and p0 >= self.abort_from:
                self.aborted += 1  # an aborted launch: nothing computed
                out, end = [], p0
                if self.turn_off is not None:
                    self.turn_off()
            elif lone and n == 1 and not (self.turn_off is not None and self.aborted):  # the kog path: a burst
                outputs_so_far = p0 - self.prompt[rid] + 1
                k = max(1, min(self.k, self.max_tokens[rid] - outputs_so_far))
                out = [self.token(rid, p0 + 1 + j) for j in range(k)]
                end = p0 + k
                self.bursts += k > 1
            else:
                out = [self.token(rid, end)]
            self.next_pos[rid] = end
            tokens[rid] = out
        self.pending = (so, tokens)
        fut.set_result(None)
        return fut

    def sample_tokens(self, grammar_output, non_block=True):
        from concurrent.futures import Future

        from vllm.v1.outputs import ModelRunnerOutput

        so, tokens = self.pending
        ids = list(so.num_scheduled_tokens)
        fut = Future()
        fut.set_result(ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                         sampled_token_ids=[tokens[r] for r in ids]))
        return fut


def _engine(sched, runner):
    """vLLM's EngineCore with only what step_with_batch_queue reads: its real loop, a batch queue of two steps."""
    import collections
    import queue

    from vllm.v1.engine.core import EngineCore

    engine = object.__new__(EngineCore)
    engine.scheduler, engine.model_executor = sched, runner
    engine.batch_queue_size = 2
    engine.batch_queue = collections.deque(maxlen=2)
    engine.is_ec_consumer, engine.is_pooling_model = True, False
    engine.aborts_queue = queue.Queue()
    engine.log_stats, engine.check_for_draft_tokens, engine.async_scheduling = False, False, True
    engine.vllm_config = sched.vllm_config
    return engine


def _run_engine_loop(sched, runner, arrivals):
    """Requests r0, r1, ... added at the engine-loop iterations `arrivals`, run to their end through vLLM's
    step_with_batch_queue; asserts that each request's tokens are those of its consecutive positions."""
    engine = _engine(sched, runner)
    reqs = [_request(f"r{i}", 20 + 3 * i, max_tokens=30 + 10 * i, ignore_eos=True) for i in range(len(arrivals))]
    added, loops = 0, 0
    while added < len(reqs) or sched.has_requests() or engine.batch_queue:
        while added < len(reqs) and arrivals[added] <= loops:
            sched.add_request(reqs[added])
            added += 1
        if sched.has_requests() or engine.batch_queue:
            engine.step_with_batch_queue()
        loops += 1
        assert loops < 500, "the engine loop did not finish"
    for r in reqs:
        prompt = len(r.prompt_token_ids)
        assert list(r.output_token_ids) == [runner.token(r.request_id, prompt + j) for j in range(r.max_tokens)]


@pytest.mark.parametrize("k", [K, 1])
@pytest.mark.parametrize("arrivals", [[0], [0, 0], [0, 3], [0, 3, 4, 20]])
def test_async_engine_loop_tokens_follow_positions(make_scheduler, arrivals, k):
    """vLLM's own step_with_batch_queue driving KogScheduler: lone requests take bursts (K > 1), requests arriving
    later batch with them, a lone step's launch aborts once (no token: retaken), and every request's tokens are those
    of consecutive positions (no position skipped, repeated or computed from a token still in flight)."""
    s = make_scheduler(tokens_per_step=k, async_scheduling=True)
    runner = _FakeRunner(k, abort_from=25)
    _run_engine_loop(s, runner, arrivals)
    assert (runner.bursts > 0) == (k > 1) and runner.aborted == 1


@pytest.mark.parametrize("arrivals", [[0], [0, 3]])
def test_async_engine_loop_after_the_worker_turns_kog_off(make_scheduler, arrivals):
    """As above, with the runner turning kog off at the aborted launch (as the kog runner does): the position is
    retaken, every later step is stock, tokens still follow positions, and lone requests are scheduled ahead again.
    Empty steps after the abort: 3 here (behind the aborted launch, in flight when kog turned off, and where a
    request has every token it may get already scheduled), 17-23 when the scheduler is not told (one per token: each
    lone step waits for the previous one's output)."""
    from kog_backend.engine import scheduling

    s = make_scheduler(tokens_per_step=K, async_scheduling=True)
    runner = _FakeRunner(K, abort_from=25, turn_off=lambda: scheduling.mark_turned_off(s.vllm_config, "abort"))
    _run_engine_loop(s, runner, arrivals)
    assert runner.aborted == 1 and not s.kog_enabled
    assert runner.empty_after_off <= 3, runner.empty_after_off


@pytest.mark.parametrize("k", [K, 1])
@pytest.mark.parametrize("arrivals", [[0], [0, 2]])
def test_async_engine_loop_with_chunked_prefill(make_scheduler, arrivals, k):
    """Prompts longer than the step's token budget (16: 20- and 23-token prompts in two chunks): vLLM schedules a
    prompt's next chunk before the previous chunk's output (no token) comes back, so computed >= num_tokens there
    although nothing was aborted; KogScheduler adjusts only kog steps' outputs, and every request's tokens follow
    their positions (once the retake of a chunk's empty output broke vLLM's placeholder count)."""
    s = make_scheduler(tokens_per_step=k, async_scheduling=True)
    s.max_num_scheduled_tokens = 16
    runner = _FakeRunner(k, abort_from=25)
    _run_engine_loop(s, runner, arrivals)
    assert runner.aborted == 1


def test_reset_prefix_cache_during_a_burst_leaves_vllms_counts(make_scheduler):
    """vLLM preempts a running request when the prefix cache is reset with reset_running_requests while its burst is
    in flight, and discards that step's tokens: KogScheduler then adds nothing for the burst, so the request resumes
    from position 0 with no placeholder left, as under stock scheduling."""
    s = make_scheduler(async_scheduling=True)
    r = _request("a", 31, max_tokens=100, ignore_eos=True)
    s.add_request(r)
    _step(s, {"a": [7]})
    burst = s.schedule()
    assert s.reset_prefix_cache(reset_running_requests=True)
    s.update_from_output(burst, _output(burst, {"a": [8, 9, 10, 11]}))
    assert r.num_computed_tokens == 0 and r.num_output_placeholders == 0, (r.num_computed_tokens,
                                                                          r.num_output_placeholders)
