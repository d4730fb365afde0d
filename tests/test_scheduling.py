"""Stock scheduling for a `--backend kog` server where kog will not run (kog_backend/engine/scheduling.py): the
start gate's verdict from the config, and the scheduler / async-scheduling setting put back."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from kog_backend import ops
from kog_backend.config import SCHEDULER_CLS
from kog_backend.engine import cli_args, scheduling
from kog_backend.path import gate


def _config(arch="LlamaForCausalLM", tp=1, kog=None, quantization=None, dtype=torch.bfloat16):
    pc = SimpleNamespace(pipeline_parallel_size=1, data_parallel_size=1, tensor_parallel_size=tp,
                         decode_context_parallel_size=1, prefill_context_parallel_size=1)
    hf = SimpleNamespace(architectures=[arch])
    mc = SimpleNamespace(dtype=dtype, runner_type="generate", hf_config=hf, quantization=quantization,
                         is_encoder_decoder=False, is_multimodal_model=False)
    return SimpleNamespace(
        additional_config={"kog": {"enabled": True, **(kog or {})}}, parallel_config=pc, model_config=mc,
        lora_config=None, speculative_config=None, cache_config=SimpleNamespace(cache_dtype="auto"),
        scheduler_config=SimpleNamespace(scheduler_cls=SCHEDULER_CLS, async_scheduling=True),
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _no_forced(monkeypatch):
    monkeypatch.setattr(scheduling, "_forced", None)
    monkeypatch.setattr(ops, "load_reason", lambda: None)  # the extension's presence is not what is tested here


@pytest.mark.parametrize(
    "kwargs, expect",
    [
        ({}, None),
        ({"arch": "GPT2LMHeadModel"}, "architectures ['GPT2LMHeadModel'] is not supported"),
        ({"arch": "Qwen2ForCausalLM"}, None),
        ({"quantization": "fp8"}, None),  # FP8 weights: the FP8 kernel, TP = 1 only
        ({"quantization": "fp8", "tp": 2, "kog": {"tp_monokernel": True}},
         "fp8 (tensor, quantised at load) weights at tensor parallelism 2: not on the kog path yet"),
        ({"quantization": "awq"}, "quantization_config awq: not supported"),
        ({"dtype": torch.float16}, "model dtype is not bf16 (torch.float16)"),
        ({"tp": 2}, "monokernel: tensor parallelism 2: the TP monokernel is off (kog option tp_monokernel"),
        ({"tp": 2, "kog": {"tp_monokernel": True}}, None),
        ({"kog": {"enabled": False}}, "disabled by configuration (--backend stock / kog.enabled=false)"),
    ],
)
def test_start_reason(kwargs, expect):
    """The gate's own reasons (kog_backend.path.gate), the same strings the worker counts."""
    reason = scheduling.start_reason(_config(**kwargs))
    if expect is None:
        assert reason is None
    else:
        assert reason is not None and expect in reason, reason
        assert gate.reason_key(reason) is not None, reason


def test_extension_missing_is_a_start_reason(monkeypatch):
    monkeypatch.setattr(ops, "load_reason", lambda: "kog_backend._C is not built")
    assert scheduling.start_reason(_config()) == "monokernel: kog_backend._C is not built"
    assert scheduling.start_reason(_config(kog={"step_impl": "torch"})) is None


@pytest.mark.parametrize("user_scheduler", [None, "my.Sched"])
def test_stock_scheduler_put_back_when_kog_will_not_run(user_scheduler):
    scheduling.record_forced(user_scheduler)
    cfg = _config(arch="GPT2LMHeadModel")
    assert scheduling.restore_stock_scheduling(cfg) is not None
    assert cfg.scheduler_config.scheduler_cls == user_scheduler
    assert cfg.scheduler_config.async_scheduling is True  # never kog's to change


def test_kog_scheduler_kept_when_kog_runs():
    scheduling.record_forced(None)
    cfg = _config()
    assert scheduling.restore_stock_scheduling(cfg) is None
    assert (cfg.scheduler_config.scheduler_cls, cfg.scheduler_config.async_scheduling) == (SCHEDULER_CLS, True)


def test_nothing_put_back_unless_kog_chose_the_scheduler():
    cfg = _config(arch="GPT2LMHeadModel")  # e.g. way 2: the user passed --scheduler-cls by hand
    assert scheduling.restore_stock_scheduling(cfg) is None
    assert cfg.scheduler_config.scheduler_cls == SCHEDULER_CLS


@pytest.mark.parametrize("user_async", [None, True, False])
def test_backend_kog_records_the_users_scheduler(user_async):
    ns = argparse.Namespace(backend="kog", worker_cls="auto", additional_config={}, scheduler_cls=None,
                            async_scheduling=user_async)  # fmt: skip
    cli_args.apply_backend_selection(ns)
    assert (ns.scheduler_cls, ns.async_scheduling) == (SCHEDULER_CLS, user_async)
    assert scheduling._forced == {"scheduler_cls": None}


def test_turned_off_is_per_engine_config_and_forgotten_with_it():
    import gc

    from kog_backend.engine import scheduling

    class Config:  # VllmConfig stands in: a mutable, unhashable object
        __hash__ = None

    a, b = Config(), Config()
    assert scheduling.turned_off_reason(a) is None
    scheduling.mark_turned_off(a, "kernel abort: a wait gave up")
    scheduling.mark_turned_off(a, "a later reason")  # the first reason stays
    assert scheduling.turned_off_reason(a) == "kernel abort: a wait gave up"
    assert scheduling.turned_off_reason(b) is None
    key = id(a)
    del a
    gc.collect()
    assert key not in scheduling._turned_off
