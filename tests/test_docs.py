"""The docs against the code: every `kog` command in them parses, every file they name exists, the operator
guide lists every option and every fallback reason the code has, the README's figures are those of the result
files it links, benchmarks/results/ holds only cited runs, and docs/tuning.md covers every kernel constant."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shlex

import pytest

from kog_backend.path import gate
from kog_backend.tools.cli import build_parser
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


def _table_rows(text: str, heading: str, first_column: str) -> dict[str, list[str]]:
    """Rows of the first table under `heading` whose header starts with `first_column`, keyed by that column."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    block = next(b for b in section.split("\n\n") if b.startswith(f"| {first_column} |"))
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in block.splitlines()[2:]]
    return {r[0].strip("`"): r[1:] for r in rows}


def test_operator_guide_lists_every_option_and_reason():
    guide = open(os.path.join(ROOT, "docs", "operator-guide.md")).read()
    for f in dataclasses.fields(KogConfig):
        assert f"`{f.name}`" in guide, f.name
    for reason in [*gate.REQUEST_FEATURES.values(), *gate.SERVER_FEATURES.values(),
                   *gate.KOG_PATH_FEATURES, *gate.BURST_REASONS.values()]:
        assert reason in guide, reason


def test_options_table_is_every_option_with_its_default():
    """The operator guide's options table has one row per KogConfig field, in the code's default (as JSON)."""
    rows = _table_rows(open(os.path.join(ROOT, "docs", "operator-guide.md")).read(), "## Options", "key")
    defaults = {f.name: f"`{json.dumps(f.default)}`" for f in dataclasses.fields(KogConfig)}
    assert sorted(rows) == sorted(defaults)
    assert {k: v[0] for k, v in rows.items()} == defaults


def test_flags_table_is_every_flag_kog_adds():
    import argparse

    from kog_backend.engine.cli_args import add_backend_arguments

    parser = argparse.ArgumentParser()
    add_backend_arguments(parser)
    flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    rows = _table_rows(open(os.path.join(ROOT, "docs", "operator-guide.md")).read(), "## Options",
                       "flag or variable")
    assert flags and flags <= set(rows), flags - set(rows)


def test_reasons_page_is_the_gate_catalogue():
    """docs/reasons.md is generated from the gate: a reason added, removed or reworded must be regenerated with
    python -c 'from kog_backend.tools.doctor.features import reasons_markdown as r; print(r(), end="")' > docs/reasons.md"""
    from kog_backend.tools.doctor.features import reasons_markdown

    assert open(os.path.join(ROOT, "docs", "reasons.md")).read() == reasons_markdown()


# Claims of identical outputs that the evidence (teacher forcing: logits within a bound, flips at bf16 near-ties)
# does not make.
IDENTITY_CLAIMS = (r"same outputs", r"(?<!not )(?<!not bit-)identical to stock", r"greedy (tokens|outputs) (are|is) the same",
                   r"same (greedy )?tokens as stock", r"and outputs\b")


def test_no_page_claims_outputs_identical_to_stock():
    found = [f"{os.path.basename(p)}: {m.group(0)!r}" for p in DOCS for claim in IDENTITY_CLAIMS
             for m in re.finditer(claim, open(p).read(), flags=re.I)]
    assert found == []


def test_architecture_page_follows_the_layout():
    """docs/architecture.md names every package of kog_backend, every level of the gate and every csrc source."""
    page = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    layout = page.split("## Layout", 1)[1].split("\n## ", 1)[0]
    pkg = os.path.join(ROOT, "kog_backend")
    packages = [d for d in os.listdir(pkg) if os.path.exists(os.path.join(pkg, d, "__init__.py"))]
    assert len(packages) >= 6
    missing = [f"{d}/" for d in packages if f"{d}/" not in layout]
    missing += [lv for lv in gate.LEVELS if lv not in layout]
    missing += [f for f in os.listdir(os.path.join(ROOT, "csrc")) if f.endswith((".cu", ".cpp")) and f not in layout]
    assert missing == []


def test_run_docs_commands_script_covers_the_guide():
    script = open(os.path.join(ROOT, "benchmarks", "run_docs_commands.sh")).read()
    for needle in ("kog doctor", "kog make-checkpoint", "kog bench", "--backend kog", "--kog-options", "--worker-cls",
                   "--backend stock", "kog stats", "vllm bench latency", "docs/examples/offline_kog.py", "--url"):
        assert needle in script, needle


RESULTS = os.path.join(ROOT, "benchmarks", "results")


def _cited_result_folders() -> set[str]:
    cited = set()
    for path in DOCS:
        cited |= set(re.findall(r"benchmarks/results/([\w.-]+)/", open(path).read()))
    return cited


def test_every_result_folder_is_cited_and_every_cited_one_kept():
    """benchmarks/results/ keeps the runs the README and docs/ cite, and only those."""
    on_disk = {d for d in os.listdir(RESULTS) if os.path.isdir(os.path.join(RESULTS, d))}
    cited = _cited_result_folders()
    assert sorted(on_disk - cited) == [], "result folders nothing cites (delete them, git history keeps them)"
    assert sorted(cited - on_disk) == [], "cited result folders that are missing"


def _readme_figures() -> list[dict[str, str]]:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def test_readme_figures_match_their_results():
    """The README's table of current figures is the kog bench JSON of the folders it links, figure for figure."""
    from kog_backend.tools.bench.results import BenchReport

    rows = _readme_figures()
    assert len(rows) >= 3
    for row in rows:
        folder = re.search(r"benchmarks/results/([\w.-]+)/", row["result"]).group(1)
        rep = BenchReport.load(os.path.join(RESULTS, folder, "bench.json"))
        m = next(m for m in rep.models if m.model == row["shape"])
        stock, kog = m.row("stock"), m.row("kog")
        assert row["card"] == rep.host.get("gpu"), row
        assert row["date"] == rep.date[:10], row
        assert row["stock tok/s"] == f"{stock.tok_s:.1f}", row
        assert row["kog tok/s"] == f"{kog.tok_s:.1f}", row
        assert row["kog / stock"] == f"{m.speedup:.2f}x", row
        assert row["kog % of copy bandwidth"] == f"{100 * kog.bw_share:.1f}%", row
        assert rep.settings.get("tokens_per_step") in (32, None), row


def test_tuning_page_covers_every_constant():
    """docs/tuning.md has a line for every MonoConfig constant and for the kog options that set a speed trade-off."""
    tuning = open(os.path.join(ROOT, "docs", "tuning.md")).read()
    config = open(os.path.join(ROOT, "csrc", "include", "kog", "config.cuh")).read()
    body = config.split("struct MonoConfig", 1)[1].split("};", 1)[0]
    names = re.findall(r"static constexpr \w+ (k\w+) =", body)
    assert len(names) > 30
    skip = {"kConsumerThreads", "kThreads", "kLoaderWarp", "kTaggedBuild"}  # derived from the ones listed
    missing = [n for n in names if n not in skip and n not in tuning and not n.startswith("kStage")]
    assert missing == []
    for option in ("tokens_per_step", "run_ahead"):
        assert f"`{option}`" in tuning
