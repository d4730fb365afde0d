"""KogAllReduce: kog's one-shot / two-shot all-reduce over the ranks of a CPU (gloo) process group.

Construction is collective over `group` (vLLM's TP CPU group or any gloo group): it allocates and shares
the buffers, runs the start-up check, and on any failure leaves the object disabled with a reason (the
caller then uses NCCL). Calls must be issued in the same order with the same sizes on every rank and be
serialized on one stream (or inside CUDA graphs replayed in that order): the protocol's epochs advance
once per call on every rank.

No per-call registration is needed for CUDA graphs: the kernels read the caller's input and write the
caller's output directly; only the shared buffers (allocated here) cross processes, and the epoch lives
in device memory, so every replay uses a fresh epoch.
"""

from __future__ import annotations

import logging
import os

from kog_backend.collective import dispatch, groupcomm, layout, p2p_check
from kog_backend.collective.ipc import SharedBuffer

logger = logging.getLogger("kog_backend.collective")

DEFAULT_TIMEOUT_S = 600.0  # like NCCL's watchdog: ranks may legitimately be far apart (compilation, loading)
SELFTEST_TIMEOUT_S = 60.0


def timeout_from_env() -> float:
    return float(os.environ.get("KOG_AR_TIMEOUT_S", DEFAULT_TIMEOUT_S))


class KogAllReduce:
    def __init__(self, group, device, *, thresholds: dispatch.Thresholds | None = None,
                 timeout_s: float | None = None, trap_on_timeout: bool = True,
                 refresh_log2: int = layout.DEFAULT_REFRESH_LOG2, selftest: bool = True):
        import torch
        import torch.distributed as dist

        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.thresholds = thresholds or dispatch.Thresholds.for_world(self.world)
        self.timeout_s = timeout_from_env() if timeout_s is None else float(timeout_s)
        self.trap_on_timeout = trap_on_timeout
        self.refresh_log2 = refresh_log2
        layout.refresh_mask(refresh_log2)  # validates
        self.disabled_reason: str | None = None
        self._ops = None
        self._buffer: SharedBuffer | None = None
        self._handle = 0
        self._epochs = None
        self._error = None
        self.layout: layout.Layout | None = None

        reason = dispatch.static_disable_reason(self.world)
        if reason is None and device.type != "cuda":
            reason = f"device {device} is not a CUDA device"
        if reason is not None:  # identical on every rank: no collective needed to agree
            self._disable(reason)
            return
        try:
            self._setup(selftest)
        except Exception:
            self.close()
            raise

    # ---- set-up (collective) ----

    def _setup(self, selftest: bool) -> None:
        import torch

        from kog_backend.collective._ext import load_ops

        local = None
        try:
            self._ops = load_ops()
        except ImportError as e:
            local = str(e)
        reason = groupcomm.agree(self.group, local)
        if reason is not None:
            return self._disable(reason)

        th = self.thresholds
        self.oneshot_cap = th.oneshot_max
        self.twoshot_cap = th.twoshot_max
        self.layout = layout.make_layout(self.world, self.oneshot_cap, self.twoshot_cap)
        self._buffer, reason = SharedBuffer.create(self._ops, self.group, self.device.index, self.layout.total)
        if reason is not None:
            return self._disable(reason)
        reason = p2p_check.transfer_check(self._ops, self.group, self._buffer)
        if reason is not None:
            return self._disable_and_free(reason)

        self._epochs = torch.zeros(layout.MAX_BLOCKS, dtype=torch.int32, device=self.device)
        self._error = torch.zeros(layout.ERR_WORDS, dtype=torch.int32, pin_memory=True)
        if selftest:
            reason = self._selftest()
            if reason is not None:
                return self._disable_and_free(reason)
        self._handle = self._make_handle(self.timeout_s, self.trap_on_timeout)
        logger.info("kog all-reduce ready: rank %d/%d, one-shot <= %d B, two-shot <= %d B, buffer %d B",
                    self.rank, self.world, th.oneshot_max, th.twoshot_max, self.layout.total)

    def _make_handle(self, timeout_s: float, trap: bool) -> int:
        return self._ops.allreduce_init(self._buffer.bases, self.rank, self.oneshot_cap, self.twoshot_cap,
                                        self._buffer.nbytes, self._epochs, self._error,
                                        max(1, int(timeout_s * 1e9)), self.refresh_log2, trap)

    def _selftest(self) -> str | None:
        """Collective: one call of each algorithm through the real kernels, checked bit for bit."""
        import torch

        handle = self._make_handle(min(self.timeout_s, SELFTEST_TIMEOUT_S), False)
        local = None
        try:
            for algo, nbytes in ((layout.ALGO_ONESHOT, min(self.oneshot_cap, 4096)),
                                 (layout.ALGO_TWOSHOT, layout.round_down_twoshot_cap(min(self.twoshot_cap, 65536),
                                                                                     self.world))):
                if nbytes == 0:
                    continue
                n = nbytes // 4
                idx = torch.arange(n, device=self.device, dtype=torch.int64)
                x = ((idx * 7 + self.rank * 3) % 23 - 11).to(torch.float32)
                want = sum(((idx * 7 + r * 3) % 23 - 11) for r in range(self.world)).to(torch.float32)
                out = torch.full_like(x, float("nan"))
                self._ops.allreduce(handle, x, out, algo)
                torch.cuda.synchronize(self.device)
                if self._error[layout.ERR_STATUS].item() != layout.STATUS_OK:
                    local = self.error_message()
                    break
                if not torch.equal(out, want):
                    bad = int((out != want).sum().item())
                    local = f"kernel self-test ({'one' if algo == 0 else 'two'}-shot, {nbytes} B): {bad}/{n} wrong"
                    break
        except RuntimeError as e:
            local = f"kernel self-test raised: {e}"
        finally:
            self._ops.allreduce_dispose(handle)
        return groupcomm.agree(self.group, local)

    def _disable_and_free(self, reason: str) -> None:
        """Collective: every rank reaches it with the same (agreed) reason."""
        self._disable(reason)
        buf, self._buffer = self._buffer, None
        buf.close(group=self.group)

    def _disable(self, reason: str) -> None:
        if self.disabled_reason is None:
            self.disabled_reason = reason
            logger.warning("kog all-reduce disabled (NCCL is used instead): %s", reason)

    # ---- calls ----

    @property
    def disabled(self) -> bool:
        return self.disabled_reason is not None or not self._handle

    def choose(self, t) -> tuple[int | None, str | None]:
        """(algo, None) when kog takes `t`, else (None, reason)."""
        why = self.disabled_reason if self.disabled_reason is not None or self._handle else "not initialised"
        return dispatch.should_use(t, world=self.world, device=self.device, th=self.thresholds, disabled_reason=why)

    def should_use(self, t) -> str | None:
        """None when kog handles `t`, else the reason it does not."""
        return self.choose(t)[1]

    def all_reduce(self, t, out=None, algo: int | None = None):
        """Out-of-place sum over the group (out may be `t` itself for an in-place call)."""
        import torch

        if algo is None:
            algo, reason = self.choose(t)
            if reason is not None:
                raise ValueError(f"kog all-reduce cannot take this tensor: {reason}")
        if out is None:
            out = torch.empty_like(t)
        try:
            self._ops.allreduce(self._handle, t, out, algo)
        except RuntimeError:
            self.raise_if_failed()
            raise
        return out

    def set_timeout(self, timeout_s: float, trap_on_timeout: bool | None = None) -> None:
        """Local: re-creates the launch handle (state lives in device memory, so nothing is lost)."""
        if self._handle:
            self._ops.allreduce_dispose(self._handle)
            self._handle = 0
        self.timeout_s = float(timeout_s)
        if trap_on_timeout is not None:
            self.trap_on_timeout = trap_on_timeout
        if self.disabled_reason is None and self._buffer is not None:
            self._handle = self._make_handle(self.timeout_s, self.trap_on_timeout)

    # ---- errors ----

    def failed(self) -> bool:
        """Non-blocking: True once a kernel has recorded a timeout (reads pinned host memory)."""
        return self._error is not None and int(self._error[layout.ERR_STATUS]) != layout.STATUS_OK

    def error_message(self) -> str:
        e = [int(v) for v in self._error.tolist()]
        phase = layout.PHASE_NAMES.get(e[layout.ERR_PHASE], f"phase {e[layout.ERR_PHASE]}")
        return (f"kog all-reduce timed out: rank {e[layout.ERR_RANK]} waited more than {self.timeout_s:g} s in the "
                f"{phase} phase (epoch {e[layout.ERR_EPOCH] & 0xFFFFFFFF}) for rank {e[layout.ERR_MISSING]}, "
                f"which never delivered its data (it did not make the same call, crashed or hangs)")

    def raise_if_failed(self) -> None:
        """Raises TimeoutError naming the missing rank if a kernel timed out (call after synchronizing)."""
        if self.failed():
            msg = self.error_message()
            self._disable(msg)
            raise TimeoutError(msg)

    # ---- teardown ----

    def close(self) -> None:
        """Collective when the buffers were shared (waits for every rank before freeing)."""
        if self._handle:
            self._ops.allreduce_dispose(self._handle)
            self._handle = 0
        if self._buffer is not None:
            buf, self._buffer = self._buffer, None
            buf.close(group=self.group)
        if self.disabled_reason is None:
            self.disabled_reason = "closed"
