"""What runs on the kog path and what falls back, read from the gate itself (kog_backend.path.gate), so this list
cannot drift from the code."""

from __future__ import annotations

from kog_backend.path import gate


def model_support() -> list[str]:
    archs = ", ".join(sorted(gate.model.SUPPORTED_ARCHS))
    dims = ", ".join(str(d) for d in gate.model.SUPPORTED_HEAD_DIMS)
    return [
        f"architectures: {archs}",
        f"head dims: {dims}; bf16 weights (or FP8 projections at TP = 1: docs/fp8.md) and KV cache; dense MLP",
        "anything else (MoE, other quantised weights, sliding window, other architectures): the whole server runs "
        "stock",
    ]


KOG_PATH = "Runs on the kog path (one request decoding)"
STEP = "A step runs stock (counted under this reason) when it is"
REQUEST = "A request that asks for any of these runs stock"
SERVER = "A server configured with any of these runs stock"
MODELS = "Models"


def sections() -> list[tuple[str, list[str]]]:
    return [
        (KOG_PATH, list(gate.KOG_PATH_FEATURES)),
        (STEP, list(gate.STEP_REASONS.values())),
        (REQUEST, list(gate.REQUEST_FEATURES.values())),
        (SERVER, list(gate.SERVER_FEATURES.values())),
        (MODELS, model_support()),
    ]


def reason_sections() -> list[tuple[str, list[str]]]:
    """Every reason the gate can return, by level (`kog doctor --reasons`): what `kog stats` and /metrics may show,
    each field as <field>."""
    return [(f"gate level {level}", [gate.display(text) for text in reasons.values()])
            for level, reasons in gate.LEVELS.items()]


def reasons_markdown() -> str:
    """docs/reasons.md: the catalogue as a page, level by level, each level introduced by its module's docstring
    (tests/test_docs.py keeps the page equal to this)."""
    out = [
        "# Every reason kog counts",
        "",
        "Generated from the gate (`kog_backend/path/gate/`) by `kog_backend.tools.doctor.features.reasons_markdown`;",
        "`kog doctor --reasons` prints the same list. A reason is what `kog stats` and /metrics show: a step that ran",
        "stock, a kog step of one token instead of a burst, or kog off for the whole server (`disabled_reason`).",
        "`<field>` stands for a value the reason names; a reason of the form `monokernel: <reason>` wraps another.",
    ]
    for level, reasons in gate.LEVELS.items():
        doc = (getattr(gate, level).__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out += ["", f"## {level}", "", doc, "", "| key | reason |", "|---|---|"]
        out += [f"| `{key}` | `{gate.display(text).replace('|', chr(92) + '|')}` |" for key, text in reasons.items()]
    return "\n".join(out) + "\n"
