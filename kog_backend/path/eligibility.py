"""Names of the gate's request, step and server levels where earlier code imports them; the gate is
kog_backend.path.gate, the draw a burst reproduces kog_backend.path.burst_sampling."""

from __future__ import annotations

from kog_backend.path.burst_sampling import GREEDY_TEMPERATURE, BurstSampling, burst_sampling
from kog_backend.path.gate.burst import BURST_REASONS, request_single_token_reason
from kog_backend.path.gate.request import KOG_PATH_FEATURES, REQUEST_FEATURES, request_unsupported_reason
from kog_backend.path.gate.server import SERVER_FEATURES, server_unsupported_reason
from kog_backend.path.gate.kv_cache import TESTED_BLOCK_SIZES
from kog_backend.path.gate.kv_cache import served_layout_reason as kv_cache_unsupported_reason
from kog_backend.path.gate.step import MAX_TESTED_CONTEXT, STEP_REASONS, step_unsupported_reason

__all__ = [
    "BURST_REASONS", "GREEDY_TEMPERATURE", "KOG_PATH_FEATURES", "MAX_TESTED_CONTEXT", "REQUEST_FEATURES",
    "SERVER_FEATURES", "STEP_REASONS", "TESTED_BLOCK_SIZES", "kv_cache_unsupported_reason",
    "BurstSampling", "burst_sampling", "request_single_token_reason", "request_unsupported_reason",
    "server_unsupported_reason", "step_unsupported_reason",
]
