"""The tensor-core attention pass's round body in a built extension's SASS, per kernel instantiation: a static
reading that needs no GPU. For each `monokernel_kernel<D, HP, sampled, tp, fp8>` it finds the innermost loop that
holds `HMMA` instructions (the pass's round: load a warp's tiles, S^T = K Q^T, the online softmax, O^T += V^T P^T)
and prints its instruction count, the counts of the instructions that matter for a latency-bound round, and the
order of its global loads (L), shared loads (d), mma (M), shuffles (S) and exp2 (E): loads that appear after the
first M wait for a second memory round trip inside the round. It also counts the whole instantiation's local-memory
accesses (STL / LDL: spills and stack arrays) and those inside loops with FFMA (the stages' GEMV loops), where a
change to the attention code can push register spills into the weight stream's hot path.

    python benchmarks/sass_attention_loop.py kog_backend/_C.abi3.so [OTHER.so ...] [--kernel Li64ELi4ELb0ELb0ELb0E]

Needs cuobjdump and nvdisasm: CUDA_HOME/bin, PATH, or pip's `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm`
wheels (`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, which put them in site-packages/nvidia/cu13/bin).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

KERNEL = re.compile(r"Function : (_ZN3kog17monokernel_kernelI(\S+)EEvNS_8StepArgsE)")
INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
MARKS = (("LDG", "L"), ("LDS", "d"), ("HMMA", "M"), ("SHFL", "S"), ("MUFU.EX2", "E"))
COUNTED = ("HMMA", "LDG", "LDS", "SHFL", "MUFU", "IMAD", "ISETP", "SEL", "CS2R", "FMUL", "PRMT", "BRA", "STL", "LDL")


def tool_dir() -> str:
    """A folder holding both cuobjdump and nvdisasm."""
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin")]
    candidates += [str(Path(sysconfig.get_paths()["purelib"]) / "nvidia" / v / "bin") for v in ("cu13", "cu12")]
    found = shutil.which("nvdisasm")
    if found:
        candidates.insert(0, os.path.dirname(found))
    for d in candidates:
        if os.access(os.path.join(d, "cuobjdump"), os.X_OK) and os.access(os.path.join(d, "nvdisasm"), os.X_OK):
            return d
    sys.exit("sass_attention_loop: no cuobjdump + nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def kernels(so: str, tools: str) -> dict[str, list[tuple[int, str]]]:
    """Template arguments -> [(address, instruction)] of each monokernel instantiation in `so`."""
    env = dict(os.environ, PATH=tools + os.pathsep + os.environ.get("PATH", ""))
    text = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", so], capture_output=True, text=True, env=env,
                          check=True).stdout  # fmt: skip
    return parse_sass(text)


def parse_sass(text: str) -> dict[str, list[tuple[int, str]]]:
    """cuobjdump -sass output -> {template arguments: [(address, instruction)]} of the monokernel instantiations."""
    out: dict[str, list[tuple[int, str]]] = {}
    cur = None
    for line in text.splitlines():
        m = KERNEL.search(line)
        if m:
            cur = out.setdefault(m.group(2), [])
            continue
        if "Function :" in line:
            cur = None
            continue
        m = INSTR.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return out


def loops(ins: list[tuple[int, str]]) -> Iterator[list[str]]:
    """Each loop's body: the instructions from a backward branch's target to the branch (addresses ascend)."""
    addrs = [a for a, _ in ins]
    for i, (addr, text) in enumerate(ins):
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) <= addr:
            yield [t for _, t in ins[bisect.bisect_left(addrs, int(m.group(1), 16)) : i + 1]]


def round_body(ins: list[tuple[int, str]]) -> list[str] | None:
    """The smallest loop that holds an HMMA."""
    return min((body for body in loops(ins) if any("HMMA" in t for t in body)), key=len, default=None)


def local_accesses(ins: list[tuple[int, str]]) -> tuple[int, int, int]:
    """(STL, LDL in the whole function, local accesses inside loops of fewer than 1,000 instructions that hold an
    FFMA: the stages' GEMV loops)."""
    stl = sum(opcode(t) == "STL" for _, t in ins)
    ldl = sum(opcode(t) == "LDL" for _, t in ins)
    hot = sum(
        sum(opcode(t) in ("STL", "LDL") for t in body)
        for body in loops(ins)
        if len(body) < 1000 and any(opcode(t) == "FFMA" for t in body)
    )
    return stl, ldl, hot


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P[T0-9]\s+", "", text).split()[0].split(".")[0]


def summary(ins: list[tuple[int, str]]) -> tuple[int, collections.Counter, str] | None:
    """(instructions, opcode counts, mark string) of the round body, or None without one."""
    body = round_body(ins)
    if body is None:
        return None
    return len(body), collections.Counter(opcode(t) for t in body), "".join(c for t in body for k, c in MARKS if k in t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("so", nargs="+")
    ap.add_argument("--kernel", default="", help="substring of the instantiation's template arguments "
                    "(e.g. Li64ELi4ELb0ELb0ELb0E: head dim 64, 4 heads per pass, greedy, TP 1, bf16)")  # fmt: skip
    args = ap.parse_args()
    tools = tool_dir()
    for so in args.so:
        print(f"== {so}")
        for name, ins in sorted(kernels(so, tools).items()):
            if args.kernel not in name:
                continue
            got = summary(ins)
            if got is None:
                continue
            n, ops, order = got
            counts = " ".join(f"{k} {ops[k]}" for k in COUNTED if ops[k])
            stl, ldl, hot = local_accesses(ins)
            print(f"{name}: {n} instructions; {counts}\n    {order}\n    local memory: {stl} STL, {ldl} LDL; "
                  f"{hot} inside GEMV loops")


if __name__ == "__main__":
    main()
