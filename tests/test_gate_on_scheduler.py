"""The step gate on what vLLM's real scheduler (KogScheduler, CPU) emits: a chunked prefill's chunks run stock
except a final chunk of one token, a prefix-cache hit's first step runs stock and its decode steps on the kog path,
and bursts keep every later decode step eligible."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from test_scheduler import BLOCK, K, _num_slots, checkpoint, make_scheduler  # noqa: E402,F401 (fixtures)

from kog_backend.path import eligibility  # noqa: E402
from kog_backend.path.eligibility import STEP_REASONS  # noqa: E402


_NONE_HASH_SET = []


def _request(req_id, prompt_len, **sp_kwargs):
    """A request of prompt ids 100, 101, ...: equal prompts hash to equal blocks (the none-hash is drawn once per
    process, as EngineCore does; test_scheduler's helper draws it per request)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    if not _NONE_HASH_SET:
        init_none_hash(sha256)
        _NONE_HASH_SET.append(True)
    return Request(req_id, list(range(100, 100 + prompt_len)), SamplingParams(**sp_kwargs), None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def _gated_step(sched, prompt_lens, tokens):
    """Schedules one step, asks the gate as the runner does (every request known and supported), then feeds back
    `tokens` (list per request) as the step's output. Returns (scheduler output, gate reason)."""
    from vllm.v1.outputs import ModelRunnerOutput

    so = sched.schedule()
    ids = list(so.num_scheduled_tokens)
    reason = eligibility.step_unsupported_reason(so, {r: None for r in ids}, prompt_lens=prompt_lens)
    out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                            sampled_token_ids=[list(tokens.get(r, [])) for r in ids])
    sched.update_from_output(so, out)
    return so, reason


@pytest.mark.parametrize("prompt_len,chunk", [(33, 16), (40, 16), (3, 1)])
def test_chunked_prefill(make_scheduler, prompt_len, chunk):
    """Chunks of `chunk` tokens: every chunk but a final one-token chunk is a prefill; the final one-token chunk
    (the prompt's last token, whose logits give the first output) and every decode step after it are eligible."""
    s = make_scheduler()
    s.max_num_scheduled_tokens = chunk
    s.add_request(_request("a", prompt_len, max_tokens=20, ignore_eos=True))
    lens, reasons, computed = {"a": prompt_len}, [], 0
    while computed < prompt_len:
        so, reason = _gated_step(s, lens, {"a": [7] if computed + chunk >= prompt_len else []})
        n = so.num_scheduled_tokens["a"]
        reasons.append((n, reason))
        computed += n
    *earlier, (last_n, last_reason) = reasons
    assert all(r == STEP_REASONS["prefill"] for _, r in earlier), reasons
    assert last_reason == (None if last_n == 1 else STEP_REASONS["prefill"]), reasons
    # The last chunk's step already held the look-ahead slots of a burst from the prompt's last position.
    assert _num_slots(s, "a") >= prompt_len - 1 + K
    if chunk == 1:  # one-token chunks before the last are prefills, not decodes
        assert [r for _, r in reasons] == [STEP_REASONS["prefill"]] * (prompt_len - 1) + [None]
    for burst in ([8], [9, 10, 11, 12], [13]):  # decode steps, one a burst of K (KogScheduler's accounting)
        so, reason = _gated_step(s, lens, {"a": burst})
        assert so.num_scheduled_tokens == {"a": 1} and reason is None


def test_prefix_cache_hit(make_scheduler):
    """A second request whose prompt repeats the first's: vLLM schedules it as a new request with the cached blocks
    computed (a hit), which the gate sends to stock (prefill); its decode steps are eligible."""
    s = make_scheduler()
    assert s.cache_config.enable_prefix_caching
    s.add_request(_request("a", 40, max_tokens=2, ignore_eos=True))
    _gated_step(s, {"a": 40}, {"a": [7]})
    _gated_step(s, {"a": 40}, {"a": [8]})  # finishes a (max_tokens 2): its full blocks stay in the prefix cache
    s.add_request(_request("b", 40, max_tokens=10, ignore_eos=True))
    so, reason = _gated_step(s, {"b": 40}, {"b": [7]})
    (new,) = so.scheduled_new_reqs
    assert new.num_computed_tokens == 32, "two full 16-position blocks of the prompt were a prefix-cache hit"
    assert so.num_scheduled_tokens == {"b": 8} and reason == STEP_REASONS["prefill"]
    for burst in ([8, 9, 10, 11], [12]):
        so, reason = _gated_step(s, {"b": 40}, {"b": burst})
        assert reason is None and so.scheduled_cached_reqs.num_computed_tokens[0] >= 40


def test_a_hit_of_the_whole_prompt_recomputes_its_last_token(make_scheduler):
    """A prompt of whole blocks cached entirely: vLLM recomputes its last token as a new request's one-token step
    (stock: the runner adds the request in that step); decoding follows on the kog path."""
    s = make_scheduler()
    s.add_request(_request("a", 32, max_tokens=1, ignore_eos=True))
    _gated_step(s, {"a": 32}, {"a": [7]})
    s.add_request(_request("b", 32, max_tokens=5, ignore_eos=True))
    so, reason = _gated_step(s, {"b": 32}, {"b": [7]})
    assert so.scheduled_new_reqs and so.scheduled_new_reqs[0].num_computed_tokens >= 16
    assert reason == STEP_REASONS["prefill"]
    so, reason = _gated_step(s, {"b": 32}, {"b": [8]})
    assert reason is None and so.scheduled_cached_reqs.num_computed_tokens == [32]
