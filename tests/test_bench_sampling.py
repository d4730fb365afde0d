"""`kog bench` sampling helpers (kog_backend/tools/bench/sampling.py): the fields set, what is named as in force, the
header's wording, on vLLM's own SamplingParams where it matters."""

from __future__ import annotations

import pytest

from kog_backend.tools.bench import sampling as S


def _params(**kw):
    from vllm import SamplingParams

    sp = SamplingParams(**kw)
    return {k: getattr(sp, k) for k in S.FIELDS}


def test_overrides():
    assert S.overrides() == {}
    assert S.overrides(greedy=True) == {"temperature": 0.0}
    assert S.overrides(temperature=0.8, top_p=None, top_k=20) == {"temperature": 0.8, "top_k": 20}
    with pytest.raises(ValueError, match="not a sampling field"):
        S.overrides(max_tokens=5)


def test_fields_and_neutral_values_are_vllms():
    from vllm import SamplingParams

    neutral = SamplingParams()
    assert {k: getattr(neutral, k) for k in S.FIELDS} == S.NEUTRAL


def test_in_force_and_describe_on_vllm_params():
    assert S.describe(_params(temperature=0.6, top_p=0.9)) == "temperature 0.6, top_p 0.9"
    assert S.describe(_params(temperature=0.6, top_p=0.95, top_k=20)) == "temperature 0.6, top_p 0.95, top_k 20"
    assert S.describe(_params()) == "temperature 1.0"
    # temperature 0: vLLM resets top-p / top-k / min-p; penalties still apply
    assert S.in_force(_params(temperature=0.0, top_p=0.9, top_k=20)) == {"temperature": 0.0}
    assert S.describe(_params(temperature=0.0, repetition_penalty=1.1)) == "greedy (repetition_penalty 1.1)"
    assert S.describe(_params(temperature=1.0, min_p=0.05, presence_penalty=1.5)) == (
        "temperature 1.0, min_p 0.05, presence_penalty 1.5")
    assert S.is_greedy({"temperature": 1e-6}) and not S.is_greedy({"temperature": 0.6})


def test_header_lines():
    gen = {"temperature": 0.6, "top_p": 0.9}
    rec = {"params": _params(**gen), "seed": None, "generation_config": gen}
    default = {"sampling": {"greedy": False, "overrides": {}, "seed": None}}
    assert S.header_lines(default, [("m", rec)], http=False) == [
        "sampling: model generation config: temperature 0.6, top_p 0.9; unseeded"]
    # a checkpoint whose generation config sets no sampling field: vLLM's temperature 1.0
    bare = {"params": _params(), "seed": None, "generation_config": {}}
    assert S.header_lines(default, [("m", bare)], http=False) == [
        "sampling: vLLM's defaults, no generation config sampling field in force: temperature 1.0; unseeded"]
    # no engine reported (both failed before the engine was up)
    assert "no engine reported" in S.header_lines(default, [("m", None)], http=False)[0]
    greedy = {"sampling": {"greedy": True, "overrides": {"temperature": 0.0}, "seed": 4}}
    rec_g = {"params": _params(temperature=0.0), "seed": 4, "generation_config": gen}
    assert S.header_lines(greedy, [("m", rec_g)], http=False) == ["sampling: greedy (--greedy); seed 4"]
    assert S.short_text(greedy, [("m", rec_g)], http=False) == "greedy"
    assert S.short_text(default, [("m", rec)], http=False) == "temperature 0.6, top_p 0.9 (generation config)"
    assert S.short_text(default, [], http=True) == "server defaults (generation config)"
