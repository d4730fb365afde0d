"""Printing `kog doctor`'s checks and feature table."""

from __future__ import annotations

import json

from kog_backend.tools.doctor.checks import Check, exit_status

MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "--  "}


def format_checks(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"[{MARK[c.status]}] {c.name.ljust(width)}  {c.summary}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"       {' ' * width}  fix: {c.fix}")
    code = exit_status(checks)
    verdict = (
        "kog would run here (exit 0)" if code == 0 else "kog would NOT run here: vLLM serves every step stock (exit 1)"
    )
    return "\n".join(lines + ["", verdict])


def format_features(sections: list[tuple[str, list[str]]]) -> str:
    out = []
    for title, items in sections:
        out.append(f"{title}:")
        out.extend(f"  - {i}" for i in items)
    return "\n".join(out)


def to_json(checks: list[Check], sections: list[tuple[str, list[str]]]) -> str:
    return json.dumps(
        {
            "exit_status": exit_status(checks),
            "checks": [{"name": c.name, "status": c.status, "summary": c.summary, "fix": c.fix} for c in checks],
            "features": {title: items for title, items in sections},
        },
        indent=2,
    )
