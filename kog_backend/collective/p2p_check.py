"""Start-up check that the shared buffers really work, not just that the driver reports peer access.

1. Transfer round trip: every rank copies a known 256-byte pattern (a function of source and destination
   rank) into the check area of every peer's buffer through its IPC mapping; after a barrier every rank
   reads its own check area back and compares each source's bytes.
2. Kernel round trip (KogAllReduce._selftest): one one-shot and one two-shot all-reduce of integer-valued
   data through the real kernels, compared bit for bit with the expected sum, with a bounded wait.
Any failure on any rank disables the collective on every rank with the combined reason (NCCL is used).
"""

from __future__ import annotations

from kog_backend.collective import groupcomm, layout


def check_pattern(src: int, dst: int) -> bytes:
    """256 bytes, never all zero (the zeroed buffer), different for every (src, dst) pair."""
    return bytes(((i * 131 + src * 37 + dst * 11 + 0x5A) & 0xFF) for i in range(layout.CHECK_SLOT_BYTES))


def verify_check_area(area: bytes, rank: int, world: int) -> str | None:
    """`area` is this rank's check area (world * CHECK_SLOT_BYTES bytes) after every peer wrote to it."""
    bad = []
    for src in range(world):
        if src == rank:
            continue
        off = layout.CHECK_SLOT_BYTES * src
        got = area[off:off + layout.CHECK_SLOT_BYTES]
        want = check_pattern(src, rank)
        if got != want:
            ndiff = sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))
            bad.append(f"{ndiff}/{layout.CHECK_SLOT_BYTES} bytes from rank {src} wrong")
    return "IPC write/read round trip failed: " + ", ".join(bad) if bad else None


def transfer_check(ops, group, buf) -> str | None:
    """Collective. `buf` is the SharedBuffer; returns the shared verdict."""
    import torch

    dev = buf.device_index
    world = len(buf.bases)
    local = None
    try:
        for dst in range(world):
            if dst == buf.rank:
                continue
            pat = torch.frombuffer(bytearray(check_pattern(buf.rank, dst)), dtype=torch.uint8).to(f"cuda:{dev}")
            ops.ipc_copy(buf.bases[dst] + buf.rank * layout.CHECK_SLOT_BYTES, pat.data_ptr(),
                         layout.CHECK_SLOT_BYTES, dev)
            torch.cuda.synchronize(dev)  # `pat` must outlive the copy
    except RuntimeError as e:
        local = f"writing the check pattern to a peer failed: {e}"
    groupcomm.barrier(group)  # every pattern is in place (each writer synchronized before arriving)
    if local is None:
        try:
            area = torch.empty(world * layout.CHECK_SLOT_BYTES, dtype=torch.uint8, device=f"cuda:{dev}")
            ops.ipc_copy(area.data_ptr(), buf.bases[buf.rank], area.numel(), dev)
            local = verify_check_area(bytes(area.cpu().tolist()), buf.rank, world)
        except RuntimeError as e:
            local = f"reading the check area failed: {e}"
    return groupcomm.agree(group, local)
