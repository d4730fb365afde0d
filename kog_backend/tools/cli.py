"""`kog` command. Each subcommand lives in kog_backend/tools/commands/<name>.py and provides
`add_arguments(parser)` and `run(args) -> int`; modules are imported only when their subcommand runs."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS = {
    "make-checkpoint": ("kog_backend.tools.commands.make_checkpoint", "write a random-weight checkpoint of a real model's shape"),
    "stats": ("kog_backend.tools.commands.stats", "print the kog path / fallback counters of running or finished servers"),
    "doctor": ("kog_backend.tools.commands.doctor", "check GPU, driver, vLLM, torch, the extension and P2P"),
    "bench": ("kog_backend.tools.commands.bench", "A/B benchmark: stock vLLM vs kog on one checkpoint"),
    "patch-vllm": ("kog_backend.tools.commands.patch_vllm", "check / apply / revert patches/ on the installed vLLM"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kog", description="kog_backend tools for vLLM")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
