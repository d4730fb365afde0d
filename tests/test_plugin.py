"""Entry-point registration: declared entry points resolve, register() is re-entrant, register_platform() follows
vLLM's own CUDA detection (None on this CPU machine), and nothing heavy is imported."""

from __future__ import annotations

import ast

import importlib
import importlib.metadata
import logging
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from kog_backend.engine import plugin
from kog_backend.config import WORKER_CLS

ROOT = Path(__file__).resolve().parents[1]
CUDA = "vllm.platforms.cuda.CudaPlatform"
EXPECTED = {
    "vllm.general_plugins": "kog_backend.engine.plugin:register",
    "vllm.platform_plugins": "kog_backend.engine.plugin:register_platform",
    "vllm.execution_backends": "kog_backend.engine.plugin:execution_backend",
}


def declared_entry_points() -> dict[str, dict[str, str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["entry-points"]


def resolve(value: str):
    module, attr = value.split(":")
    return getattr(importlib.import_module(module), attr)


def test_pyproject_declares_the_entry_points():
    declared = declared_entry_points()
    for group, value in EXPECTED.items():
        assert declared[group] == {"kog": value}
        assert callable(resolve(value))


def test_installed_metadata_matches_pyproject():
    try:
        dist = importlib.metadata.distribution("kog-backend")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("kog-backend is not installed here (scripts/setup.sh installs it)")
    installed = {(ep.group, ep.name, ep.value) for ep in dist.entry_points if ep.group.startswith("vllm.")}
    assert installed == {(g, "kog", v) for g, v in EXPECTED.items()}, "stale install: re-run scripts/setup.sh"


def test_console_script_is_declared():
    with open(ROOT / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert callable(resolve(scripts["kog"]))


# --- register(): logging only, re-entrant ----------------------------------------------------------------------


@pytest.fixture
def loggers():
    """The `vllm` and `kog_backend` loggers, restored afterwards. Tests clear their handlers in the test body:
    pytest attaches its capture handlers when the test's call phase starts. vLLM configures its loggers when
    `vllm.logger` is first imported (register() may be the first to import it): imported here, before any test
    clears them, so that a test run alone sees what it sees after others."""
    pytest.importorskip("vllm.logger")
    vllm_logger, kog_logger = logging.getLogger("vllm"), logging.getLogger("kog_backend")
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in (vllm_logger, kog_logger)]

    def clear():
        for lg in (vllm_logger, kog_logger):
            lg.handlers = []

    yield vllm_logger, kog_logger, clear
    for lg, handlers, level, propagate in saved:
        lg.handlers, lg.level, lg.propagate = handlers, level, propagate


def test_register_routes_kog_logs_through_vllm_handler_once(loggers):
    vllm_logger, kog_logger, clear = loggers
    clear()
    handler = logging.StreamHandler()
    vllm_logger.addHandler(handler)
    vllm_logger.setLevel(logging.DEBUG)
    plugin.register()
    plugin.register()
    assert kog_logger.handlers == [handler]
    assert kog_logger.level == logging.DEBUG and kog_logger.propagate is False


def test_register_leaves_user_configured_logging_alone(loggers):
    vllm_logger, kog_logger, clear = loggers
    clear()
    plugin.register()  # vLLM's logging off (no handler): nothing to follow
    assert kog_logger.handlers == []
    own = logging.NullHandler()
    kog_logger.addHandler(own)
    vllm_logger.addHandler(logging.StreamHandler())
    plugin.register()
    assert kog_logger.handlers == [own]


def test_execution_backend_spec():
    assert plugin.execution_backend() == {"worker_cls": WORKER_CLS, "additional_config": {"kog": {"enabled": True}}}


# --- register_platform() ---------------------------------------------------------------------------------------


@pytest.fixture
def cuda_detected(monkeypatch):
    """Make vLLM's own CUDA detector answer `value` (None = no CUDA)."""
    import vllm.platforms

    def set_answer(value):
        monkeypatch.setattr(vllm.platforms, "cuda_platform_plugin", lambda: value)

    monkeypatch.delenv(plugin.DISABLE_PLATFORM_ENV, raising=False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    return set_answer


def test_register_platform_follows_vllm_cuda_detection_on_this_machine(monkeypatch):
    from vllm.platforms import cuda_platform_plugin

    monkeypatch.delenv(plugin.DISABLE_PLATFORM_ENV, raising=False)
    expected = None if cuda_platform_plugin() is None else plugin.PLATFORM_QUALNAME
    if plugin.other_platform_plugins():
        expected = None
    assert plugin.register_platform() == expected


def test_register_platform_is_none_without_cuda(cuda_detected):
    cuda_detected(None)
    assert plugin.register_platform() is None


def test_register_platform_activates_where_vllm_would_use_cuda(cuda_detected):
    cuda_detected(CUDA)
    assert plugin.register_platform() == plugin.PLATFORM_QUALNAME
    assert plugin.register_platform() == plugin.PLATFORM_QUALNAME  # vLLM calls it twice


@pytest.mark.parametrize("value, active", [("1", False), ("yes", False), ("0", True), ("", True)])
def test_kog_disable_platform(cuda_detected, monkeypatch, value, active):
    cuda_detected(CUDA)
    monkeypatch.setenv(plugin.DISABLE_PLATFORM_ENV, value)
    assert plugin.register_platform() == (plugin.PLATFORM_QUALNAME if active else None)


def test_register_platform_never_raises(monkeypatch, cuda_detected):
    import vllm.platforms

    def broken():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(vllm.platforms, "cuda_platform_plugin", broken)
    assert plugin.register_platform() is None


def _fake_entry_points(extra):
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        found = list(real(**kw))
        if kw.get("group") == plugin.PLATFORM_PLUGINS_GROUP:
            found = [ep for ep in found if ep.name != "kog"] + extra
        return found

    return entry_points


def test_register_platform_steps_aside_for_another_platform_plugin(cuda_detected, monkeypatch):
    cuda_detected(CUDA)
    ours = importlib.metadata.EntryPoint("kog", plugin.PLATFORM_ENTRY_POINT, plugin.PLATFORM_PLUGINS_GROUP)
    other = importlib.metadata.EntryPoint("acme", "acme.plugin:platform", plugin.PLATFORM_PLUGINS_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points([ours, other]))
    assert plugin.other_platform_plugins() == ["acme"]
    assert plugin.register_platform() is None
    # ... unless VLLM_PLUGINS keeps vLLM from loading it.
    monkeypatch.setenv("VLLM_PLUGINS", "kog,lora_filesystem_resolver")
    assert plugin.other_platform_plugins() == []
    assert plugin.register_platform() == plugin.PLATFORM_QUALNAME


@pytest.mark.parametrize("cuda, expected", [(None, "vllm.platforms.interface.UnspecifiedPlatform"),
                                            (CUDA, plugin.PLATFORM_QUALNAME)])
def test_vllm_platform_resolution_with_kog_installed(monkeypatch, cuda_detected, cuda, expected):
    # vLLM's own selection loop with kog's plugin among the out-of-tree ones: kog wins exactly where CUDA would.
    import vllm.platforms

    cuda_detected(cuda)
    monkeypatch.setitem(vllm.platforms.builtin_platform_plugins, "cuda", lambda: cuda)
    for name in ("tpu", "rocm", "xpu", "cpu"):
        monkeypatch.setitem(vllm.platforms.builtin_platform_plugins, name, lambda: None)
    monkeypatch.setattr(vllm.platforms, "load_plugins_by_group", lambda group: {"kog": plugin.register_platform})
    assert vllm.platforms.resolve_current_platform_cls_qualname() == expected


# --- the platform class is a thin CUDA subclass ------------------------------------------------------------------


def test_kog_platform_is_a_thin_subclass_of_vllm_cuda_platform(monkeypatch, request):
    from vllm_cli_helpers import import_kog_platform

    module = import_kog_platform(monkeypatch, request)
    cls = module.KogCudaPlatform
    stand_in = sys.modules["vllm.platforms.cuda"].CudaPlatform
    assert cls.__bases__ == (stand_in,)
    own = {k for k in vars(cls) if not (k.startswith("__") and k.endswith("__"))}
    # The flags, stock scheduling put back where kog will not run (kog_backend/engine/scheduling.py), and kog's
    # communicator where the `collective` option asks for it (tests/test_communicator_hook.py).
    assert own == {"pre_register_and_update", "check_and_update_config", "get_device_communicator_cls"}
    assert plugin.PLATFORM_QUALNAME == f"{cls.__module__}.{cls.__qualname__}"


def test_kog_platform_source_subclasses_vllm_cuda_platform_alias():
    # vllm.platforms.cuda.CudaPlatform is NvmlCudaPlatform or NonNvmlCudaPlatform, as vLLM chose at import.
    source = (ROOT / "kog_backend" / "engine" / "platform.py").read_text()
    assert "from vllm.platforms.cuda import CudaPlatform\n" in source
    assert "class KogCudaPlatform(CudaPlatform):" in source


# --- lazy imports ------------------------------------------------------------------------------------------------


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_importing_kog_modules_imports_neither_torch_nor_vllm():
    out = _run("""
        import sys
        import kog_backend, kog_backend.engine.plugin, kog_backend.engine.cli_args, kog_backend.config, kog_backend.engine.patches
        import kog_backend.tools.cli
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm", "numpy", "transformers"))
        print(heavy)
    """)
    assert out.strip() == "[]"


def _plugin_imports(server_named: bool, multiprocess: bool) -> list[str]:
    """Modules outside kog_backend that the plugin's calls import, in a process where vLLM calls them (vllm.platforms
    with its CUDA detector and vllm.logger loaded): an engine or worker process inherits the server's id."""
    out = _run(f"""
        import os, sys
        os.environ.pop("KOG_SERVER_ID", None)
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if {server_named!r}:
            os.environ["KOG_SERVER_ID"] = "1"
        if {multiprocess!r}:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = "/nonexistent-kog-test"
        import vllm.platforms, vllm.logger
        vllm.platforms.cuda_platform_plugin()
        before = set(sys.modules)
        from kog_backend.engine import plugin
        plugin.register(); plugin.register()
        plugin.register_platform(); plugin.register_platform()
        print(sorted(m for m in set(sys.modules) - before if not m.startswith("kog_backend")))
    """)
    return ast.literal_eval(out.strip().splitlines()[-1])


def test_plugin_calls_in_engine_and_worker_processes_import_nothing():
    # One API server: an engine or worker process serves no /metrics, so the plugin loads nothing there.
    assert _plugin_imports(server_named=True, multiprocess=False) == []


@pytest.mark.parametrize("server_named,multiprocess", [(False, False), (True, True)])
def test_plugin_calls_in_metrics_processes_import_only_the_metrics_stack(server_named, multiprocess):
    # The process that names the server (the API server), and every process under vLLM's multiprocess metrics:
    # prometheus_client and vLLM's prometheus module (both already loaded by vLLM's API server), nothing else.
    extra = [m for m in _plugin_imports(server_named, multiprocess)
             if not m.startswith(("prometheus_client", "vllm.v1.metrics")) and m.split(".")[0] not in sys.stdlib_module_names]
    assert extra == []
