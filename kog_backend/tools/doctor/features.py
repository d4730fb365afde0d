"""What runs on the kog path and what falls back, read from the gates themselves
(kog_backend.path.eligibility, kog_backend.path.model_spec), so this list cannot drift from the code."""

from __future__ import annotations

from kog_backend.path import eligibility



def model_support() -> list[str]:
    try:
        from kog_backend.path import model_spec
    except ImportError as e:  # torch missing: say so rather than guess
        return [f"(model support unknown: {e})"]
    archs = ", ".join(sorted(model_spec.SUPPORTED_ARCHS))
    dims = ", ".join(str(d) for d in model_spec.SUPPORTED_HEAD_DIMS)
    return [
        f"architectures: {archs}",
        f"head dims: {dims}; bf16 weights and KV cache; dense MLP",
        "anything else (MoE, quantised weights, sliding window, other architectures): the whole server runs stock",
    ]


KOG_PATH = "Runs on the kog path (one request decoding)"
STEP = "A step runs stock (counted under this reason) when it is"
REQUEST = "A request that asks for any of these runs stock"
SERVER = "A server configured with any of these runs stock"
MODELS = "Models"


def sections() -> list[tuple[str, list[str]]]:
    return [
        (KOG_PATH, list(eligibility.KOG_PATH_FEATURES)),
        (STEP, list(eligibility.STEP_REASONS.values())),
        (REQUEST, list(eligibility.REQUEST_FEATURES.values())),
        (SERVER, list(eligibility.SERVER_FEATURES.values())),
        (MODELS, model_support()),
    ]
