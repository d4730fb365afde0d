"""The docs against the code: every `kog` command in them parses, every file they name exists, and the
operator guide lists every option and every fallback reason the code has."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex

import pytest

from kog_backend import eligibility
from kog_backend.cli import build_parser
from kog_backend.config import KogConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [p for p in [os.path.join(ROOT, "README.md")] if os.path.exists(p)]


def _code_lines(path: str) -> list[str]:
    """Shell lines of ```bash blocks, continuation lines joined."""
    text = open(path).read()
    out = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
        block = block.replace("\\\n", " ")
        out += [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    return out


def _kog_invocations(line: str) -> list[list[str]]:
    """argv of each `kog ...` in a shell line (also inside $(...)), up to a shell operator or comment."""
    found = []
    line = re.sub(r"\$\((?!\s*kog\b)[^()]*\)", "SUBST", line)  # other command substitutions: one word
    for m in re.finditer(r"(?:^|\$\(|;|&&|\|\|)\s*kog\s+([^;&|)#]*)", line):
        found.append(shlex.split(m.group(1)))
    return found


def _all_kog_commands():
    cmds = []
    for path in DOCS:
        for line in _code_lines(path):
            for argv in _kog_invocations(line):
                cmds.append(pytest.param(argv, id=f"{os.path.basename(path)}: kog {' '.join(argv)}"[:120]))
    return cmds


KOG_COMMANDS = _all_kog_commands()


def test_docs_have_kog_commands():
    assert len(KOG_COMMANDS) >= 10


@pytest.mark.parametrize("argv", KOG_COMMANDS)
def test_kog_command_in_docs_parses(argv):
    build_parser().parse_args(argv)  # argparse exits (fails the test) on an unknown subcommand or option


def test_files_named_in_docs_exist():
    missing = []
    for path in DOCS:
        text = open(path).read()
        for line in _code_lines(path):
            for rel in re.findall(r"(?:python3?|bash)\s+((?:benchmarks|docs|scripts)/[\w./-]+)", line):
                if not os.path.exists(os.path.join(ROOT, rel)):
                    missing.append(f"{os.path.basename(path)}: {rel}")
        for rel in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):  # relative markdown links
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), rel))):
                if os.path.basename(rel) not in ("monokernel.md", "collective.md"):  # written by their owners
                    missing.append(f"{os.path.basename(path)}: link {rel}")
    assert missing == []


def test_operator_guide_lists_every_option_and_reason():
    guide = open(os.path.join(ROOT, "docs", "operator-guide.md")).read()
    for f in dataclasses.fields(KogConfig):
        assert f"`{f.name}`" in guide, f.name
    for reason in [*eligibility.REQUEST_FEATURES.values(), *eligibility.SERVER_FEATURES.values(), *eligibility.KOG_PATH_FEATURES]:
        assert reason in guide, reason


def test_run_docs_commands_script_covers_the_guide():
    script = open(os.path.join(ROOT, "benchmarks", "run_docs_commands.sh")).read()
    for needle in ("kog doctor", "kog make-checkpoint", "kog bench", "--backend kog", "--kog-options", "--worker-cls",
                   "--backend stock", "kog stats", "vllm bench latency", "docs/examples/offline_kog.py", "--url"):
        assert needle in script, needle
