"""`--backend {stock,kog}` / `--kog-options` on vLLM's real serve parser, added through kog's platform hook.

Also the second way in (an unmodified vLLM with --worker-cls / additional_config, on the CLI and through LLM(...)).
Everything runs on the CPU: parsers and EngineArgs are built, no engine is started.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from kog_backend.engine.cli_args import KogSelectionError, add_backend_arguments, apply_backend_selection
from kog_backend.config import SCHEDULER_CLS, WORKER_CLS
from vllm_cli_helpers import import_kog_platform, parse_error, serve_parser, use_platform, vllm_cli_parser

KOG_ONLY = {"backend", "kog_options"}


@pytest.fixture(scope="module")
def parsers(request):
    """(stock, kog): vLLM's serve parser on vLLM's CPU platform, and on KogCudaPlatform (over a CPU stand-in)."""
    from vllm.platforms.cpu import CpuPlatform

    with pytest.MonkeyPatch.context() as mp:
        use_platform(mp, CpuPlatform())
        stock = serve_parser()
        kog_platform = import_kog_platform(mp, request).KogCudaPlatform
        use_platform(mp, kog_platform())
        kog = serve_parser()
    return stock, kog


@pytest.fixture
def stock(parsers):
    return parsers[0]


@pytest.fixture
def kog(parsers):
    return parsers[1]


def engine_args(namespace):
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(namespace)


def fields(args) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}


# --- the flags exist, through the platform hook --------------------------------------------------------------


def test_platform_hook_adds_the_flags(stock, kog):
    kog_opts = kog._option_string_actions
    assert "--backend" in kog_opts and "--kog-options" in kog_opts
    assert kog_opts["--backend"].choices == ("stock", "kog")
    assert "--backend" not in stock._option_string_actions
    assert "--backend" in kog.format_help() or "kog" in kog.format_help()


# --- without the flag, nothing changes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["m"],
        ["m", "--backend", "stock"],
        ["m", "--max-num-seqs", "4", "--additional-config", '{"x": {"y": 1}}'],
        ["m", "--additional-config.kog.tokens_per_step", "4", "--additional-config.z", "1"],
        ["m", "--worker-cls", "my.pkg.Worker", "-O0"],
        ["m", "--worker-cls", WORKER_CLS, "--additional-config", '{"kog": {"step_impl": "torch"}}'],
    ],
)
def test_without_backend_kog_the_engine_args_are_identical(stock, kog, argv):
    stock_argv = [a for a in argv if a not in ("--backend", "stock")]
    plain = stock.parse_args(stock_argv)
    with_kog = kog.parse_args(argv)
    assert {k: v for k, v in vars(with_kog).items() if k not in KOG_ONLY} == vars(plain)
    assert fields(engine_args(with_kog)) == fields(engine_args(plain))


def test_without_kog_flags_the_namespace_is_exactly_vllms(stock, kog):
    assert vars(kog.parse_args(["m", "-tp", "2"])) == vars(stock.parse_args(["m", "-tp", "2"]))


def test_parsed_defaults_are_not_mutated(kog):
    kog.parse_args(["m", "--backend", "kog", "--kog-options", '{"tokens_per_step": 2}'])
    assert kog.parse_args(["m"]).additional_config == {}


# --- --backend kog -------------------------------------------------------------------------------------------


def test_backend_kog_selects_the_worker_and_config(kog):
    ns = kog.parse_args(["m", "--backend", "kog"])
    assert ns.worker_cls == WORKER_CLS
    assert ns.additional_config == {"kog": {"enabled": True}}
    args = engine_args(ns)
    assert args.worker_cls == WORKER_CLS and args.additional_config == {"kog": {"enabled": True}}
    assert not hasattr(args, "backend")


@pytest.mark.parametrize("kog_first", [True, False])
def test_backend_kog_keeps_user_additional_config_in_any_order(kog, kog_first):
    user = ["--additional-config", '{"other": {"a": 1}, "kog": {"step_impl": "torch"}}']
    flag = ["--backend", "kog"]
    ns = kog.parse_args(["m", *(flag + user if kog_first else user + flag)])
    assert ns.additional_config == {"other": {"a": 1}, "kog": {"step_impl": "torch", "enabled": True}}


def test_backend_kog_with_dotted_additional_config(kog):
    # FlexibleArgumentParser re-appends dotted arguments after all others.
    ns = kog.parse_args(["m", "--additional-config.kog.tokens_per_step", "4", "--backend", "kog",
                         "--additional-config.z", "1"])
    assert ns.additional_config == {"kog": {"tokens_per_step": 4, "enabled": True}, "z": 1}


def test_backend_kog_multi_token_selects_the_scheduler(kog):
    ns = kog.parse_args(["m", "--backend", "kog", "--kog-options", '{"tokens_per_step": 8}'])
    args = engine_args(ns)
    assert args.scheduler_cls == SCHEDULER_CLS and args.async_scheduling is None  # vLLM's default: async on
    default = engine_args(kog.parse_args(["m", "--backend", "kog"]))  # the default K (32) needs it too
    assert default.scheduler_cls == SCHEDULER_CLS and default.async_scheduling is None
    one = engine_args(kog.parse_args(["m", "--backend", "kog", "--kog-options", '{"tokens_per_step": 1}']))
    assert one.scheduler_cls == SCHEDULER_CLS  # K = 1 too: an aborted launch's position is retaken


def test_backend_kog_default_k_yields_to_the_users_scheduler(kog):
    # Not asked for K > 1: the user's scheduler stays, and the worker runs 1 token per step.
    ns = kog.parse_args(["m", "--backend", "kog", "--scheduler-cls", "my.Sched"])
    assert engine_args(ns).scheduler_cls == "my.Sched"


@pytest.mark.parametrize("flag,want", [("--async-scheduling", True), ("--no-async-scheduling", False)])
def test_backend_kog_keeps_the_users_async_scheduling(kog, flag, want):
    # KogScheduler is vLLM's async scheduler: either setting runs K-token steps.
    for opts in ("{}", '{"tokens_per_step": 8}'):
        args = engine_args(kog.parse_args(["m", "--backend", "kog", "--kog-options", opts, flag]))
        assert args.scheduler_cls == SCHEDULER_CLS and args.async_scheduling is want


def test_backend_kog_multi_token_refuses_another_scheduler(kog, capsys):
    err = parse_error(kog, ["m", "--backend", "kog", "--kog-options", '{"tokens_per_step": 8}',
                            "--scheduler-cls", "my.Sched"], capsys)
    assert "my.Sched" in err and SCHEDULER_CLS in err


def test_backend_kog_forces_enabled(kog):
    ns = kog.parse_args(["m", "--backend", "kog", "--additional-config", '{"kog": {"enabled": false}}'])
    assert ns.additional_config["kog"]["enabled"] is True


def test_backend_kog_with_explicit_kog_worker_is_fine(kog):
    ns = kog.parse_args(["m", "--worker-cls", WORKER_CLS, "--backend", "kog"])
    assert ns.worker_cls == WORKER_CLS


@pytest.mark.parametrize("kog_first", [True, False])
def test_backend_kog_refuses_another_worker(kog, capsys, kog_first):
    argv = ["--backend", "kog", "--worker-cls", "my.pkg.Worker"]
    err = parse_error(kog, ["m", *(argv if kog_first else argv[2:] + argv[:2])], capsys)
    assert "--worker-cls my.pkg.Worker" in err and "--backend kog" in err


def test_unknown_backend_is_refused(kog, capsys):
    err = parse_error(kog, ["m", "--backend", "kogg"], capsys)
    assert "--backend" in err and "kogg" in err and "'kog'" in err


# --- --kog-options -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options_first", [True, False])
def test_kog_options_merge_and_win_over_additional_config(kog, options_first):
    opts = ["--kog-options", '{"tokens_per_step": 8}']
    rest = ["--backend", "kog", "--additional-config", '{"kog": {"tokens_per_step": 2, "step_impl": "torch"}}']
    ns = kog.parse_args(["m", *(opts + rest if options_first else rest + opts)])
    assert ns.additional_config == {"kog": {"tokens_per_step": 8, "step_impl": "torch", "enabled": True}}


def test_kog_options_dotted_form(kog):
    ns = kog.parse_args(["m", "--backend", "kog", "--kog-options.tokens_per_step", "8"])
    assert ns.additional_config["kog"]["tokens_per_step"] == 8


@pytest.mark.parametrize(
    "text, message",
    [
        ("{tokens_per_step: 8}", "not valid JSON"),
        ("[8]", "JSON object"),
        ('{"tokens_per_stp": 8}', "tokens_per_stp"),
        ('{"tokens_per_step": 0}', "tokens_per_step"),
        ('{"step_impl": "cuda"}', "step_impl"),
    ],
)
def test_bad_kog_options_are_refused(kog, capsys, text, message):
    err = parse_error(kog, ["m", "--backend", "kog", "--kog-options", text], capsys)
    assert "--kog-options" in err and message in err


def test_bad_kog_entry_in_additional_config_is_refused(kog, capsys):
    err = parse_error(kog, ["m", "--backend", "kog", "--additional-config", '{"kog": {"tokens_per_step": -1}}'],
                      capsys)
    assert "tokens_per_step" in err
    err = parse_error(kog, ["m", "--backend", "kog", "--additional-config", '{"kog": 3}'], capsys)
    assert "JSON object" in err


def test_kog_options_need_the_kog_backend(kog, capsys):
    err = parse_error(kog, ["m", "--kog-options", '{"tokens_per_step": 8}'], capsys)
    assert "--backend kog" in err
    err = parse_error(kog, ["m", "--backend", "stock", "--kog-options", "{}"], capsys)
    assert "--backend kog" in err


# --- --backend stock as rollback of way 2, and way 2 as typed -------------------------------------------------


def test_backend_stock_switches_kog_worker_off(kog):
    ns = kog.parse_args(["m", "--worker-cls", WORKER_CLS, "--backend", "stock",
                         "--additional-config", '{"kog": {"tokens_per_step": 4}, "x": 1}'])
    assert ns.worker_cls == WORKER_CLS
    assert ns.additional_config == {"kog": {"tokens_per_step": 4, "enabled": False}, "x": 1}


def test_way2_with_kog_options_merges(kog):
    ns = kog.parse_args(["m", "--worker-cls", WORKER_CLS, "--kog-options", '{"tokens_per_step": 4}'])
    assert ns.additional_config == {"kog": {"tokens_per_step": 4}}


def test_way2_bad_options_are_caught_at_parse_time(kog, capsys):
    err = parse_error(kog, ["m", "--worker-cls", WORKER_CLS, "--additional-config", '{"kog": {"nope": 1}}'],
                      capsys)
    assert "nope" in err


# --- the hook on `vllm serve` as the vllm CLI builds it (a subparser) ------------------------------------------


def test_vllm_cli_serve_subcommand(monkeypatch, request, capsys):
    kog_platform = import_kog_platform(monkeypatch, request).KogCudaPlatform
    use_platform(monkeypatch, kog_platform())
    cli = vllm_cli_parser()
    ns = cli.parse_args(["serve", "m", "--kog-options", '{"tokens_per_step": 4}', "--backend", "kog", "-tp", "1"])
    assert ns.subparser == "serve" and ns.model_tag == "m"
    assert ns.worker_cls == WORKER_CLS
    assert ns.additional_config == {"kog": {"tokens_per_step": 4, "enabled": True}}
    err = parse_error(cli, ["serve", "m", "--backend", "nope"], capsys)
    assert "invalid choice" in err
    plain = cli.parse_args(["serve", "m"])
    assert plain.worker_cls == "auto" and plain.additional_config == {}


def test_pre_register_and_update_without_parser_is_a_no_op(monkeypatch, request):
    # EngineArgs.create_engine_config calls it with no parser.
    import_kog_platform(monkeypatch, request).KogCudaPlatform.pre_register_and_update()


def test_bench_throughput_keeps_its_own_backend_flag(monkeypatch, request):
    # `vllm bench throughput` has `--backend {vllm,hf,...}` and also calls AsyncEngineArgs.add_cli_args: kog must
    # not collide with it (argparse would raise a conflict for every `vllm` command, since all parsers are built).
    from vllm.benchmarks import throughput
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    kog_platform = import_kog_platform(monkeypatch, request).KogCudaPlatform
    use_platform(monkeypatch, kog_platform())
    parser = FlexibleArgumentParser()
    throughput.add_cli_args(parser)
    assert "--kog-options" not in parser._option_string_actions
    ns = parser.parse_args(["--backend", "hf", "--model", "m"])
    assert ns.backend == "hf" and ns.worker_cls == "auto"


def test_every_vllm_subcommand_builds_with_the_kog_platform(monkeypatch, request):
    # vllm.entrypoints.cli.main builds every subcommand's parser before parsing: one conflicting flag anywhere
    # would break every `vllm` command.
    import vllm.entrypoints.cli.benchmark.main
    import vllm.entrypoints.cli.collect_env
    import vllm.entrypoints.cli.launch
    import vllm.entrypoints.cli.openai
    import vllm.entrypoints.cli.run_batch
    import vllm.entrypoints.cli.serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    kog_platform = import_kog_platform(monkeypatch, request).KogCudaPlatform
    use_platform(monkeypatch, kog_platform())
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    names = []
    for module in (vllm.entrypoints.cli.openai, vllm.entrypoints.cli.serve, vllm.entrypoints.cli.launch,
                   vllm.entrypoints.cli.benchmark.main, vllm.entrypoints.cli.collect_env,
                   vllm.entrypoints.cli.run_batch):
        for cmd in module.cmd_init():
            cmd.subparser_init(subparsers)
            names.append(cmd.name)
    assert {"serve", "bench", "run-batch"} <= set(names)
    assert parser.parse_args(["serve", "m", "--backend", "kog"]).worker_cls == WORKER_CLS


# --- the translation itself ------------------------------------------------------------------------------------


def test_add_backend_arguments_is_re_entrant():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-cls", default="auto")
    parser.add_argument("--additional-config", type=json.loads, default={})
    assert add_backend_arguments(parser) is True
    assert add_backend_arguments(parser) is True
    ns = parser.parse_args(["--backend", "kog"])
    assert ns.worker_cls == WORKER_CLS


def test_apply_is_idempotent():
    ns = argparse.Namespace(backend="kog", kog_options={"tokens_per_step": 3}, worker_cls="auto",
                            additional_config={"a": 1})
    apply_backend_selection(ns)
    first = dict(vars(ns))
    apply_backend_selection(ns)
    assert vars(ns) == first
    assert ns.additional_config == {"a": 1, "kog": {"tokens_per_step": 3, "enabled": True}}


def test_apply_refuses_unknown_backend_from_direct_callers():
    with pytest.raises(KogSelectionError):
        apply_backend_selection(argparse.Namespace(backend="x", kog_options=None, worker_cls="auto",
                                                   additional_config={}))


# --- way 2 on an unmodified vLLM ------------------------------------------------------------------------------


def test_way2_cli_on_unmodified_vllm(stock):
    ns = stock.parse_args(["m", "--worker-cls", WORKER_CLS, "--additional-config", '{"kog": {"tokens_per_step": 2}}'])
    args = engine_args(ns)
    assert args.worker_cls == WORKER_CLS and args.additional_config == {"kog": {"tokens_per_step": 2}}


def test_way2_offline_llm_passes_worker_and_config_to_engine_args(monkeypatch):
    import vllm.entrypoints.llm as llm_module

    captured = {}

    class Stop(Exception):
        pass

    def from_engine_args(engine_args, usage_context=None):
        captured["args"] = engine_args
        raise Stop

    monkeypatch.setattr(llm_module.LLMEngine, "from_engine_args", staticmethod(from_engine_args))
    with pytest.raises(Stop):
        llm_module.LLM(model="m", worker_cls=WORKER_CLS, additional_config={"kog": {"tokens_per_step": 2}})
    args = captured["args"]
    assert args.worker_cls == WORKER_CLS
    assert args.additional_config == {"kog": {"tokens_per_step": 2}}
