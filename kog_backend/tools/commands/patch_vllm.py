"""`kog patch-vllm`: check, apply or revert patches/ on the installed vLLM (see kog_backend/engine/patches.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kog_backend.engine import patches


def add_arguments(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report drift and applicability (the default)")
    mode.add_argument("--apply", action="store_true", help="apply every diff patch that is not applied yet")
    mode.add_argument("--revert", action="store_true", help="revert every applied diff patch")
    p.add_argument("--root", type=Path, default=None,
                   help="directory holding the vllm package (default: where `import vllm` finds it)")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (FileNotFoundError, RuntimeError) as e:  # no patches/ (not a checkout), no GNU patch, no vllm
        print(f"kog patch-vllm: {e}")
        return 1


def _run(args: argparse.Namespace) -> int:
    root = args.root or patches.vllm_site_root()
    print(f"vLLM at {root / 'vllm'}")
    failed = False
    for entry in patches.PATCHES:
        state = "hook"
        if entry.kind == "diff":
            state, output = patches.diff_state(entry, root)
            if args.apply and state == "applicable":
                result = patches.apply(entry, root)
                state = "applied" if result.returncode == 0 else "conflict"
                output = result.stdout + result.stderr
            elif args.revert and state == "applied":
                result = patches.revert(entry, root)
                state = "applicable" if result.returncode == 0 else "conflict"
                output = result.stdout + result.stderr
            if state == "conflict":
                failed = True
                print(output.rstrip())
        problems = patches.check_targets(entry, root, patched=(state == "applied"))
        failed |= bool(problems)
        print(f"{entry.name:28s} {state:10s} {'symbols match' if not problems else 'DRIFT'}")
        for problem in problems:
            print(f"    {problem}")
    return 1 if failed else 0
