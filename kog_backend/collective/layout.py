"""Python mirror of the collective's protocol constants, buffer layout and epoch arithmetic.

The source of truth is csrc/include/kog/allreduce.cuh; tests/test_collective_cpu.py parses that header and
checks every constant here, and (when the extension is built) compares `make_layout` with the C++ one.
Pure Python: no torch import.
"""

from __future__ import annotations

import dataclasses

# ---- constants of allreduce.cuh (same names without the leading k, in upper snake case) ----
MAX_WORLD = 8
THREADS = 128
MAX_BLOCKS = 64
PACK_BYTES = 16
LL_PACK_BYTES = 32
NUM_SETS = 2
HEADER_BYTES = 4096
CHECK_SLOT_BYTES = 256
ALIGN = 256
ERR_WORDS = 8
SPINS_PER_TIMER_READ = 256
DEFAULT_REFRESH_LOG2 = 20

ALGO_ONESHOT = 0
ALGO_TWOSHOT = 1

ERR_STATUS = 0
ERR_RANK = 1
ERR_MISSING = 2
ERR_EPOCH = 3
ERR_PHASE = 4
STATUS_OK = 0
STATUS_TIMEOUT = 1
PHASE_ONESHOT = 0
PHASE_REDUCE_SCATTER = 1
PHASE_ALL_GATHER = 2
PHASE_NAMES = {PHASE_ONESHOT: "one-shot", PHASE_REDUCE_SCATTER: "two-shot reduce-scatter",
               PHASE_ALL_GATHER: "two-shot all-gather"}

# World sizes with compiled kernels (launch_world in csrc/allreduce.cu).
SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)

EPOCH_MAX = 0xFFFFFFFF
EPOCH_AFTER_WRAP = 2


def next_epoch(e: int, epoch_max: int = EPOCH_MAX) -> int:
    """1, 2, ..., epoch_max, 2, 3, ...: 0 (the zeroed buffer) never occurs; parity alternates across the wrap
    when epoch_max is odd. `epoch_max` is a parameter only so that the protocol model can wrap quickly."""
    return EPOCH_AFTER_WRAP if e == epoch_max else e + 1


def set_of(e: int) -> int:
    return e & 1


def refresh_mask(log2: int) -> int:
    if not 1 <= log2 <= 30:
        raise ValueError(f"refresh_log2 {log2} out of [1, 30]")
    return (1 << log2) - 1


def is_refresh_epoch(e: int, mask: int) -> bool:
    return (e & mask) <= 1


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


@dataclasses.dataclass(frozen=True)
class Layout:
    """Byte offsets inside each rank's shared buffer (allreduce.cuh: struct Layout, same field order)."""

    oneshot_off: int
    oneshot_slot: int
    oneshot_set_stride: int
    oneshot_cap_packs: int
    rs_off: int
    ag_off: int
    chunk_slot: int
    chunk_set_stride: int
    chunk_cap_packs: int
    total: int

    def as_list(self) -> list[int]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    # Address arithmetic used by the kernels, for the protocol model and the tests.
    def oneshot_slot_off(self, s: int, src: int) -> int:
        return self.oneshot_off + s * self.oneshot_set_stride + src * self.oneshot_slot

    def rs_slot_off(self, s: int, src: int) -> int:
        return self.rs_off + s * self.chunk_set_stride + src * self.chunk_slot

    def ag_slot_off(self, s: int, owner: int) -> int:
        return self.ag_off + s * self.chunk_set_stride + owner * self.chunk_slot

    def check_slot_off(self, src: int) -> int:
        return src * CHECK_SLOT_BYTES


def validate_caps(world: int, oneshot_cap: int, twoshot_cap: int) -> None:
    if not 2 <= world <= MAX_WORLD:
        raise ValueError(f"world size {world} out of [2, {MAX_WORLD}]")
    if oneshot_cap < 0 or oneshot_cap % PACK_BYTES:
        raise ValueError(f"one-shot capacity {oneshot_cap} must be a non-negative multiple of {PACK_BYTES}")
    if twoshot_cap < 0 or twoshot_cap % (PACK_BYTES * world):
        raise ValueError(f"two-shot capacity {twoshot_cap} must be a non-negative multiple of 16 * world")


def make_layout(world: int, oneshot_cap: int, twoshot_cap: int) -> Layout:
    validate_caps(world, oneshot_cap, twoshot_cap)
    oneshot_cap_packs = oneshot_cap // PACK_BYTES
    oneshot_slot = round_up(oneshot_cap_packs * LL_PACK_BYTES, ALIGN)
    oneshot_set_stride = world * oneshot_slot
    chunk_cap_packs = twoshot_cap // (PACK_BYTES * world)
    chunk_slot = round_up(chunk_cap_packs * LL_PACK_BYTES, ALIGN)
    chunk_set_stride = world * chunk_slot
    oneshot_off = HEADER_BYTES
    rs_off = oneshot_off + NUM_SETS * oneshot_set_stride
    ag_off = rs_off + NUM_SETS * chunk_set_stride
    total = ag_off + NUM_SETS * chunk_set_stride
    return Layout(oneshot_off, oneshot_slot, oneshot_set_stride, oneshot_cap_packs, rs_off, ag_off, chunk_slot,
                  chunk_set_stride, chunk_cap_packs, total)


def grid_for(work_packs: int) -> int:
    """Blocks of a launch (allreduce.cuh: grid_for); every block owns at least one pack."""
    if work_packs <= 0:
        return 1
    return min((work_packs + THREADS - 1) // THREADS, MAX_BLOCKS)


def round_down_twoshot_cap(nbytes: int, world: int) -> int:
    unit = PACK_BYTES * world
    return nbytes // unit * unit
