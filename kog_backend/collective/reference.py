"""Pure-Python model of the collective's protocol: the kernels' schedule on a word-level memory model.

Each rank's shared buffer is a list of 64-bit words laid out by `layout.make_layout`. A kernel is a grid
of blocks of threads; every thread is a generator that performs exactly the loads and stores of the CUDA
code (allreduce.cuh: oneshot_kernel / twoshot_kernel, refresh_set, begin_call / finish_call) and yields
after each one, so the scheduler can interleave every 64-bit access of every thread of every rank. Each
rank runs its calls in order (a kernel starts once the previous one has finished: stream order). Payloads
are u32 words summed modulo 2^32 in rank order (the kernels sum fp32 in the same order).

The scheduler reports a hang (every live thread polls a word that no pending store can change) and the
caller compares every output with the exact sum, so the model catches both kinds of protocol failure:
overwriting a slot a peer has not read yet (-> hang or wrong data) and accepting stale data. The knobs
`num_sets`, `epoch_max` and `refresh_log2` exist to show that (tests run the protocol with them broken).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

from kog_backend.collective import layout

MASK32 = 0xFFFFFFFF
_BLOCKED = "blocked"


class ProtocolHang(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Call:
    algo: int  # layout.ALGO_ONESHOT / ALGO_TWOSHOT
    inputs: tuple[tuple[tuple[int, int, int, int], ...], ...]  # inputs[rank][pack] = 4 u32 words

    @property
    def npacks(self) -> int:
        return len(self.inputs[0])

    def expected(self) -> list[tuple[int, ...]]:
        world = len(self.inputs)
        return [tuple(sum(self.inputs[r][i][w] for r in range(world)) & MASK32 for w in range(4))
                for i in range(self.npacks)]


@dataclasses.dataclass
class ModelConfig:
    world: int
    oneshot_cap: int = 8 * layout.PACK_BYTES
    twoshot_cap: int | None = None  # default: 4 packs per chunk
    threads: int = 2                # per block (the kernels use layout.THREADS)
    max_blocks: int = 3             # grid cap (the kernels use layout.MAX_BLOCKS)
    num_sets: int = layout.NUM_SETS  # 1 breaks the reuse argument (negative tests)
    epoch_max: int = layout.EPOCH_MAX
    refresh_log2: int | None = layout.DEFAULT_REFRESH_LOG2  # None: never refresh (negative tests)
    initial_epoch: int = 0

    def __post_init__(self):
        if self.twoshot_cap is None:
            self.twoshot_cap = 4 * layout.PACK_BYTES * self.world


class Model:
    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.L = layout.make_layout(cfg.world, cfg.oneshot_cap, cfg.twoshot_cap)
        self.mem = [[0] * (self.L.total // 8) for _ in range(cfg.world)]
        self.epochs = [[cfg.initial_epoch] * cfg.max_blocks for _ in range(cfg.world)]
        self.mask = None if cfg.refresh_log2 is None else layout.refresh_mask(cfg.refresh_log2)

    # ---- primitives (one 64-bit access each) ----
    def _store_pack(self, dst: int, off: int, v, e: int) -> Iterator[str]:
        for w in range(4):
            self.mem[dst][off // 8 + w] = (e << 32) | v[w]
            yield "store"

    def _wait_pack(self, rank: int, off: int, e: int, out: list) -> Iterator[str]:
        while True:
            words = []
            for w in range(4):
                words.append(self.mem[rank][off // 8 + w])
                yield "load"
            if all((x >> 32) == e for x in words):
                out[:] = [x & MASK32 for x in words]
                return
            yield _BLOCKED

    def _grid(self, work: int) -> int:
        return max(1, min((work + self.cfg.threads - 1) // self.cfg.threads, self.cfg.max_blocks))

    def _set(self, e: int) -> int:
        return e % self.cfg.num_sets

    def _refresh(self, e: int) -> bool:
        return self.mask is not None and layout.is_refresh_epoch(e, self.mask)

    def _refresh_set(self, rank, e, oneshot_used, chunk_used, first, stride) -> Iterator[str]:
        L, W, s = self.L, self.cfg.world, self._set(e)
        for slot, used, cap in ((L.oneshot_slot_off(s, rank), oneshot_used, L.oneshot_cap_packs),
                                (L.rs_slot_off(s, rank), chunk_used, L.chunk_cap_packs),
                                (L.ag_slot_off(s, rank), chunk_used, L.chunk_cap_packs)):
            for i in range(used + first, cap, stride):
                for k in range(1, W):
                    yield from self._store_pack((rank + k) % W, slot + i * layout.LL_PACK_BYTES, (0, 0, 0, 0), e)

    # ---- kernels: one generator per thread; `e` is read by the block when it starts ----
    def _oneshot_thread(self, rank, call: Call, out, e, b, t, grid) -> Iterator[str]:
        L, W, s = self.L, self.cfg.world, self._set(e)
        first, stride, n, inp = b * self.cfg.threads + t, grid * self.cfg.threads, call.npacks, call.inputs[rank]
        for i in range(first, n, stride):
            for k in range(1, W):
                yield from self._store_pack((rank + k) % W, L.oneshot_slot_off(s, rank) + i * 32, inp[i], e)
        if self._refresh(e):
            yield from self._refresh_set(rank, e, n, 0, first, stride)
        for i in range(first, n, stride):
            acc = [0, 0, 0, 0]
            for j in range(W):
                v = list(inp[i])
                if j != rank:
                    yield from self._wait_pack(rank, L.oneshot_slot_off(s, j) + i * 32, e, v)
                acc = [(a + x) & MASK32 for a, x in zip(acc, v)]
            out[i] = tuple(acc)

    def _twoshot_thread(self, rank, call: Call, out, e, b, t, grid) -> Iterator[str]:
        L, W, s = self.L, self.cfg.world, self._set(e)
        first, stride, inp = b * self.cfg.threads + t, grid * self.cfg.threads, call.inputs[rank]
        C = call.npacks // W
        for k in range(first, C, stride):
            for step in range(1, W):
                dst = (rank + step) % W
                yield from self._store_pack(dst, L.rs_slot_off(s, rank) + k * 32, inp[dst * C + k], e)
        if self._refresh(e):
            yield from self._refresh_set(rank, e, 0, C, first, stride)
        for k in range(first, C, stride):
            acc = [0, 0, 0, 0]
            for j in range(W):
                v = list(inp[rank * C + k])
                if j != rank:
                    yield from self._wait_pack(rank, L.rs_slot_off(s, j) + k * 32, e, v)
                acc = [(a + x) & MASK32 for a, x in zip(acc, v)]
            out[rank * C + k] = tuple(acc)
            for step in range(1, W):
                yield from self._store_pack((rank + step) % W, L.ag_slot_off(s, rank) + k * 32, tuple(acc), e)
        for k in range(first, C, stride):
            for step in range(1, W):
                j = (rank + step) % W
                v = [0, 0, 0, 0]
                yield from self._wait_pack(rank, L.ag_slot_off(s, j) + k * 32, e, v)
                out[j * C + k] = tuple(v)

    def _block(self, rank, call: Call, out, b, grid) -> list[Iterator[str]]:
        """A block: reads its epoch copy when first scheduled, runs its threads, then publishes the epoch."""
        state = {"e": None, "left": self.cfg.threads}
        body = self._oneshot_thread if call.algo == layout.ALGO_ONESHOT else self._twoshot_thread

        def thread(t):
            if state["e"] is None:
                state["e"] = layout.next_epoch(self.epochs[rank][b], self.cfg.epoch_max)
                yield "load"
            yield from body(rank, call, out, state["e"], b, t, grid)
            state["left"] -= 1
            if state["left"] == 0:  # finish_call: after the block's __syncthreads
                for i in range(b, self.cfg.max_blocks, grid):
                    self.epochs[rank][i] = state["e"]
                yield "store"

        return [thread(t) for t in range(self.cfg.threads)]

    # ---- scheduler ----
    def run(self, calls: list[Call], seed: int = 0, policy: str = "random", max_steps: int = 10_000_000
            ) -> list[list[list[tuple[int, ...]]]]:
        """Runs `calls` on every rank; returns outputs[call][rank][pack]. Raises ProtocolHang."""
        rng = random.Random(seed)
        W = self.cfg.world
        outputs = [[[None] * c.npacks for _ in range(W)] for c in calls]
        next_call = [0] * W
        threads: dict[tuple[int, int], Iterator[str]] = {}  # (rank, thread id) -> generator
        blocked: set[tuple[int, int]] = set()
        ids = iter(range(1 << 62))

        def launch(r):
            c = next_call[r]
            if c < len(calls):
                call = calls[c]
                work = call.npacks if call.algo == layout.ALGO_ONESHOT else call.npacks // W
                grid = self._grid(work)
                for b in range(grid):
                    for th in self._block(r, call, outputs[c][r], b, grid):
                        threads[(r, next(ids))] = th

        for r in range(W):
            launch(r)
        for _ in range(max_steps):
            live = sorted(k for k in threads if k not in blocked)
            if not live:
                if threads:
                    raise ProtocolHang(f"every thread waits; call index per rank: {next_call}")
                return outputs
            key = live[0] if policy == "rank_priority" else rng.choice(live)
            try:
                what = next(threads[key])
            except StopIteration:
                del threads[key]
                r = key[0]
                if not any(k[0] == r for k in threads):  # kernel done: the next one starts (stream order)
                    next_call[r] += 1
                    launch(r)
                continue
            if what == _BLOCKED:
                blocked.add(key)
            elif what == "store":
                blocked.clear()
        raise ProtocolHang(f"no completion within {max_steps} steps")


def random_calls(world: int, n: int, cfg: ModelConfig, seed: int, algos=(0, 1)) -> list[Call]:
    """n calls of random algorithm and size (within the model's capacities) with random u32 payloads."""
    rng = random.Random(seed)
    L = layout.make_layout(world, cfg.oneshot_cap, cfg.twoshot_cap)
    calls = []
    for _ in range(n):
        algo = rng.choice(algos)
        npacks = (rng.randint(1, L.oneshot_cap_packs) if algo == layout.ALGO_ONESHOT
                  else world * rng.randint(1, L.chunk_cap_packs))
        calls.append(make_call(algo, npacks, world, rng))
    return calls


def make_call(algo: int, npacks: int, world: int, rng: random.Random) -> Call:
    return Call(algo, tuple(tuple(tuple(rng.randrange(1 << 28) for _ in range(4)) for _ in range(npacks))
                            for _ in range(world)))
