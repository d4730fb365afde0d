"""torch.ops.kog.monokernel_step and its typed arguments (csrc/monokernel_launch.h): the schema as registered and
as csrc/torch_bindings.cpp spells it, the argument classes and their methods, the checks their constructors make
without a GPU (values first, then CPU tensors refused with the device message), and how Monokernel.step /
generate map their keyword arguments onto the op (with stand-ins for the op and the classes)."""

from __future__ import annotations

import os
import re
import types

import pytest
import torch

from kog_backend import ops
from kog_backend.monokernel import layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINDINGS = os.path.join(ROOT, "csrc", "torch_bindings.cpp")
NEEDS_EXTENSION = pytest.mark.skipif(
    ops.load_reason() is not None, reason=f"extension not loadable: {ops.load_reason()}"
)

PLAN = "__torch__.torch.classes.kog.MonokernelLaunch"
SAMPLED = "__torch__.torch.classes.kog.SampledLaunch"
RUN_AHEAD = "__torch__.torch.classes.kog.RunAheadLaunch"
# (name, type, default or None, written by the kernel), in schema order.
WANT_ARGS = [
    ("plan", PLAN, None, False),
    ("input_ids", "Tensor", None, False),
    ("positions", "Tensor", None, False),
    ("block_table", "Tensor", None, False),
    ("slot_mapping", "Tensor", None, False),
    ("tokens_out", "Tensor", None, True),
    ("logits_out", "Tensor?", None, True),
    ("num_out", "Tensor?", None, True),
    ("stop_ids", "Tensor?", None, False),
    ("num_tokens", "int", None, False),
    ("sampling", SAMPLED + "?", "None", False),
    ("run_ahead", RUN_AHEAD + "?", "None", False),
    ("model_args", "Tensor?", "None", False),
]
# Constructor arguments (with their defaults, as the schema prints them) and read-only accessors of each class.
INIT = {
    "MonokernelLaunch": "Tensor model_args, Tensor scratch, int head_dim, int heads_per_pass, int grid, "
                        "int smem_bytes, int tp_size=1, bool fp8_weights=False, Tensor? burst_counts=None, bool moe=False",
    "SampledLaunch": "Tensor sample_seed, float temperature, int top_k=0, float top_p=1., float min_p=0., "
                     "Tensor? defer_out=None, Tensor? prompt_mask=None, Tensor? output_counts=None, "
                     "float repetition_penalty=1., float frequency_penalty=0., float presence_penalty=0.",
    "RunAheadLaunch": "Tensor? launch_gate=None, int gate_min=0, Tensor? cancel=None, int cancel_id=0",
}  # fmt: skip
METHODS = {
    "MonokernelLaunch": {"model_args": "Tensor", "scratch": "Tensor", "burst_counts": "Tensor?", "head_dim": "int",
                         "heads_per_pass": "int", "grid": "int", "smem_bytes": "int", "tp_size": "int",
                         "fp8_weights": "bool", "moe": "bool", "device": "Device"},
    "SampledLaunch": {"sample_seed": "Tensor", "temperature": "float", "top_k": "int", "top_p": "float",
                      "min_p": "float", "filtered": "bool", "defer_out": "Tensor?", "repetition_penalty": "float",
                      "frequency_penalty": "float", "presence_penalty": "float", "penalized": "bool",
                      "prompt_mask": "Tensor?", "output_counts": "Tensor?"},
    "RunAheadLaunch": {"launch_gate": "Tensor?", "gate_min": "int", "cancel": "Tensor?", "cancel_id": "int"},
}  # fmt: skip


def _source_schema() -> str:
    """The monokernel_step schema string of torch_bindings.cpp (its adjacent C string literals joined)."""
    src = open(BINDINGS).read()
    call = re.search(r'm\.def\(\s*("monokernel_step\(.*?)\);', src, re.S).group(1)
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', call))


def _source_args() -> list[tuple[str, str, str | None]]:
    schema = _source_schema()
    inner = re.fullmatch(r"monokernel_step\((.*)\) -> \(\)", schema).group(1)
    out = []
    for piece in inner.split(", "):
        typ, rest = piece.split(" ")
        name, _, default = rest.partition("=")
        out.append((name, typ, default or None))
    return out


def test_source_schema_is_the_typed_one():
    got = _source_args()
    assert [(n, re.sub(r"\(\w!\)", "", t), d) for n, t, d in got] == [(n, t, d) for n, t, d, _ in WANT_ARGS]
    assert [n for n, t, _ in got if "!" in t] == [n for n, _, _, w in WANT_ARGS if w]
    # every class the schema names is registered in the same TORCH_LIBRARY block, before the op
    src = open(BINDINGS).read()
    block = src[src.index("TORCH_LIBRARY(kog, m)") : src.index("TORCH_LIBRARY_IMPL(kog, CUDA, m)")]
    for cls in METHODS:
        assert block.index(f'm.class_<kog::{cls}>("{cls}")') < block.index('"monokernel_step(')


def test_schema_comment_names_the_tensors_the_kernel_writes_inside_the_classes():
    src = open(BINDINGS).read()
    comment = src[src.index("KOG-MONOKERNEL-DEFS") : src.index('m.class_<kog::MonokernelLaunch>')]
    for written in ("MonokernelLaunch.scratch", ".burst_counts", "SampledLaunch.defer_out"):
        assert written in comment


@NEEDS_EXTENSION
def test_registered_schema():
    schema = torch.ops.kog.monokernel_step.default._schema
    # torch prints an optional type as Optional[T] here; the schema string as T?
    got = [
        (a.name, re.sub(r"^Optional\[(.*)\]$", r"\1?", str(a.type)),
         str(a.default_value) if a.has_default_value() else None, a.alias_info is not None and a.alias_info.is_write)
        for a in schema.arguments
    ]  # fmt: skip
    assert got == WANT_ARGS
    assert len(schema.returns) == 0
    assert str(schema) == "kog::" + _source_schema()
    assert int(torch.ops.kog.version()) == ops.EXPECTED_VERSION


@NEEDS_EXTENSION
@pytest.mark.parametrize("cls", sorted(METHODS))
def test_argument_classes_exist_with_their_methods(cls):
    assert getattr(ops.classes(), cls) is not None
    this = f"__torch__.torch.classes.kog.{cls} _0"
    methods = {}
    for schema in torch._C._jit_get_custom_class_schemas():
        text = str(schema)
        if text.split("(", 1)[1].startswith(this):
            methods[schema.name] = text
    assert methods.pop("__init__") == f"__init__({this}, {INIT[cls]}) -> NoneType _0"
    assert methods == {name: f"{name}({this}) -> {ret} _0" for name, ret in METHODS[cls].items()}


def _cpu_plan(**over):
    kw = dict(
        model_args=torch.zeros(1, dtype=torch.uint8), scratch=torch.zeros(8, dtype=torch.bfloat16), head_dim=64,
        heads_per_pass=2, grid=132, smem_bytes=4096, tp_size=1, fp8_weights=False, burst_counts=None,
    )  # fmt: skip
    kw.update(over)
    return ops.classes().MonokernelLaunch(**kw)


@NEEDS_EXTENSION
@pytest.mark.parametrize(
    "over, needle",
    [
        ({"head_dim": 96}, r"head_dim 96 \(64 or 128 only\)"),
        ({"heads_per_pass": 3}, rf"heads_per_pass 3 \(2 or {layout.CONFIG['kHeadsPerPass']} only"),
        ({"tp_size": 0}, rf"tp_size 0 outside 1..{layout.CONFIG['kMaxTP']}"),
        ({"tp_size": layout.CONFIG["kMaxTP"] + 1}, rf"tp_size {layout.CONFIG['kMaxTP'] + 1} outside"),
        ({"grid": 0}, "bad launch shape grid=0"),
        ({"smem_bytes": 0}, "bad launch shape grid=132 smem=0"),
        ({"smem_bytes": layout.CONFIG["kMaxSmemBytes"] + 1}, f"smem={layout.CONFIG['kMaxSmemBytes'] + 1}"),
        ({"tp_size": 2, "burst_counts": torch.zeros(4, dtype=torch.int32)}, r"burst_counts .* needs tp_size 1"),
        ({"moe": True}, "the MoE kernel needs head_dim 128, heads_per_pass 4, tp_size 1 and bf16 weights, got head_dim 64"),
        ({"moe": True, "head_dim": 128, "heads_per_pass": 4, "fp8_weights": True}, "fp8_weights 1"),
        # every value right: the CPU tensors are refused, the table first
        ({}, "model_args must be on a CUDA device, got cpu"),
        ({"heads_per_pass": layout.CONFIG["kHeadsPerPass"], "head_dim": 128}, "model_args must be on a CUDA device"),
    ],
)
def test_plan_checks_its_values_once_when_built(over, needle):
    with pytest.raises(RuntimeError, match=needle):
        _cpu_plan(**over)


@NEEDS_EXTENSION
@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"temperature": -0.5}, "a sampled launch needs temperature >= 0, got -0.5"),
        ({"temperature": float("nan")}, "needs temperature >= 0"),
        ({"top_k": -1}, r"top_k -1 \(0 = off\)"),
        ({"top_p": 0.0}, r"top_p 0 outside \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p 1.5 outside"),
        ({"min_p": 1.5}, r"min_p 1.5 outside \[0, 1\]"),
        ({"top_k": 20}, "a launch with top-k / top-p / min-p needs defer_out"),
        ({"min_p": 0.1}, "needs defer_out"),
        ({"repetition_penalty": 0.0}, "repetition_penalty 0 must be > 0"),
        ({"frequency_penalty": 0.5}, "a launch with penalties needs prompt_mask and output_counts"),
        ({"presence_penalty": 0.5, "prompt_mask": torch.zeros(4, dtype=torch.int32)}, "needs prompt_mask and output"),
        ({}, "sample_seed must be on a CUDA device, got cpu"),
        ({"top_p": 0.9, "defer_out": torch.zeros(1, dtype=torch.int32)}, "sample_seed must be on a CUDA device"),
    ],
)
def test_sampled_launch_checks_its_values_once_when_built(kw, needle):
    args = {"sample_seed": torch.zeros(1, dtype=torch.int64), "temperature": 0.7, **kw}
    with pytest.raises(RuntimeError, match=needle):
        ops.classes().SampledLaunch(**args)


@NEEDS_EXTENSION
@pytest.mark.parametrize(
    "kw, needle",
    [
        ({}, "a run-ahead launch needs launch_gate or cancel"),
        ({"cancel": torch.zeros(1, dtype=torch.int64), "gate_min": 1 << 31}, "gate_min 2147483648 outside the int32"),
        ({"cancel": torch.zeros(1, dtype=torch.int64)}, r"cancel must be a pinned CPU int64 \[1\] tensor"),
        ({"cancel": torch.zeros(1, dtype=torch.int32)}, "cancel must be a pinned CPU int64"),
        ({"launch_gate": torch.zeros(1, dtype=torch.int32)}, "launch_gate must be on a CUDA device, got cpu"),
    ],
)
def test_run_ahead_launch_checks_its_values_once_when_built(kw, needle):
    with pytest.raises(RuntimeError, match=needle):
        ops.classes().RunAheadLaunch(**kw)


# ---- Monokernel.step / generate onto the op (stand-ins: no GPU) ----------------------------------------------------


class _Recorded:
    def __init__(self, cls: str, *args, **kwargs):
        self.cls, self.args, self.kwargs = cls, args, kwargs


def _fake_mk(monkeypatch):
    """A Monokernel with only what step / generate read, whose op binds its arguments by the source schema."""
    from kog_backend.monokernel import host

    names = [n for n, _, _ in _source_args()]
    required = [n for n, _, d in _source_args() if d is None]
    calls = []

    def monokernel_step(*args, **kwargs):
        assert len(args) <= len(names) and not set(kwargs) - set(names[len(args) :]), (len(args), kwargs)
        bound = dict(zip(names, args), **kwargs)
        assert set(required) <= set(bound), set(required) - set(bound)
        calls.append(bound)

    classes = types.SimpleNamespace(**{c: (lambda *a, _c=c, **k: _Recorded(_c, *a, **k)) for c in METHODS})
    monkeypatch.setattr(host.kog_ops, "classes", lambda: classes)
    mk = object.__new__(host.Monokernel)
    mk._classes = classes  # what __init__ looks up once
    mk.ops = types.SimpleNamespace(monokernel_step=monokernel_step)
    mk.launch = _Recorded("MonokernelLaunch")
    mk.device = torch.device("cpu")
    mk.logits_scratch = torch.zeros(100, dtype=torch.bfloat16)
    mk.burst_counts = torch.zeros(100, dtype=torch.int32)
    mk.sample_work = torch.zeros(1, dtype=torch.uint8)
    mk.plan = types.SimpleNamespace()
    monkeypatch.setattr(host.Monokernel, "filtered_sampling_reason", property(lambda self: None))
    return mk, calls


def test_step_passes_the_plan_and_the_table_override(monkeypatch):
    mk, calls = _fake_mk(monkeypatch)
    ids, pos, bt, slot = (torch.zeros(1, dtype=torch.int64) for _ in range(4))
    tok = mk.step(ids, pos, bt, slot)
    table = torch.zeros(8, dtype=torch.uint8)
    mk.step(ids, pos, bt, slot, tokens_out=tok, model_table=table)
    first, second = calls
    assert first["plan"] is mk.launch and first["num_tokens"] == 1 and first["tokens_out"] is tok
    assert first.get("model_args") is None and first.get("sampling") is None and first.get("run_ahead") is None
    assert second["model_args"] is table


def test_generate_builds_sampled_and_run_ahead_settings_only_when_asked(monkeypatch):
    mk, calls = _fake_mk(monkeypatch)
    ids, pos, bt, slot = (torch.zeros(1, dtype=torch.int64) for _ in range(4))
    stop = torch.zeros(2, dtype=torch.int64)
    tokens, count = mk.generate(ids, pos, bt, slot, 4, stop_ids=stop)
    greedy = calls[-1]
    assert greedy["plan"] is mk.launch and greedy["num_tokens"] == 4 and greedy["stop_ids"] is stop
    assert greedy["tokens_out"] is tokens and greedy["num_out"] is count
    assert greedy["sampling"] is None and greedy["run_ahead"] is None and greedy["model_args"] is None

    seed, defer = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    mask, counts = torch.zeros(4, dtype=torch.int32), torch.zeros(100, dtype=torch.int32)
    gate, word, table = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), torch.zeros(8)
    mk.generate(ids, pos, bt, slot, 4, sample_seed=seed, temperature=0.6, top_k=20, top_p=0.95, min_p=0.05,
                defer_out=defer, prompt_mask=mask, output_counts=counts, repetition_penalty=1.1,
                frequency_penalty=0.2, presence_penalty=0.3, launch_gate=gate, gate_min=3, cancel=word, cancel_id=7,
                model_table=table)  # fmt: skip
    call = calls[-1]
    s, r = call["sampling"], call["run_ahead"]
    assert s.cls == "SampledLaunch" and r.cls == "RunAheadLaunch" and call["model_args"] is table
    assert s.args == (seed, 0.6, 20, 0.95, 0.05, defer, mask, counts, 1.1, 0.2, 0.3) and s.kwargs == {}
    assert r.args == (gate, 3, word, 7) and r.kwargs == {}

    mk.generate(ids, pos, bt, slot, 2, cancel=word, cancel_id=9)
    assert calls[-1]["sampling"] is None and calls[-1]["run_ahead"].args == (None, 0, word, 9)
