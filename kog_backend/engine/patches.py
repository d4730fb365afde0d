"""Registry of every place where kog_backend changes or depends on vLLM 0.26.0 source, with a drift guard.

Two kinds of entry:
- "diff": a unified diff in patches/ (applied to an installed vLLM only on request, `kog patch-vllm --apply`).
- "hook": a documented vLLM extension hook that kog uses at run time without changing vLLM's files; the
  targets are the vLLM functions whose behaviour the hook relies on.

Each target records the sha256 of a symbol's source in vLLM 0.26.0 (and, for symbols a diff changes, after the
diff). `check_targets` re-hashes the installed vLLM; tests/test_patches.py fails when a hash, or the diff's
applicability, drifts, which is the signal to re-read the symbol and re-validate the entry.

A symbol's source is its `ast` node's lines (decorators included), dedented; a dotted name walks classes
(`EngineArgs.add_cli_args`); module- or class-level assignments are found by their target name.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import shutil
import subprocess
import textwrap
from pathlib import Path

import kog_backend

REPO_ROOT = Path(kog_backend.__file__).resolve().parents[1]  # the checkout above the package
PATCH_DIR = REPO_ROOT / "patches"


@dataclasses.dataclass(frozen=True)
class Target:
    file: str  # relative to the directory that holds the `vllm` package, e.g. "vllm/engine/arg_utils.py"
    symbol: str  # dotted name inside the file
    sha256: str  # of the symbol's source in vLLM 0.26.0
    patched_sha256: str | None = None  # after this entry's diff, for symbols the diff changes


@dataclasses.dataclass(frozen=True)
class PatchEntry:
    name: str
    kind: str  # "diff" | "hook"
    targets: tuple[Target, ...]
    why: str
    how: str
    upstream: str
    remove_when: str
    patch_file: str | None = None  # under patches/, for kind "diff"


PATCHES: tuple[PatchEntry, ...] = (
    PatchEntry(
        name="0001-execution-backend",
        kind="diff",
        patch_file="0001-execution-backend.patch",
        targets=(
            Target("vllm/engine/arg_utils.py", "EngineArgs.worker_extension_cls",
                   "a487bd73aeab968afc7fa27a88cdb359d3fbd91160bf932d0ca2c2c1e74d70f8"),
            Target("vllm/engine/arg_utils.py", "EngineArgs.add_cli_args",
                   "c9035eaa9e76434bb92c49054c5b28a09ef18d03a6f7a64bc6f5fd69c58bd625",
                   "3717d7207b5ea68b2504ac3a7ad4be666bef24891ce61b4a79013f511b7cedec"),
            Target("vllm/engine/arg_utils.py", "EngineArgs.create_engine_config",
                   "54b5b56db7187334471a0dd11c3efb51c633358be4ce7573e7557e27cdd22df3",
                   "4a099939dbd64e56a5c72c37a854dad8ee57d6fe212609ddcb6fda2b5f14f818"),
            Target("vllm/plugins/__init__.py", "ENDPOINT_PLUGINS_GROUP",
                   "bd1f177006acc275d635c6fe177022cb05c65dadbd5ec6ffb38333181052902f"),
        ),
        why="vLLM has no option that selects an out-of-tree execution backend on every entry point: "
        "`--backend kog` (the platform hook below) exists only on parsers built by AsyncEngineArgs.add_cli_args "
        "(serve, run-batch, launch), not on `vllm bench latency` or other EngineArgs.add_cli_args users.",
        how="Adds the entry-point group `vllm.execution_backends` and vllm/plugins/execution_backends.py "
        "(name -> {worker_cls, additional_config}), the EngineArgs field / CLI flag `--execution-backend` "
        "(argparse refuses unknown names), and resolves the backend at the top of "
        "EngineArgs.create_engine_config (explicit conflicting --worker-cls is an error; user "
        "additional_config entries take precedence). kog registers `kog = kog_backend.engine.plugin:execution_backend`.",
        upstream="Send patches/0001 as a vLLM pull request ([Feature] Select an execution backend with "
        "--execution-backend), with a unit test under tests/plugins/ modelled on tests/test_patches.py.",
        remove_when="The vLLM release kog pins ships `--execution-backend` (or an equivalent): then drop the "
        "patch, keep the entry point, and point the docs at the native flag.",
    ),
    PatchEntry(
        name="hook-platform-backend-flag",
        kind="hook",
        targets=(
            Target("vllm/engine/arg_utils.py", "AsyncEngineArgs.add_cli_args",
                   "34047ffb004eefcd062934f1083ee3ee37d761b9d95ca14c67fd93323b166191"),
            Target("vllm/engine/arg_utils.py", "EngineArgs.from_cli_args",
                   "0942d783ae914501b0add4873a30030674c9908b8011dcd00452c5b78110e11f"),
            Target("vllm/platforms/__init__.py", "resolve_current_platform_cls_qualname",
                   "42a52842091367780bd7619186438e09de82c6c3aff2e2a842238f1724d2e6ad"),
            Target("vllm/platforms/__init__.py", "cuda_platform_plugin",
                   "cbca7fb029e762067cf8e92f19f278cc169d553152ab804eb84f7e017765409a"),
            Target("vllm/platforms/cuda.py", "CudaPlatform",
                   "5aed4f5ef651d8ab11b316b3b9961ab32e26e021e7fc9c6f40498c5f7c2c23e0"),
            Target("vllm/utils/argparse_utils.py", "FlexibleArgumentParser.parse_args",
                   "b3768d79355e6321f2762ac7ac76a3d15f6717e424a3d5a59831f79e5557d3d2"),
        ),
        why="`vllm serve MODEL --backend kog` on an unmodified vLLM: only a platform plugin can add flags to "
        "the serve parser (Platform.pre_register_and_update(parser), called last in "
        "AsyncEngineArgs.add_cli_args).",
        how="kog_backend.engine.plugin:register_platform returns KogCudaPlatform (a subclass of vLLM's CudaPlatform "
        "that overrides only pre_register_and_update) where vLLM's CUDA detector selects CUDA; an out-of-tree "
        "platform wins over the built-in one (resolve_current_platform_cls_qualname). The flags are translated "
        "into worker_cls / additional_config when the parser finishes (kog_backend/engine/cli_args.py), because "
        "EngineArgs.from_cli_args copies only dataclass fields and FlexibleArgumentParser.parse_args appends "
        "dotted --additional-config.* arguments last.",
        upstream="Superseded by patches/0001 (`--execution-backend`) once upstream.",
        remove_when="vLLM ships a native backend option: then keep `--backend` only as a documented alias or "
        "drop the platform plugin.",
    ),
    PatchEntry(
        name="hook-metrics-multiprocess-registry",
        kind="hook",
        targets=(
            Target("vllm/v1/metrics/prometheus.py", "get_prometheus_registry",
                   "fc1df9c36c3267ba771d0d717ad2d4d1125576addc4adae893d54cb28f6fb2f8"),
            Target("vllm/entrypoints/serve/instrumentator/metrics.py", "attach_router",
                   "505274300362a4800365da4263dd43e0abf251bee3f8cb3947dfc1cdffbfa925"),
        ),
        why="kog's families on /metrics with --api-server-count > 1: vLLM then serves, per API server, a fresh "
        "CollectorRegistry holding only prometheus_client's MultiProcessCollector, which reads the metric files "
        "of prometheus_client objects, not a custom collector on the default registry.",
        how="kog_backend.path.metrics.serve_on_multiprocess_registry (run by the general plugin in every process) "
        "wraps get_prometheus_registry in vllm.v1.metrics.prometheus and, where already imported, in "
        "vllm.entrypoints.serve.instrumentator.metrics (attach_router calls it by that module's global name when "
        "it mounts /metrics): a registry other than the default one also gets a KogCollector.",
        upstream="A hook in vLLM for extra collectors on the served registry (e.g. a registry plugin).",
        remove_when="vLLM lets plugins add collectors to the registry /metrics serves in multiprocess mode.",
    ),
)


def by_name(name: str) -> PatchEntry:
    for entry in PATCHES:
        if entry.name == name:
            return entry
    raise KeyError(f"no patch entry {name!r}; known: {[e.name for e in PATCHES]}")


def vllm_site_root() -> Path:
    """The directory that holds the importable `vllm` package (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vllm is not importable")
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def symbol_source(source: str, symbol: str) -> str:
    """Source text of `symbol` (dotted) in `source`, decorators included, dedented. KeyError if absent."""
    body = ast.parse(source).body
    node = None
    for part in symbol.split("."):
        node = next((n for n in body if _defines(n, part)), None)
        if node is None:
            raise KeyError(f"symbol {symbol!r} not found (missing {part!r})")
        body = getattr(node, "body", [])
    lines = source.splitlines()
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno])) + "\n"


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    return False


def symbol_sha256(source: str, symbol: str) -> str:
    return hashlib.sha256(symbol_source(source, symbol).encode()).hexdigest()


def check_target(target: Target, source: str | None, patched: bool = False) -> str | None:
    """None when the symbol's hash is the recorded one; otherwise what differs."""
    if source is None:
        return f"{target.file}: file not found"
    expected = target.patched_sha256 if (patched and target.patched_sha256) else target.sha256
    try:
        actual = symbol_sha256(source, target.symbol)
    except KeyError as e:
        return f"{target.file}: {e}"
    if actual != expected:
        return (f"{target.file}:{target.symbol} changed (sha256 {actual}, recorded {expected}"
                f"{' after the patch' if patched else ' for vLLM 0.26.0'}): re-read it and re-validate the entry")
    return None


def check_targets(entry: PatchEntry, root: Path, patched: bool = False) -> list[str]:
    problems = []
    for target in entry.targets:
        path = root / target.file
        source = path.read_text() if path.is_file() else None
        problem = check_target(target, source, patched)
        if problem:
            problems.append(problem)
    return problems


def patch_path(entry: PatchEntry) -> Path:
    if entry.patch_file is None:
        raise ValueError(f"{entry.name} is a {entry.kind} entry, not a diff")
    path = PATCH_DIR / entry.patch_file
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (patches/ ships with the source tree; use a checkout)")
    return path


def _run_patch(entry: PatchEntry, root: Path, *extra: str) -> subprocess.CompletedProcess:
    exe = shutil.which("patch")
    if exe is None:
        raise RuntimeError("GNU patch is required (apt-get install patch)")
    # --fuzz=0: every context line must match exactly (line offsets are allowed).
    cmd = [exe, "-p1", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "-d", str(root),
           "-i", str(patch_path(entry)), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def diff_state(entry: PatchEntry, root: Path) -> tuple[str, str]:
    """("applicable" | "applied" | "conflict", patch's output) for a diff entry against `root`."""
    forward = _run_patch(entry, root, "--dry-run", "--forward")
    if forward.returncode == 0:
        return "applicable", forward.stdout
    reverse = _run_patch(entry, root, "--dry-run", "--reverse", "--force")
    if reverse.returncode == 0:
        return "applied", reverse.stdout
    return "conflict", forward.stdout + forward.stderr


def apply(entry: PatchEntry, root: Path) -> subprocess.CompletedProcess:
    return _run_patch(entry, root, "--forward")


def revert(entry: PatchEntry, root: Path) -> subprocess.CompletedProcess:
    return _run_patch(entry, root, "--reverse", "--force")


def patched_files(entry: PatchEntry) -> list[str]:
    """Paths (relative to the site root) that a diff entry creates or modifies."""
    files = []
    for line in patch_path(entry).read_text().splitlines():
        if line.startswith("+++ b/"):
            files.append(line[len("+++ b/"):].split("\t")[0])
    return files
