"""vLLM entry points of kog_backend (declared in pyproject.toml).

- `vllm.general_plugins: kog = kog_backend.engine.plugin:register`: loaded by vLLM in every process. It only routes
  the `kog_backend.*` loggers to vLLM's log handler; kog itself is chosen per server (worker_cls +
  additional_config["kog"]), not by being installed.
- `vllm.platform_plugins: kog = kog_backend.engine.plugin:register_platform`: names `KogCudaPlatform` wherever vLLM's
  own CUDA platform would be active, so that `--backend` / `--kog-options` exist on `vllm serve`.
- `vllm.execution_backends: kog = kog_backend.engine.plugin:execution_backend`: read only by a vLLM carrying
  patches/0001 (`--execution-backend kog` on every entry point).

Everything here is re-entrant and imports nothing heavy: vLLM calls these while it is itself starting.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from kog_backend.config import CONFIG_KEY, WORKER_CLS

PLATFORM_QUALNAME = "kog_backend.engine.platform.KogCudaPlatform"
PLATFORM_ENTRY_POINT = "kog_backend.engine.plugin:register_platform"
PLATFORM_PLUGINS_GROUP = "vllm.platform_plugins"  # vllm.plugins.PLATFORM_PLUGINS_GROUP
DISABLE_PLATFORM_ENV = "KOG_DISABLE_PLATFORM"

logger = logging.getLogger("kog_backend.engine.plugin")


def register() -> None:
    """General plugin: send `kog_backend.*` records through vLLM's handler at vLLM's level.

    Without this, kog's loggers (outside the `vllm` hierarchy) would reach only Python's last-resort handler
    (warnings and up). Left alone when vLLM's logging is off (VLLM_CONFIGURE_LOGGING=0) or when the user's
    logging config (VLLM_LOGGING_CONFIG_PATH) already configures `kog_backend`.
    """
    _register_metrics()
    vllm_logger = logging.getLogger("vllm")
    kog_logger = logging.getLogger("kog_backend")
    if kog_logger.handlers or not vllm_logger.handlers:
        return
    for handler in vllm_logger.handlers:
        kog_logger.addHandler(handler)
    kog_logger.setLevel(vllm_logger.level)
    kog_logger.propagate = False


def _register_metrics() -> None:
    """The first process of a server to load kog (the API server, or the offline LLM's process) names the server
    (counters.SERVER_ENV, inherited by its engine, workers and further API servers) and puts kog's families on the
    registry vLLM's /metrics serves (kog_backend.path.metrics): prometheus_client's default one. With several API
    servers (vLLM's multiprocess mode, PROMETHEUS_MULTIPROC_DIR set) every process does it, so that each API server's
    multiprocess registry carries them. Never fatal: metrics must not keep a server from
    starting."""
    from kog_backend.path.counters import SERVER_ENV

    if not os.environ.get(SERVER_ENV):
        os.environ[SERVER_ENV] = str(os.getpid())
    elif not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return  # an engine or worker process of a server with one API server: nothing is served from here
    try:
        from kog_backend.path.metrics import register_collector, serve_on_multiprocess_registry

        register_collector()
        serve_on_multiprocess_registry()
    except Exception as e:  # noqa: BLE001
        logger.warning("kog: metrics not registered on /metrics: %s", e)


def register_platform() -> str | None:
    """Platform plugin: KogCudaPlatform where vLLM would use CUDA, else None (vLLM then picks as usual).

    Returns None (so vLLM's platform selection is exactly as without kog) when:
    - $KOG_DISABLE_PLATFORM is set to anything but "" / "0";
    - another out-of-tree platform plugin is installed and allowed (vLLM refuses two active ones);
    - vLLM's own CUDA detector (`vllm.platforms.cuda_platform_plugin`: NVML sees a GPU, not a CPU build of
      vLLM) does not select CUDA: CPU-only machines, CI.
    Never raises: vLLM calls it twice and only catches exceptions on the first call.
    """
    if os.environ.get(DISABLE_PLATFORM_ENV, "0") not in ("", "0"):
        return None
    try:
        others = other_platform_plugins()
        if others:
            logger.info("kog: platform plugin(s) %s installed; --backend kog is off (use --worker-cls %s)",
                        others, WORKER_CLS)
            return None
        from vllm.platforms import cuda_platform_plugin

        if cuda_platform_plugin() is None:
            return None
    except Exception as e:  # noqa: BLE001 - detection failure means "not CUDA", as in vLLM's own loop
        logger.debug("kog: platform plugin not activated: %r", e)
        return None
    return PLATFORM_QUALNAME


def other_platform_plugins() -> list[str]:
    """Names of the other installed platform plugins that vLLM would load (honouring $VLLM_PLUGINS)."""
    from importlib.metadata import entry_points

    allowed = os.environ.get("VLLM_PLUGINS")
    allowed_names = None if allowed is None else {n.strip() for n in allowed.split(",")}
    names = set()
    for ep in entry_points(group=PLATFORM_PLUGINS_GROUP):
        if ep.value.replace(" ", "") == PLATFORM_ENTRY_POINT:
            continue
        if allowed_names is None or ep.name in allowed_names:
            names.add(ep.name)
    return sorted(names)


def execution_backend() -> dict[str, Any]:
    """What `--execution-backend kog` selects on a vLLM with patches/0001 (same as `--backend kog`)."""
    return {"worker_cls": WORKER_CLS, "additional_config": {CONFIG_KEY: {"enabled": True}}}
