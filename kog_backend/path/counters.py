"""Counts of steps that ran on the kog path and of each reason a step fell back to stock.

Each reason is logged once per process (at INFO) and counted every time. Workers persist a snapshot as
JSON under the state directory (throttled, and at shutdown) so that `kog stats` can print it from another
process; `KogWorker.kog_stats()` returns the same dict through vLLM's `collective_rpc`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import tempfile
import threading
import time
from collections import Counter
from typing import Any

logger = logging.getLogger("kog_backend")

KOG_PATH = "kog"  # the key under which steps that ran on the kog path are counted
DEFAULT_STATE_DIR = os.path.join(tempfile.gettempdir(), "kog_backend")
# Set by the first process of a server that loads kog (the API server; kog_backend.engine.plugin) to its pid, and
# inherited by its engine and workers: /metrics shows the counters of its own server's workers only.
SERVER_ENV = "KOG_SERVER_ID"


def state_dir(configured: str = "") -> str:
    return configured or os.environ.get("KOG_STATE_DIR") or DEFAULT_STATE_DIR


class StepCounters:
    """Not thread-safe for counting (one engine step at a time per worker); snapshot/persist may be
    called from a shutdown hook."""

    def __init__(self, path: str | None = None, flush_interval_s: float = 1.0):
        self.kog_steps = 0
        self.kog_tokens = 0
        self.fallbacks: Counter[str] = Counter()
        # kog steps of one token (vLLM's sampler on the kernel's logits) that a K-token burst could not take, by reason
        self.single_token: Counter[str] = Counter()
        self.run_ahead_used = 0  # bursts launched ahead (kog_backend/path/run_ahead.py) that vLLM's next step took
        self.run_ahead_abandoned = 0  # ... that it did not (cancelled on the GPU)
        self.launch_aborts = 0  # monokernel launches that aborted (a wait gave up); their tokens were discarded
        self.timeline: dict[str, float] | None = None  # the last request's step timeline (kog option step_timeline)
        self.disabled_reason: str | None = None
        self.path = path
        self.flush_interval_s = flush_interval_s
        self._last_flush = 0.0
        self._dirty = False
        self._lock = threading.Lock()
        self.started = time.time()
        if path is not None:  # also where vLLM ends the worker without the runner's shutdown (SIGTERM -> SystemExit)
            atexit.register(self.remove)

    def record_kog(self, num_tokens: int = 1) -> None:
        self.kog_steps += 1
        self.kog_tokens += num_tokens
        self._touch()

    def record_single_token(self, reason: str) -> None:
        if reason not in self.single_token:
            logger.info("kog: a kog step runs one token, not a burst: %s (logged once; counted in `kog stats`)",
                        reason)
        self.single_token[reason] += 1
        self._touch()

    def record_run_ahead(self, used: bool) -> None:
        if used:
            self.run_ahead_used += 1
        else:
            self.run_ahead_abandoned += 1
        self._touch()

    def record_launch_abort(self) -> None:
        self.launch_aborts += 1
        self._touch(force=True)

    def record_timeline(self, summary: dict[str, float] | None) -> None:
        if summary is not None:
            self.timeline = summary
            self._touch(force=True)

    def record_fallback(self, reason: str) -> None:
        if reason not in self.fallbacks:
            logger.info("kog: step runs stock: %s (logged once; counted in `kog stats`)", reason)
        self.fallbacks[reason] += 1
        self._touch()

    def disable(self, reason: str) -> None:
        """kog is off for the rest of this server's life (a failed launch, an unsupported model...)."""
        if self.disabled_reason is None:
            self.disabled_reason = reason
        self._touch(force=True)

    def snapshot(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "started": self.started,
            "updated": time.time(),
            "kog_steps": self.kog_steps,
            "kog_tokens": self.kog_tokens,
            "fallback_steps": sum(self.fallbacks.values()),
            "fallbacks": dict(self.fallbacks.most_common()),
            "single_token_steps": dict(self.single_token.most_common()),
            "run_ahead_used": self.run_ahead_used,
            "run_ahead_abandoned": self.run_ahead_abandoned,
            "launch_aborts": self.launch_aborts,
            "server": os.environ.get(SERVER_ENV, ""),
            "disabled_reason": self.disabled_reason,
            **({"timeline": self.timeline} if self.timeline is not None else {}),
        }

    def summary_line(self) -> str:
        s = self.snapshot()
        reasons = ", ".join(f"{k}: {v}" for k, v in s["fallbacks"].items()) or "none"
        off = f"; disabled: {s['disabled_reason']}" if s["disabled_reason"] else ""
        return (
            f"kog: {s['kog_steps']} steps ({s['kog_tokens']} tokens) on the kog path, "
            f"{s['fallback_steps']} stock steps [{reasons}]{off}"
        )

    def _touch(self, force: bool = False) -> None:
        self._dirty = True
        now = time.monotonic()
        if force or now - self._last_flush >= self.flush_interval_s:
            self.flush()

    def remove(self) -> None:
        """Deletes this process's file (at shutdown: `kog stats` and /metrics read running servers only)."""
        if self.path is None:
            return
        with self._lock:
            self._dirty = False
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            except OSError as e:
                logger.warning("kog: could not remove %s: %s", self.path, e)
            self.path = None

    def flush(self) -> None:
        if self.path is None or not self._dirty:
            return
        with self._lock:
            self._last_flush = time.monotonic()
            self._dirty = False
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump(self.snapshot(), f)
                os.replace(tmp, self.path)
            except OSError as e:  # counters must never take the server down
                logger.warning("kog: could not write counters to %s: %s", self.path, e)


def read_all(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """Every counters file under `directory`, newest first."""
    out = []
    if not os.path.isdir(directory):
        return out
    for name in os.listdir(directory):
        if not (name.startswith("stats-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                out.append((name, json.load(f)))
        except (OSError, ValueError):
            continue
    out.sort(key=lambda item: item[1].get("updated", 0), reverse=True)
    return out
