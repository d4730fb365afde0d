"""`kog doctor`: checks GPU architecture, driver, vLLM and torch versions, the extension, NCCL and P2P, then
lists what runs on the kog path and what falls back.

Exit status: 0 kog would run here (warnings allowed), 1 it would not (a check failed; on a machine without
a GPU the GPU check fails with "no GPU").
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the checks and features as JSON")
    p.add_argument("--skip-p2p", action="store_true", help="do not test peer-to-peer copies between GPUs")
    p.add_argument("--no-features", action="store_true", help="only the checks, not the feature table")


def run(args: argparse.Namespace) -> int:
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
