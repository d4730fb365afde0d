"""The gate: every reason the kog path refuses something, returned as a string by the functions of this package.

Each function returns None (the kog path takes it) or a reason. The caller counts the reason through
kog_backend.path.counters, which logs each reason once per process: a step's fallback to stock, a kog step's
single token instead of a burst, or kog off for the whole server (`disabled_reason`); /metrics labels stock steps
with it (kog_backend.path.metrics). Other modules compute facts (model_spec reads the model, plan computes the
tiling) and ask the gate. The levels, in the order a server meets them:

  environment  the worker's process: kog switched on, vLLM's version, the GPU, vLLM's V2 runner
  extension    kog_backend._C: built, loadable, this package's ops version, layout and kernel constants
  server       vLLM's config (parallelism, LoRA, speculative decoding, dtypes) and the start gate
  model        the model's config.json and loaded weights; each reason names the config field
  kv_cache     the KV cache vLLM allocated
  tiling       the monokernel's tiling plan for the shape on this GPU
  monokernel   the extension, the shape, tensor parallelism, every tensor, a failed or aborted launch
  request      what a request asks for (stock for its whole life)
  burst        why a kog step makes one token instead of K
  step         one engine step: exactly one request decoding one token

Every reason is a template of one level's REASONS (str.format fields): `catalogue()` lists them all, for
`kog doctor`, the docs and the tests; `reason_key(text)` says which template a counted reason came from.
"""

from __future__ import annotations

import functools
import re
import string

from kog_backend.path.gate import (
    burst, environment, extension, kv_cache, model, monokernel, request, server, step, tiling,
)
from kog_backend.path.gate.burst import (
    BURST_REASONS, burst_reason, fit_to_slots, request_single_token_reason, scheduling_reason,
)
from kog_backend.path.gate.environment import environment_reason, gpu_reason, vllm_version_reason, worker_reason
from kog_backend.path.gate.request import KOG_PATH_FEATURES, REQUEST_FEATURES, request_unsupported_reason
from kog_backend.path.gate.server import SERVER_FEATURES, server_unsupported_reason, start_reason
from kog_backend.path.gate.step import STEP_REASONS, step_unsupported_reason

LEVELS = {
    "environment": environment.REASONS,
    "extension": extension.REASONS,
    "server": server.REASONS,
    "model": model.REASONS,
    "kv_cache": kv_cache.REASONS,
    "tiling": tiling.REASONS,
    "monokernel": monokernel.REASONS,
    "request": request.REASONS,
    "burst": burst.REASONS,
    "step": step.REASONS,
}


def catalogue() -> list[tuple[str, str, str]]:
    """(level, key, template) of every reason the gate can return, in the order a server meets them."""
    return [(level, key, text) for level, reasons in LEVELS.items() for key, text in reasons.items()]


def display(template: str) -> str:
    """A template as docs print it: each field as <field>."""
    return "".join(lit + (f"<{field}>" if field is not None else "") for lit, field, _, _ in _parts(template))


def reason_key(text: str) -> tuple[str, str] | None:
    """(level, key) of the template `text` was made from, or None where the gate has no such reason. A reason that
    wraps another ("monokernel: <reason>") is the outer one's: among the templates that match, the one whose
    leading text is longest (then whose text is longest)."""
    found = [(rank, level, key) for level, key, pattern, rank in _patterns() if pattern.fullmatch(text)]
    return max(found)[1:] if found else None


def _parts(template: str):
    return string.Formatter().parse(template)


@functools.cache
def _patterns() -> list[tuple[str, str, re.Pattern, tuple[int, int]]]:
    out = []
    for level, key, text in catalogue():
        parts = list(_parts(text))
        regex = "".join(re.escape(lit) + ("(.*)" if field is not None else "") for lit, field, _, _ in parts)
        rank = (len(parts[0][0]), sum(len(lit) for lit, _, _, _ in parts))
        out.append((level, key, re.compile(regex, re.S), rank))
    return out


__all__ = [
    "BURST_REASONS", "KOG_PATH_FEATURES", "LEVELS", "REQUEST_FEATURES", "SERVER_FEATURES", "STEP_REASONS",
    "burst", "burst_reason", "catalogue", "display", "environment", "environment_reason", "extension", "fit_to_slots",
    "gpu_reason", "kv_cache", "model", "monokernel", "reason_key", "request", "request_single_token_reason",
    "request_unsupported_reason", "scheduling_reason", "server", "server_unsupported_reason", "start_reason", "step",
    "step_unsupported_reason", "tiling", "vllm_version_reason", "worker_reason",
]
