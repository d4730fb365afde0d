"""`kog stats`: print the counters that kog workers persist (see kog_backend.path.counters)."""

from __future__ import annotations

import argparse
import json
import os
import time

from kog_backend.path.counters import read_all, state_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default="", help="directory the workers write to (default $KOG_STATE_DIR or /tmp/kog_backend)")
    p.add_argument("--json", action="store_true", help="print raw JSON")


def run(args: argparse.Namespace) -> int:
    directory = state_dir(args.state_dir)
    entries = read_all(directory)
    if args.json:
        print(json.dumps({name: snap for name, snap in entries}, indent=2))
        return 0
    if not entries:
        print(f"no kog counters under {directory} (no kog worker has run here, or another --state-dir)")
        return 1
    for name, s in entries:
        alive = _pid_alive(s.get("pid", -1))
        age = time.time() - s.get("updated", 0)
        print(f"{name}  pid {s.get('pid')} ({'running' if alive else 'exited'}), updated {age:.0f} s ago")
        print(f"  kog path: {s.get('kog_steps', 0)} steps, {s.get('kog_tokens', 0)} tokens")
        if s.get("run_ahead_used") or s.get("run_ahead_abandoned"):
            print(f"  run ahead: {s['run_ahead_used']} bursts used, {s['run_ahead_abandoned']} abandoned")
        single = s.get("single_token_steps") or {}
        if single:
            print(f"  of which one token per step (no burst): {sum(single.values())} steps")
            for reason, count in single.items():
                print(f"    {count:>8}  {reason}")
        print(f"  stock:    {s.get('fallback_steps', 0)} steps")
        for reason, count in s.get("fallbacks", {}).items():
            print(f"    {count:>8}  {reason}")
        if s.get("launch_aborts"):
            print(f"  monokernel launches aborted: {s['launch_aborts']} (their tokens discarded, the step ran stock)")
        if s.get("disabled_reason"):
            print(f"  kog disabled: {s['disabled_reason']}")
    return 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (OSError, TypeError):
        return False
    return True
