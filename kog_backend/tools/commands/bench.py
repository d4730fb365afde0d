"""`kog bench`: stock vLLM against kog on one request; prints the table, writes JSON and a PNG.

Offline (default): for each --model (a checkpoint directory or an embedded shape, whose random-weight checkpoint
is written when missing), runs stock vLLM and then kog, each in its own process with identical settings.
vLLM's max_model_len follows the prompt (prompt + new tokens + slack, capped at the model's max_position_embeddings;
logged and printed in the header), so --prompt-len goes up to the model's context.
Sweep (--prompt-lens 2000,8000,...): the offline A/B at each length, one table, sweep.json and sweep.png of tok/s and
% of copy bandwidth (weights + KV bytes) against context length (bench/sweep.py).
HTTP (--url, once or twice): streams completions from live `vllm serve` servers, one request at a time.
Sampling: by default what a client that sets no sampling field gets, the model's generation config as vLLM applies
it; `--greedy` and the sampling flags choose otherwise; the header and the JSON say which settings were in force.
--also-greedy (offline, sweep too): each engine, after its timed rounds, times the same rounds greedy in the same
process; rows "<model> greedy" with their own counters, and the sampled kog row as a percentage of the greedy one
(bench/greedy_rounds.py). --dummy-weights (offline): an embedded shape's config and tokenizer only, both engines
with vLLM's load_format="dummy" (same bytes per token, meaningless tokens; bench/weights.py). A shape whose
checkpoint cannot be written (shapes.DUMMY_ONLY, or larger than the free disk) is refused, naming --dummy-weights.
--fp8 tensor|channel|block (offline, sweep too): each shape's FP8 checkpoint (`kog make-checkpoint --fp8`), stock
and kog; the header names the weight format and GB/s count the FP8 bytes; --also-bf16 adds kog on the shape's bf16
checkpoint and kog FP8 / kog bf16 under the table (bench/fp8.py).

Exit status: 0 every row measured (and every kog row ran the kog path); 1 a row failed, or a kog row's
counters show no kog step; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kog_backend.engine.cli_args import json_object
from kog_backend.config import DEFAULT_TOKENS_PER_STEP

DEFAULT_OUT = "kog-bench"
# What the main job measures on the kog side unless told otherwise: the monokernel with K tokens per engine step.
DEFAULT_KOG_OPTIONS = {"step_impl": "monokernel"}
DEFAULT_K = DEFAULT_TOKENS_PER_STEP  # the server default (config.py says how it was chosen)


def _positive(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{v} is not positive")
    return v


def _prompt_lens(text: str) -> list[int]:
    from kog_backend.tools.bench.sweep import parse_prompt_lens

    try:
        return parse_prompt_lens(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None and False (an option not given: its help says what that means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = _HelpFormatter
    g = p.add_argument_group("what to run")
    g.add_argument("--model", "--shape", dest="models", action="append", metavar="DIR_OR_SHAPE",
                   help="checkpoint directory or embedded shape name (repeatable; default llama-3.2-1b)")
    g.add_argument("--only", choices=("stock", "kog"), help="run one side only")
    g.add_argument("--tp", type=_positive, default=1, help="tensor-parallel size")
    g.add_argument("--engine-args", type=json_object, default={}, metavar="JSON",
                   help='extra vllm.LLM arguments for both sides, e.g. \'{"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}}\'')
    g.add_argument("--dummy-weights", action="store_true",
                   help="offline: write an embedded shape's config and tokenizer only (no weights) and run both engines "
                        "with vLLM's load_format=\"dummy\": same bytes per token as the real model (tok/s and GB/s "
                        "hold), meaningless tokens (not compared). Needed for shapes whose checkpoint does not fit the "
                        "disk (qwen3-32b, qwen2.5-coder-32b on 64 GB) or is never written (qwen3-30b-a3b); the bench "
                        "refuses those without it. --engine-args '{\"load_format\": \"dummy\"}' does the same")
    g.add_argument("--fp8", choices=("tensor", "channel", "block"), default=None, metavar="LAYOUT",
                   help="offline: run each shape's FP8 (e4m3) checkpoint, written when missing as `kog make-checkpoint "
                        "--fp8 LAYOUT` does (tensor: per-tensor scales, fp8 format; channel: per-channel, "
                        "compressed-tensors; block: 128x128 blocks, fp8 format), stock and kog; with --dummy-weights its "
                        "FP8 config only. Rows '<shape> fp8-LAYOUT'; GB/s and %% of copy bandwidth count the FP8 "
                        "bytes read (weights, scales, bf16 embedding row, LM head, norms, KV)")
    g.add_argument("--also-bf16", action="store_true",
                   help="with --fp8: kog also runs on the shape's bf16 checkpoint (rows '<shape> bf16'), and the table "
                        "ends with kog FP8 / kog bf16 tok/s of the same run")
    g.add_argument("--kog-options", type=json_object, default={}, metavar="JSON",
                   help='additional_config["kog"] options for the kog side, over the benchmark\'s defaults '
                        f'{json.dumps(DEFAULT_KOG_OPTIONS)} (the speed path; a server\'s default "auto" selects it '
                        'too, or turns kog off), e.g. \'{"run_ahead": false}\'')
    g = p.add_argument_group("request")
    g.add_argument("--prompt-len", type=_positive, default=32,
                   help="prompt length (random token ids); vLLM's max_model_len is set to fit it (prompt + new tokens "
                        "+ slack, capped at the model's max_position_embeddings; the header says which)")
    g.add_argument("--prompt-lens", type=_prompt_lens, default=None, metavar="N,N,...",
                   help="sweep: run stock and kog at each prompt length (e.g. 2000,8000,16000,32000,64000; 16k = "
                        "16000) and write one table, sweep.json and sweep.png of tok/s and %% of copy bandwidth "
                        "against context length (offline only; instead of --prompt-len)")
    g.add_argument("--new-tokens", type=_positive, default=512, help="tokens to generate (ignore_eos)")
    g.add_argument("--tokens-per-step", "-K", type=_positive, default=None, metavar="K",
                   help="kog: tokens generated per engine step (default: --kog-options' tokens_per_step if given, "
                        f"else kog's own default {DEFAULT_K}, which spreads vLLM's ~1.5 ms engine step over that many "
                        "tokens; docs/tuning.md says how it was chosen)")
    g = p.add_argument_group(
        "sampling",
        "By default the requests set no sampling field, as a client that sets none: vLLM applies the model's "
        "generation_config.json (Llama 3.x Instruct: temperature 0.6, top-p 0.9; Qwen3: temperature 0.6, top-k 20, "
        "top-p 0.95; none in the file: vLLM's temperature 1.0). The header and the JSON say which settings were in "
        "force. Each flag given overrides that field; --greedy is temperature 0.")
    g.add_argument("--greedy", action="store_true", help="greedy decoding (temperature 0), as a client that sends "
                   "temperature 0")
    g.add_argument("--temperature", type=float, default=None, help="instead of the generation config's (0 = greedy)")
    g.add_argument("--top-p", type=float, default=None, help="instead of the generation config's (1 = off)")
    g.add_argument("--top-k", type=int, default=None, help="instead of the generation config's (0 = off)")
    g.add_argument("--min-p", type=float, default=None, help="instead of the generation config's (0 = off)")
    g.add_argument("--repetition-penalty", type=float, default=None, help="instead of the generation config's (1 = off)")
    g.add_argument("--presence-penalty", type=float, default=None, help="0 = off (vLLM's default)")
    g.add_argument("--frequency-penalty", type=float, default=None, help="0 = off (vLLM's default)")
    g.add_argument("--seed", type=int, default=None, help="per-request sampling seed (default: none, as a client "
                   "that sets none)")
    g.add_argument("--also-greedy", action="store_true",
                   help="offline: each engine, after its timed rounds, times the same warm-up and reps greedy "
                        "(temperature 0, same prompt and new tokens) in the same process, so one run gives the "
                        "request's sampling and greedy without another engine start: rows '<model> greedy' with "
                        "their own kog counters, and the sampled kog tok/s as a percentage of the greedy kog tok/s "
                        "(not with --greedy or --temperature 0: the request is greedy already)")
    g = p.add_argument_group("measurement")
    g.add_argument("--reps", type=_positive, default=3, help="timed rounds (offline) ")
    g.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    g.add_argument("--stat", choices=("best", "median"), default="best", help="how repeated timings are reduced")
    g.add_argument("--timeout", type=float, default=900.0, help="seconds one engine's process may take (offline)")
    g.add_argument("--out", default=DEFAULT_OUT, help="directory for bench.json, bench.png and the engines' logs")
    g.add_argument("--no-chart", action="store_true", help="skip the PNG")
    g.add_argument("--commit", default=None, help="commit to record (default $KOG_COMMIT or git)")
    g.add_argument("--verbose", "-v", action="store_true", help="show the engines' output instead of logging it")
    g = p.add_argument_group("HTTP mode: live servers")
    g.add_argument("--url", dest="urls", action="append", metavar="URL",
                   help="base URL of a running `vllm serve` (give two to A/B them)")
    g.add_argument("--url2", dest="url2", default=None, metavar="URL", help="second server (same as a second --url)")
    g.add_argument("--label", dest="labels", action="append", help="name of each --url in the table (default A, B)")
    g.add_argument("--served-model", default=None, help="model name to request (default: the server's first)")
    g.add_argument("--requests", type=_positive, default=5, help="timed requests per server")
    g.add_argument("--max-token-id", type=_positive, default=1000, help="prompt token ids are drawn below this")
    g.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    g.add_argument("--wait-ready", type=float, default=0.0, metavar="S",
                   help="poll each server's /health for up to S seconds before the first request")


_GREEDY_IGNORES = ("temperature", "top_p", "top_k", "min_p")  # vLLM resets these at temperature 0


def sampling_overrides(args: argparse.Namespace) -> dict:
    """The sampling fields the bench sets itself (bench/sampling.py); ValueError for --greedy with a flag that
    greedy decoding ignores."""
    from kog_backend.tools.bench.sampling import FIELDS, overrides

    explicit = {k: getattr(args, k, None) for k in FIELDS}
    if args.greedy:
        clash = [f"--{k.replace('_', '-')}" for k in _GREEDY_IGNORES if explicit[k] is not None]
        if clash:
            raise ValueError(f"--greedy is temperature 0, which ignores {', '.join(clash)}")
    return overrides(args.greedy, **explicit)


def run(args: argparse.Namespace) -> int:
    try:
        args.sampling_overrides = sampling_overrides(args)
    except ValueError as e:
        print(f"kog bench: {e}", file=sys.stderr)
        return 2
    urls = list(args.urls or []) + ([args.url2] if args.url2 else [])
    refusal = _offline_flag_refusal(args, urls)
    if refusal:
        print(f"kog bench: {refusal}", file=sys.stderr)
        return 2
    if getattr(args, "prompt_lens", None):
        if urls:
            print("kog bench: --prompt-lens runs the offline engines; it does not take --url", file=sys.stderr)
            return 2
        sweep = _run_offline(args, prompt_lens=args.prompt_lens)
        return sweep if isinstance(sweep, int) else _write_sweep_outputs(sweep, args)
    if urls:
        report = _run_http(args, urls)
    else:
        report = _run_offline(args)
    if isinstance(report, int):
        return report
    return _write_outputs(report, args)


def _offline_flag_refusal(args: argparse.Namespace, urls: list[str]) -> str | None:
    """Why --also-greedy, --dummy-weights, --fp8 or --also-bf16 cannot run with the other arguments; None when they
    can."""
    from kog_backend.tools.bench import fp8, sampling

    refusal = fp8.refusal(getattr(args, "fp8", None), getattr(args, "also_bf16", False), args.only,
                          list(args.models or []), urls)
    if refusal:
        return refusal

    also_greedy, dummy = getattr(args, "also_greedy", False), getattr(args, "dummy_weights", False)
    if urls and (also_greedy or dummy):
        flag = "--also-greedy" if also_greedy else "--dummy-weights"
        return f"{flag} runs the offline engines; it does not take --url (a live server chose its own weights and rounds)"
    if also_greedy and sampling.is_greedy(args.sampling_overrides):
        return "--also-greedy adds greedy rounds to a sampled request; this request is greedy already (--greedy or --temperature 0)"
    return None  # --dummy-weights with another --engine-args load_format: run_offline refuses it (ValueError)


def _run_offline(args: argparse.Namespace, prompt_lens: list[int] | None = None):
    """One offline A/B (a BenchReport), or with prompt_lens the sweep (a SweepReport); an int: the exit status."""
    from kog_backend.tools.bench.offline import Settings, run_offline
    from kog_backend.config import KogConfig, KogConfigError
    from kog_backend.tools.fixtures.shapes import DEFAULT_SHAPE

    from kog_backend.tools.bench import weights

    kog_options = {**DEFAULT_KOG_OPTIONS, **args.kog_options}
    if getattr(args, "fp8", None):  # the FP8 kernel is opt-in (config.py fp8_weights): --fp8 benchmarks it
        kog_options.setdefault("fp8_weights", True)
    # -K wins over the options' tokens_per_step; without either, kog's default.
    k = args.tokens_per_step or kog_options.get("tokens_per_step") or DEFAULT_K
    kog = dict(kog_options, tokens_per_step=k)
    try:
        KogConfig.from_dict(kog)  # the kog engine would refuse it at start; say so before any engine runs
    except KogConfigError as e:
        print(f"kog bench: {e}", file=sys.stderr)
        return 2

    s = Settings(
        models=args.models or [DEFAULT_SHAPE],
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        tokens_per_step=k,
        greedy=args.greedy,
        sampling_overrides=args.sampling_overrides,
        sampling_seed=args.seed,
        tp=args.tp,
        reps=args.reps,
        warmup=args.warmup,
        stat=args.stat,
        only=args.only,
        out=args.out,
        engine_args=args.engine_args,
        kog_options=kog_options,
        timeout_s=args.timeout,
        verbose=args.verbose,
        commit=args.commit,
        also_greedy=getattr(args, "also_greedy", False),
        dummy_weights=weights.wants_dummy(getattr(args, "dummy_weights", False), args.engine_args),
        fp8=getattr(args, "fp8", None),
        also_bf16=getattr(args, "also_bf16", False),
    )
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        if prompt_lens:
            from kog_backend.tools.bench.sweep import run_sweep

            return run_sweep(s, prompt_lens, log=log)
        return run_offline(s, log=log)
    except ValueError as e:  # a model that is neither a checkpoint nor a shape, a prompt too long for it, a
        # checkpoint that cannot be written (weights.checkpoint_refusal), --dummy-weights with another load_format
        print(f"kog bench: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, FileExistsError) as e:  # the checkpoint could not be written
        print(f"kog bench: {e}", file=sys.stderr)
        return 1


def _run_http(args: argparse.Namespace, urls: list[str]):
    from kog_backend.tools.bench.http_client import HttpSettings, run_http

    if args.labels and len(args.labels) != len(urls):
        print(f"kog bench: {len(args.labels)} --label for {len(urls)} --url", file=sys.stderr)
        return 2
    s = HttpSettings(
        urls=urls,
        labels=args.labels,
        model=args.served_model,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        greedy=args.greedy,
        sampling_overrides=args.sampling_overrides,
        sampling_seed=args.seed,
        requests=args.requests,
        warmup=args.warmup,
        max_token_id=args.max_token_id,
        timeout_s=args.request_timeout,
        wait_ready_s=args.wait_ready,
    )
    report = run_http(s)
    if args.commit:
        report.commit = args.commit
    return report


def _write_outputs(report, args: argparse.Namespace) -> int:
    from kog_backend.tools.bench.table import format_table

    os.makedirs(args.out, exist_ok=True)
    stem = "bench" if report.kind == "offline" else "http"
    json_path = os.path.join(args.out, f"{stem}.json")
    report.save(json_path)
    print(format_table(report))
    print(f"\nJSON: {json_path}")
    if not args.no_chart:
        try:
            from kog_backend.tools.bench.chart import write_chart

            print(f"PNG:  {write_chart(report, os.path.join(args.out, f'{stem}.png'))}")
        except ImportError:
            print("PNG:  skipped (matplotlib is not installed: pip install 'kog-backend[bench]')")
    return exit_status(report)


def _write_sweep_outputs(sweep, args: argparse.Namespace) -> int:
    from kog_backend.tools.bench.sweep import format_sweep_table

    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "sweep.json")
    sweep.save(json_path)
    print(format_sweep_table(sweep))
    print(f"\nJSON: {json_path} (each length's bench.json and engine logs: {os.path.join(args.out, 'prompt-N')})")
    if not args.no_chart:
        try:
            from kog_backend.tools.bench.sweep_chart import write_sweep_chart

            print(f"PNG:  {write_sweep_chart(sweep, os.path.join(args.out, 'sweep.png'))}")
        except ImportError:
            print("PNG:  skipped (matplotlib is not installed: pip install 'kog-backend[bench]')")
    return max((exit_status(p) for p in sweep.points), default=1)


def exit_status(report) -> int:
    for m in report.models:
        for r in m.rows:
            if not r.ok:
                return 1
            if report.kind == "offline" and r.impl == "kog":
                if not r.counters or max(int(c.get("kog_steps", 0)) for c in r.counters) <= 0:
                    return 1
    return 0
