"""Drift guard for patches/ and for the vLLM hooks kog relies on (registry: kog_backend/engine/patches.py).

Fails when a recorded symbol of the installed vLLM no longer hashes as recorded, or when a diff no longer
applies with zero fuzz. Then proves that patches/0001 works: applied to an overlay of the installed vLLM, every
entry point's parser accepts `--execution-backend kog` and EngineArgs.create_engine_config resolves it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kog_backend.engine import patches

ROOT = Path(__file__).resolve().parents[1]
DIFFS = [e for e in patches.PATCHES if e.kind == "diff"]


@pytest.fixture(scope="module")
def site_root() -> Path:
    return patches.vllm_site_root()


# --- the registry ---------------------------------------------------------------------------------------------


def test_registry_entries_are_complete():
    names = [e.name for e in patches.PATCHES]
    assert len(names) == len(set(names))
    for entry in patches.PATCHES:
        assert entry.kind in ("diff", "hook")
        for text in (entry.why, entry.how, entry.upstream, entry.remove_when):
            assert len(text) > 40
        assert entry.targets
        for target in entry.targets:
            assert len(target.sha256) == 64 and target.file.startswith("vllm/")
        if entry.kind == "diff":
            assert patches.patch_path(entry).is_file()
            touched = set(patches.patched_files(entry))
            # every modified, pre-existing file has at least one hashed symbol, and vice versa
            assert {t.file for t in entry.targets} <= touched
            assert all(t.patched_sha256 is None or t.file in touched for t in entry.targets)


def test_every_patch_file_is_registered():
    registered = {e.patch_file for e in DIFFS}
    on_disk = {p.name for p in (ROOT / "patches").glob("*.patch")}
    assert on_disk == registered


def test_patches_readme_lists_every_entry():
    readme = (ROOT / "patches" / "README.md").read_text()
    for entry in patches.PATCHES:
        assert entry.name in readme


# --- drift guard against the installed vLLM ---------------------------------------------------------------------


@pytest.mark.parametrize("entry", patches.PATCHES, ids=lambda e: e.name)
def test_recorded_symbols_match_installed_vllm(site_root, entry):
    applied = entry.kind == "diff" and patches.diff_state(entry, site_root)[0] == "applied"
    assert patches.check_targets(entry, site_root, patched=applied) == []


@pytest.mark.parametrize("entry", DIFFS, ids=lambda e: e.name)
def test_diff_applies_to_installed_vllm(site_root, entry):
    state, output = patches.diff_state(entry, site_root)
    # "applied": someone ran `kog patch-vllm --apply` in this environment; the reverse then applies exactly.
    assert state in ("applicable", "applied"), output


def test_a_changed_symbol_is_detected(site_root):
    target = next(t for e in patches.PATCHES for t in e.targets if t.symbol == "EngineArgs.from_cli_args")
    source = (site_root / target.file).read_text()
    assert patches.check_target(target, source) is None
    body = patches.symbol_source(source, target.symbol)
    first_line = body.splitlines()[1]  # inside the function: the `def` line itself follows the decorator
    changed = source.replace(first_line, first_line + "  # edited upstream", 1)
    assert changed != source
    problem = patches.check_target(target, changed)
    assert problem is not None and "changed" in problem
    # Edits elsewhere in the file do not trip the guard, so a hash mismatch points at the symbol itself.
    assert patches.check_target(target, source + "\n# unrelated\n") is None
    assert "not found" in patches.check_target(target, source.replace("def from_cli_args", "def from_args"))
    assert "not found" in patches.check_target(target, None)


def test_symbol_source_finds_methods_assignments_and_decorators():
    source = textwrap.dedent("""
        X = 1
        class A:
            y: int = 2
            @classmethod
            def f(cls):
                return 3
    """)
    assert patches.symbol_source(source, "X") == "X = 1\n"
    assert patches.symbol_source(source, "A.y") == "y: int = 2\n"
    assert patches.symbol_source(source, "A.f") == "@classmethod\ndef f(cls):\n    return 3\n"
    with pytest.raises(KeyError):
        patches.symbol_source(source, "A.g")


def _copy_targets(entry, site_root: Path, dest: Path) -> None:
    for rel in patches.patched_files(entry):
        src = site_root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dest / rel)


@pytest.mark.parametrize("entry", DIFFS, ids=lambda e: e.name)
def test_a_diff_that_no_longer_applies_is_detected(site_root, tmp_path, entry):
    _copy_targets(entry, site_root, tmp_path)
    assert patches.diff_state(entry, tmp_path)[0] == "applicable"
    # Change one context line of the first hunk of the first file: zero fuzz must refuse it.
    text = patches.patch_path(entry).read_text()
    first_file = patches.patched_files(entry)[0]
    hunk = text.split(f"+++ b/{first_file}\n", 1)[1].split("\n@@", 2)[1]
    context = next(line[1:] for line in hunk.splitlines()[1:] if line.startswith(" ") and line.strip())
    path = tmp_path / first_file
    path.write_text(path.read_text().replace(context, context + "  # drifted", 1))
    state, output = patches.diff_state(entry, tmp_path)
    assert state == "conflict", output


@pytest.mark.parametrize("entry", DIFFS, ids=lambda e: e.name)
def test_apply_and_revert_round_trip(site_root, tmp_path, entry):
    _copy_targets(entry, site_root, tmp_path)
    before = {p: p.read_text() for p in tmp_path.rglob("*.py")}
    assert patches.apply(entry, tmp_path).returncode == 0
    assert patches.diff_state(entry, tmp_path)[0] == "applied"
    for target in entry.targets:
        assert patches.check_target(target, (tmp_path / target.file).read_text(), patched=True) is None
    assert patches.revert(entry, tmp_path).returncode == 0
    assert {p: p.read_text() for p in tmp_path.rglob("*.py")} == before
    assert not (tmp_path / "vllm/plugins/execution_backends.py").exists()


# --- patches/0001 works: `--execution-backend` on a patched overlay of the installed vLLM ---------------------------


def _overlay(site_root: Path, entry, dest: Path) -> Path:
    """dest/vllm: the installed package as symlinks (compiled .pyc included), the patched files as real copies."""
    shutil.copytree(site_root / "vllm", dest / "vllm", copy_function=os.symlink)
    for rel in patches.patched_files(entry):
        path = dest / rel
        if path.is_symlink():
            path.unlink()
            shutil.copy(site_root / rel, path)
            cached = path.parent / "__pycache__"
            for pyc in cached.glob(f"{path.stem}.*.pyc") if cached.is_dir() else []:
                pyc.unlink()
    result = patches.apply(entry, dest)
    assert result.returncode == 0, result.stdout + result.stderr
    # kog's `vllm.execution_backends` entry point as if installed (the test environment may predate it), plus a
    # second backend registered twice by different packages.
    dist = dest / "kog_test_backends-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kog-test-backends\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.execution_backends]\nkog = kog_backend.engine.plugin:execution_backend\n"
        "twice = kog_backend.engine.plugin:execution_backend\n")
    dist2 = dest / "kog_test_backends2-0.dist-info"
    dist2.mkdir()
    (dist2 / "METADATA").write_text("Metadata-Version: 2.1\nName: kog-test-backends2\nVersion: 0\n")
    (dist2 / "entry_points.txt").write_text("[vllm.execution_backends]\ntwice = kog_backend.config:KogConfig\n")
    return dest


PROBE = r"""
import contextlib, io, json, sys
out = {}
MODEL = sys.argv[1]  # an empty local directory: no hub look-up; the model config fails fast, after resolution
import vllm.engine.arg_utils as au
out["arg_utils"] = au.__file__
from vllm.engine.arg_utils import EngineArgs, AsyncEngineArgs
from vllm.plugins import execution_backends as eb
from vllm.platforms.cpu import CpuPlatform
import vllm.platforms
platform = CpuPlatform()                                    # vLLM's parsers need a device type
vllm.platforms.current_platform = platform
au.current_platform = platform
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks import latency, throughput
from vllm.entrypoints.openai.cli_args import make_arg_parser

out["names"] = eb.execution_backend_names()

def parse(add, argv):
    parser = FlexibleArgumentParser()
    add(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv)
    except SystemExit as e:
        return {"exit": e.code, "err": err.getvalue()}

ns = parse(latency.add_cli_args, ["--execution-backend", "kog", "--model", MODEL])
out["latency"] = EngineArgs.from_cli_args(ns).execution_backend
ns = parse(throughput.add_cli_args, ["--execution-backend", "kog", "--backend", "vllm", "--model", MODEL])
out["throughput"] = [ns.execution_backend, ns.backend]
ns = parse(make_arg_parser, [MODEL, "--execution-backend", "kog"])
out["serve"] = ns.execution_backend
out["default"] = parse(make_arg_parser, [MODEL]).execution_backend
out["unknown"] = parse(make_arg_parser, [MODEL, "--execution-backend", "kogg"])

def resolved(**kw):
    args = EngineArgs(model=MODEL, **kw)
    try:
        args.create_engine_config()   # resolves the backend first, then fails later on this CPU machine
    except Exception as e:
        if "execution backend" in str(e).lower() or "worker_cls" in str(e):
            return {"error": str(e)}
    return [args.worker_cls, args.additional_config]

out["kog"] = resolved(execution_backend="kog")
out["kog_merge"] = resolved(execution_backend="kog",
                            additional_config={"kog": {"tokens_per_step": 4}, "other": 1})
out["kog_conflict"] = resolved(execution_backend="kog", worker_cls="my.Worker")
out["stock"] = resolved()
out["twice"] = resolved(execution_backend="twice")
out["idempotent"] = eb.apply_execution_backend("kog", *eb.apply_execution_backend("kog", "auto", {"x": 1}))
print("PROBE" + json.dumps(out))
"""


def test_patched_vllm_accepts_execution_backend_everywhere(site_root, tmp_path):
    entry = patches.by_name("0001-execution-backend")
    overlay = _overlay(site_root, entry, tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(overlay), str(ROOT)]), VLLM_LOGGING_LEVEL="ERROR",
               HF_HUB_OFFLINE="1")
    env.pop("VLLM_PLUGINS", None)
    result = subprocess.run([sys.executable, "-c", PROBE, str(model)], capture_output=True, text=True, env=env,
                            timeout=600, cwd=tmp_path)
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    out = json.loads(lines[-1][len("PROBE"):])
    from kog_backend.config import WORKER_CLS

    assert out["arg_utils"].startswith(str(overlay))
    assert out["names"][0] == "default" and "kog" in out["names"]
    assert out["latency"] == "kog"
    assert out["throughput"] == ["kog", "vllm"]
    assert out["serve"] == "kog" and out["default"] == "default"
    assert out["unknown"]["exit"] == 2 and "kogg" in out["unknown"]["err"] and "kog" in out["unknown"]["err"]
    assert out["kog"] == [WORKER_CLS, {"kog": {"enabled": True}}]
    assert out["kog_merge"] == [WORKER_CLS, {"kog": {"enabled": True, "tokens_per_step": 4}, "other": 1}]
    assert "conflicts" in out["kog_conflict"]["error"]
    assert out["stock"] == ["auto", {}]
    assert "more than once" in out["twice"]["error"]
    assert out["idempotent"] == [WORKER_CLS, {"kog": {"enabled": True}, "x": 1}]
