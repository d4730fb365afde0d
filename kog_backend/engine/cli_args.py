"""`--backend {stock,kog}` and `--kog-options JSON` on vLLM's engine parsers (way 1 of selecting kog).

vLLM builds an `argparse.Namespace` and copies only `EngineArgs` dataclass fields out of it
(`EngineArgs.from_cli_args`), so these flags act by rewriting two of those fields on the namespace:
`worker_cls` and `additional_config`. `--backend kog` is translated into exactly what way 2 spells out by hand:

    --worker-cls kog_backend.engine.worker.KogWorker --additional-config '{"kog": {"enabled": true, ...}}'

The translation runs when the parser finishes (a hook on this parser instance's `parse_known_args`), so it sees
the final `--worker-cls` and `--additional-config` whatever their order on the command line; vLLM's dotted
form (`--additional-config.x 1`) is re-appended after every other argument, so an earlier point would miss it.
Every problem is an argparse error: usage plus one line, exit status 2, before any engine starts.

Rules (`apply_backend_selection`):
- no kog flag, or `--backend stock`, with vLLM's own worker: the namespace is left exactly as parsed.
- `--backend kog`: worker_cls := WORKER_CLS (any other explicit --worker-cls is refused);
  additional_config["kog"] := {user's additional_config["kog"]..., --kog-options..., "enabled": true}; the other
  keys of additional_config are kept. The merged dict must pass `KogConfig.from_dict`.
- `--backend stock` with `--worker-cls kog_backend.engine.worker.KogWorker`: kog is switched off in place
  (additional_config["kog"]["enabled"] := false; the kog worker then runs every step stock).
- `--worker-cls kog_backend.engine.worker.KogWorker` without --backend (way 2): --kog-options are merged if given;
  the kog options are checked either way.
- `--kog-options` without the kog worker is refused.

This module imports neither torch nor vLLM.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kog_backend.config import CONFIG_KEY, SCHEDULER_CLS, WORKER_CLS, KogConfig, KogConfigError

BACKENDS = ("stock", "kog")
# vLLM's default for --worker-cls: the platform picks its worker.
_AUTO_WORKER = "auto"
_HOOKED = "_kog_backend_hooked"


class KogSelectionError(ValueError):
    """The kog flags contradict each other or the rest of the command line."""


def json_object(text: str) -> dict[str, Any]:
    """argparse type: a JSON object (also `kog bench --engine-args`)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg} at column {e.colno}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"tokens_per_step\": 8}}', got {text!r}")
    return value


json_object.__name__ = "JSON object"  # argparse names the type in its generic messages


def _kog_options(text: str) -> dict[str, Any]:
    """argparse type of --kog-options: a JSON object that KogConfig accepts."""
    value = json_object(text)
    try:
        KogConfig.from_dict(value)
    except KogConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


_kog_options.__name__ = "JSON object"


def add_backend_arguments(parser: argparse.ArgumentParser) -> bool:
    """Adds the kog flags to a vLLM engine parser and hooks the translation into its parse.

    Returns False, and changes nothing, when the parser already defines `--backend` (`vllm bench throughput`
    has its own `--backend {vllm,hf,...}`); there kog is selected with --worker-cls / --additional-config.
    Calling it again on the same parser is a no-op.
    """
    if getattr(parser, _HOOKED, False):
        return True
    existing = getattr(parser, "_option_string_actions", {})
    if "--backend" in existing or "--kog-options" in existing:
        return False
    group = parser.add_argument_group(
        "kog",
        "kog_backend: single-request decode backend. Without --backend kog nothing changes.",
    )
    # default=SUPPRESS: an absent flag leaves no attribute at all on the namespace.
    group.add_argument(
        "--backend",
        choices=BACKENDS,
        default=argparse.SUPPRESS,
        help="Execution backend. 'kog' runs single-request decode steps on kog's monokernel (sets --worker-cls "
        f"{WORKER_CLS} and additional_config['{CONFIG_KEY}']); 'stock' (the default) is vLLM unchanged.",
    )
    group.add_argument(
        "--kog-options",
        type=_kog_options,
        default=argparse.SUPPRESS,
        help=f"JSON object merged into additional_config['{CONFIG_KEY}'] with --backend kog, e.g. "
        f"'{{\"tokens_per_step\": 8}}'. Keys: {', '.join(sorted(KogConfig().to_dict()))}.",
    )
    _hook_parse(parser)
    return True


def _hook_parse(parser: argparse.ArgumentParser) -> None:
    # argparse reaches a parser's parse only through `parse_known_args`, called on the instance: by
    # `parse_args` for a top-level parser and by `_SubParsersAction.__call__` for `vllm serve`'s subparser
    # (CPython 3.10-3.13). An instance attribute therefore wraps exactly this parser.
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        namespace, extras = original(args, namespace)
        try:
            apply_backend_selection(namespace)
        except KogSelectionError as e:
            parser.error(str(e))
        return namespace, extras

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    setattr(parser, _HOOKED, True)


def apply_backend_selection(namespace: argparse.Namespace) -> None:
    """Rewrites `worker_cls` / `additional_config` on a parsed namespace per the rules in the module doc.

    Idempotent: applying it to its own result changes nothing.
    """
    backend = getattr(namespace, "backend", None)
    options = getattr(namespace, "kog_options", None)
    worker_cls = getattr(namespace, "worker_cls", _AUTO_WORKER)
    kog_worker = worker_cls == WORKER_CLS

    if backend == "kog":
        if worker_cls not in (_AUTO_WORKER, WORKER_CLS, None):
            raise KogSelectionError(
                f"--backend kog selects the worker {WORKER_CLS}, but --worker-cls {worker_cls} was also given; "
                "drop --worker-cls (kog's worker subclasses vLLM's GPU worker) or use --backend stock"
            )
        namespace.worker_cls = WORKER_CLS
        _merge_kog(namespace, options, enabled=True)
        _select_scheduler(namespace)
    elif backend not in (None, "stock"):  # unreachable through argparse (choices); guards direct callers
        raise KogSelectionError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    elif options is not None and not kog_worker:
        raise KogSelectionError(
            f"--kog-options needs the kog backend: add --backend kog (or --worker-cls {WORKER_CLS})"
        )
    elif backend == "stock" and kog_worker:
        if options is not None:
            raise KogSelectionError("--kog-options has no effect with --backend stock; drop one of them")
        _merge_kog(namespace, None, enabled=False)
    elif kog_worker:
        # Way 2 (--worker-cls given by hand): merge --kog-options if any, otherwise only check the options now
        # rather than in the worker.
        _merge_kog(namespace, options, enabled=None)
    # else: vLLM's own worker and no kog flag: the namespace stays exactly as parsed.


def _select_scheduler(namespace: argparse.Namespace) -> None:
    """KogScheduler (kog_backend/engine/scheduler.py): it retakes the position of a monokernel launch that aborted,
    keeps a lone request's kog step the only step in flight, and with tokens_per_step > 1 reserves and accounts for
    the bursts. A scheduler of the user's stays unless K > 1 was asked for (refused); async scheduling stays as the
    user set it (vLLM's default: on)."""
    kog = (getattr(namespace, "additional_config", None) or {}).get(CONFIG_KEY) or {}
    scheduler = getattr(namespace, "scheduler_cls", None)
    if scheduler not in (None, SCHEDULER_CLS):
        if "tokens_per_step" not in kog or KogConfig.from_dict(kog).tokens_per_step == 1:
            return  # the user's scheduler wins over kog's default K; the worker then runs 1 token per step
        raise KogSelectionError(
            f"tokens_per_step > 1 needs the scheduler {SCHEDULER_CLS}, but --scheduler-cls {scheduler} was given"
        )
    from kog_backend.engine import scheduling  # (imports neither torch nor vLLM)

    # Put back by KogCudaPlatform.check_and_update_config if kog will not run on this server (scheduling.py).
    scheduling.record_forced(scheduler)
    namespace.scheduler_cls = SCHEDULER_CLS


def _merge_kog(namespace: argparse.Namespace, options: dict[str, Any] | None, enabled: bool | None) -> None:
    user = getattr(namespace, "additional_config", None) or {}
    if not isinstance(user, dict):
        raise KogSelectionError(f"--additional-config must be a JSON object, got {user!r}")
    current = user.get(CONFIG_KEY) or {}
    if not isinstance(current, dict):
        raise KogSelectionError(
            f"additional_config['{CONFIG_KEY}'] must be a JSON object, got {type(current).__name__}: {current!r}"
        )
    kog = {**current, **(options or {})}
    if enabled is not None:
        kog["enabled"] = enabled
    try:
        KogConfig.from_dict(kog)
    except KogConfigError as e:
        raise KogSelectionError(f"bad kog options: {e}") from None
    if options is None and enabled is None:
        return  # way 2 as typed by the user: checked, left as is
    # A new dict: the parsed default may be an object shared with other parsers.
    namespace.additional_config = {**user, CONFIG_KEY: kog}
