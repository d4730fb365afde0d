"""integration_tests/vllm_helpers.py: the kog options a test engine gets (KOG_TEST_KOG_OPTIONS under the test's own)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration_tests"))

from vllm_helpers import KOG_WORKER, kog_kwargs, kog_option_args  # noqa: E402


def test_env_options_apply_and_the_tests_own_win(monkeypatch):
    monkeypatch.setenv("KOG_TEST_KOG_OPTIONS", '{"run_ahead": true, "tokens_per_step": 8}')
    kw = kog_kwargs({"tokens_per_step": 1, "step_impl": "monokernel"}, max_model_len=1024)
    assert kw["additional_config"] == {"kog": {"run_ahead": True, "tokens_per_step": 1, "step_impl": "monokernel"}}
    assert kw["worker_cls"] == KOG_WORKER and kw["max_model_len"] == 1024
    assert kog_option_args() == ["--kog-options", '{"run_ahead": true, "tokens_per_step": 8}']


def test_no_env_options(monkeypatch):
    monkeypatch.delenv("KOG_TEST_KOG_OPTIONS", raising=False)
    assert kog_kwargs({"step_impl": "torch"})["additional_config"] == {"kog": {"step_impl": "torch"}}
    assert kog_kwargs()["additional_config"] == {"kog": {}}
    assert kog_option_args() == []


def test_env_options_must_be_an_object(monkeypatch):
    monkeypatch.setenv("KOG_TEST_KOG_OPTIONS", "[1]")
    with pytest.raises(ValueError, match="JSON object"):
        kog_kwargs()
