"""Several tokens per engine step on the kog path (tokens_per_step K > 1, KogScheduler).

Oracle chain: kog at K > 1 must equal kog at K = 1 token for token (the same per-token computation, only the
number of engine steps differs), and kog at K = 1 agrees with stock under teacher forcing
(test_teacher_forcing.py). Stops (stop ids, stop strings, max_tokens) must land exactly where K = 1 lands.
"""

from __future__ import annotations

import json
import os

import pytest

from vllm_helpers import (
    engine_kwargs,
    first_mismatch,
    kog_kwargs,
    kog_stats,
    random_prompts,
    run_in_spawned_child,
    token_ids,
)

pytestmark = pytest.mark.vllm_gpu

SHAPE = os.environ.get("KOG_TEST_SHAPE", "llama-3.2-1b")
KS = (1, 4, 16, 32, 64)  # 32: kog's default (config.py); 64: the largest
SCHEDULER = "kog_backend.engine.scheduler.KogScheduler"
IMPL = os.environ.get("KOG_TEST_IMPL", "torch")  # run again with KOG_TEST_IMPL=monokernel
# Further kog options for every engine of the module, a JSON object (e.g. '{"moe_kernel": true}' with a MoE shape).
OPTIONS = json.loads(os.environ.get("KOG_TEST_OPTIONS", "{}"))


def multi_kwargs(k: int, options=None, **over):
    """Engine arguments for K tokens per step; `options`: further kog options (they may override step_impl)."""
    # Every K schedules synchronously (K > 1 requires it; for K = 1 it is vLLM's async default in production):
    # with async scheduling the K = 1 engine has scheduled the first request's next token before a test adds the
    # second, which would then join one token later than in the K > 1 run.
    extra = dict(scheduler_cls=SCHEDULER) if k > 1 else {}
    kog = {"tokens_per_step": k, "step_impl": IMPL, **OPTIONS, **(options or {})}
    return kog_kwargs(kog, async_scheduling=False, **extra, **over)


@pytest.fixture(scope="module")
def engines(checkpoint):
    from vllm import LLM

    path = checkpoint(SHAPE)
    return {k: LLM(model=path, **multi_kwargs(k, gpu_memory_utilization=0.15)) for k in KS}


def _greedy(max_tokens, **kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


@pytest.mark.parametrize("max_tokens", [512, 17, 1])
def test_greedy_identical_for_every_k(engines, max_tokens):
    vocab = engines[1].llm_engine.model_config.get_vocab_size()
    prompts = random_prompts(2, [32, 3], vocab, seed=21)
    for p in prompts:
        outs = {}
        for k, llm in engines.items():
            before = kog_stats(llm)
            outs[k] = token_ids(llm.generate([p], _greedy(max_tokens, ignore_eos=True)))[0]
            after = kog_stats(llm)
            assert len(outs[k]) == max_tokens
            steps = after["kog_steps"] - before["kog_steps"]
            # Prefill gives the first token; bursts of up to K give the rest.
            assert steps == -(-(max_tokens - 1) // k), (k, steps)
            assert after["kog_tokens"] - before["kog_tokens"] == max_tokens - 1
        for k in KS[1:]:
            assert outs[k] == outs[1], f"K={k}: first mismatch at {first_mismatch(outs[k], outs[1])}"


def test_stop_token_mid_burst(engines):
    vocab = engines[1].llm_engine.model_config.get_vocab_size()
    prompt = random_prompts(1, [24], vocab, seed=22)
    free = token_ids(engines[1].generate(prompt, _greedy(64, ignore_eos=True)))[0]
    # The first token not seen before index >= 6, so that the stop lands inside a burst of every K > 1.
    stop_at = next(i for i in range(6, len(free)) if free[i] not in free[:i] and i % 4 != 0)
    stop_id = free[stop_at]
    for k, llm in engines.items():
        out = llm.generate(prompt, _greedy(64, ignore_eos=True, stop_token_ids=[stop_id]))[0].outputs[0]
        assert list(out.token_ids) == free[: stop_at + 1], k
        assert out.finish_reason == "stop"


def _with_eos(src: str, dst, eos_id: int) -> str:
    """A view of checkpoint `src` (files linked) whose generation config also names `eos_id` as an EOS token."""
    import json

    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name != "generation_config.json":
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
    with open(os.path.join(src, "generation_config.json")) as f:
        gen = json.load(f)
    old = gen.get("eos_token_id")
    gen["eos_token_id"] = ([] if old is None else [old] if isinstance(old, int) else list(old)) + [eos_id]
    with open(os.path.join(dst, "generation_config.json"), "w") as f:
        json.dump(gen, f)
    return str(dst)


def _eos_child(queue, path, kwargs, prompt, max_tokens):
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, **kwargs)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0].outputs[0]
    stats = kog_stats(llm)
    queue.put((list(out.token_ids), out.finish_reason, stats))


def test_eos_mid_burst(engines, checkpoint, tmp_path):
    """EOS (here: an id the model's generation config names, not ignored) ends a K = 32 burst exactly where K = 1
    ends (the module's oracle chain: stock's free-running greedy tokens may part from kog's at a bf16 near-tie of
    the random weights, so stock is compared under teacher forcing in test_teacher_forcing.py, not here). Each
    engine of the EOS checkpoint runs in a spawned child, next to the module's engines."""
    import json

    src = checkpoint(SHAPE)
    vocab = engines[1].llm_engine.model_config.get_vocab_size()
    prompt = random_prompts(1, [26], vocab, seed=24)[0]
    free = token_ids(engines[1].generate([prompt], _greedy(64, ignore_eos=True)))[0]
    with open(os.path.join(src, "generation_config.json")) as f:
        old = json.load(f).get("eos_token_id")
    old_eos = set([] if old is None else [old] if isinstance(old, int) else old)
    limit = next((i for i, t in enumerate(free) if t in old_eos), len(free))  # the checkpoint's own EOS comes first
    stop_at = next(i for i in range(6, limit) if free[i] not in free[:i] and i % 4 != 0)
    path = _with_eos(src, tmp_path / "eos", free[stop_at])
    want = free[: stop_at + 1]
    kw = dict(gpu_memory_utilization=0.06, max_model_len=1024)
    for k in (1, 32):
        got, reason, stats = run_in_spawned_child(_eos_child, path, multi_kwargs(k, **kw), prompt, 64)
        assert got == want and reason == "stop", (k, first_mismatch(got, want), reason)
        assert stats["kog_steps"] > 0 and (k == 1 or stats["kog_tokens"] > stats["kog_steps"]), (k, stats)


def _staggered_child(queue, path, kwargs, prompts, max_tokens, first_tokens_before_second):
    """One engine, in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): each LLMEngine.step() then runs exactly one
    engine step, so the second request joins after a known number of the first's tokens. (With the engine core in
    its own process, the core keeps stepping while the client reads outputs: the arrival point is a race.)"""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, **kwargs)
    eng = llm.llm_engine
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    eng.add_request("r1", prompts[0], sp)
    produced = {"r1": [], "r2": []}
    joined_at = None
    while eng.has_unfinished_requests():
        for out in eng.step():
            produced[out.request_id] = list(out.outputs[0].token_ids)
        if joined_at is None and len(produced["r1"]) >= first_tokens_before_second:
            eng.add_request("r2", prompts[1], sp)
            joined_at = len(produced["r1"])
    worker = eng.engine_core.engine_core.model_executor.driver_worker.worker
    queue.put((produced, joined_at, worker.kog_stats()))


def test_staggered_second_request(checkpoint):
    """A second request arrives mid-burst: both requests' tokens equal those of K = 1 with the second request
    arriving after the same number of the first request's tokens. No token lost, duplicated or reordered.
    (Each engine runs in a spawned child with the engine core in-process; see _staggered_child.)"""
    path = checkpoint(SHAPE)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    prompts = random_prompts(2, [20, 28], vocab, seed=23)
    # K=16: prefill step (1 token), then one burst (16 tokens): the second request arrives after 17 tokens.
    kw = dict(gpu_memory_utilization=0.25)
    kog16, joined16, stats16 = run_in_spawned_child(_staggered_child, path, multi_kwargs(16, **kw), prompts, 80, 17)
    ref, joined1, stats1 = run_in_spawned_child(_staggered_child, path, multi_kwargs(1, **kw), prompts, 80, 17)
    assert joined16 == joined1 == 17, (joined16, joined1)
    assert stats16["kog_tokens"] >= 16 and stats16["fallbacks"].get("batch of several requests", 0) > 0, stats16
    assert kog16["r1"] == ref["r1"], first_mismatch(kog16["r1"], ref["r1"])
    assert kog16["r2"] == ref["r2"], first_mismatch(kog16["r2"], ref["r2"])
    assert len(kog16["r1"]) == 80 and len(kog16["r2"]) == 80


def test_stop_string_mid_burst(checkpoint):
    """Stop strings are the detokenizer's: the text must end exactly where K = 1 ends it."""
    from vllm import LLM, SamplingParams

    path = checkpoint("tiny-llama")
    one = LLM(model=path, **multi_kwargs(1, gpu_memory_utilization=0.08, max_model_len=1024))
    sixteen = LLM(model=path, **multi_kwargs(16, gpu_memory_utilization=0.08, max_model_len=1024))
    prompt = "The quick brown fox"
    free = one.generate([prompt], SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))[0].outputs[0].text
    assert len(free) > 30, free
    stop = free[18:22]
    assert stop.strip(), free
    want = one.generate([prompt], SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, stop=[stop]))[0].outputs[0]
    got = sixteen.generate([prompt], SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert got.text == want.text and got.finish_reason == want.finish_reason == "stop"
    assert stop not in got.text


def test_prompts_that_fill_max_model_len(checkpoint):
    """Bursts stop at max_model_len: prompts 1, 2, 9 and 40 tokens short of it (max_tokens 100) and max_tokens 1
    end where K = 1 and stock end them (same count, finish reason "length", K = 32's tokens equal K = 1's), with
    the default options (run-ahead, for which KogScheduler reserves 2K - 1 look-ahead slots)."""
    from vllm import LLM

    path = checkpoint("tiny-llama")
    n = 256
    small = dict(gpu_memory_utilization=0.06, max_model_len=n)
    stock = LLM(model=path, **engine_kwargs(async_scheduling=False, **small))
    one = LLM(model=path, **multi_kwargs(1, **small))
    k32 = LLM(model=path, **multi_kwargs(32, **small))
    vocab = stock.llm_engine.model_config.get_vocab_size()
    for plen, max_tokens in ((n - 1, 100), (n - 2, 100), (n - 9, 100), (n - 40, 100), (20, 1)):
        prompt = random_prompts(1, [plen], vocab, seed=plen)[0]
        outs = {name: llm.generate([prompt], _greedy(max_tokens, ignore_eos=True))[0].outputs[0]
                for name, llm in (("stock", stock), ("k1", one), ("k32", k32))}  # fmt: skip
        want = min(max_tokens, n - plen)
        for name, o in outs.items():
            got = (len(o.token_ids), o.finish_reason)
            assert got == (want, "length"), (plen, name, got)
        a, b = list(outs["k32"].token_ids), list(outs["k1"].token_ids)
        assert a == b, (plen, first_mismatch(a, b))
    stats = kog_stats(k32)
    assert stats["kog_tokens"] > stats["kog_steps"] > 0, stats  # the 40-short prompt ran bursts of several tokens
