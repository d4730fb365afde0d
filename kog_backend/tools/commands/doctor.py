"""`kog doctor`: checks GPU architecture, driver, vLLM and torch versions, the extension, NCCL and P2P, then
lists what runs on the kog path and what falls back.

Exit status: 0 kog would run here (warnings allowed), 1 it would not (a check failed; on a machine without
a GPU the GPU check fails with "no GPU").

With --reasons it lists every reason the gate can return (what `kog stats` and /metrics may show) and exits 0.

With --model PATH_OR_NAME it checks that model instead (config.json only; no server, no GPU): 0 the kog path
would take it and it fits the --gpu card, 1 not, with the gate's reason.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the checks and features as JSON")
    p.add_argument("--skip-p2p", action="store_true", help="do not test peer-to-peer copies between GPUs")
    p.add_argument("--no-features", action="store_true", help="only the checks, not the feature table")
    p.add_argument("--reasons", action="store_true",
                   help="list every reason the gate can return (kog stats, /metrics), by level, and exit")
    p.add_argument("--model", metavar="PATH_OR_NAME",
                   help="would this model run on the kog path? A checkpoint directory, a Hugging Face id kog knows "
                        "(e.g. Qwen/Qwen2.5-Coder-7B-Instruct) or a make-checkpoint shape; reads config.json only")
    p.add_argument("--gpu", choices=("h100", "h200"), default="h100",
                   help="with --model: the card whose memory the model must fit (default h100, 80 GB)")
    p.add_argument("--tp", type=int, default=1, help="with --model: tensor-parallel ranks (default 1)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="with --model: vLLM's --gpu-memory-utilization (default 0.9)")


def run(args: argparse.Namespace) -> int:
    if args.model is not None:
        return _run_model(args)
    if args.reasons:
        return _run_reasons(args)
    from kog_backend.tools.doctor import features, report
    from kog_backend.tools.doctor.checks import exit_status, run_checks
    from kog_backend.tools.doctor.probe import Probe

    checks = run_checks(Probe(), p2p=not args.skip_p2p)
    sections = [] if args.no_features else features.sections()
    if args.json:
        print(report.to_json(checks, sections))
    else:
        print(report.format_checks(checks))
        if sections:
            print()
            print(report.format_features(sections))
    return exit_status(checks)


def _run_reasons(args: argparse.Namespace) -> int:
    import json

    from kog_backend.tools.doctor import features, report

    sections = features.reason_sections()
    print(json.dumps(dict(sections), indent=2) if args.json else report.format_features(sections))
    return 0


def _run_model(args: argparse.Namespace) -> int:
    import json

    from kog_backend.tools.doctor.model import model_report

    try:
        rep = model_report(args.model, gpu=args.gpu, tp_size=args.tp, utilization=args.gpu_memory_utilization)
    except (KeyError, ValueError, OSError) as e:
        print(f"kog doctor: {e.args[0] if e.args else e}")
        return 2
    print(json.dumps(rep.to_json(), indent=2) if args.json else "\n".join(rep.lines()))
    return 0 if rep.runs else 1
