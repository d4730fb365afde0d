"""Small collectives over a CPU (gloo) process group: the handle exchange and the all-ranks decisions.

Tensors only (no pickled objects), so they also work under torch.inference_mode and on vLLM's TP CPU group.
"""

from __future__ import annotations

REASON_BYTES = 240


def all_gather_ints(group, values: list[int]) -> list[list[int]]:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.tensor(values, dtype=torch.int64)
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine, group=group)
    return [t.tolist() for t in out]


def encode_reason(reason: str | None) -> list[int]:
    """[flag, len, bytes...] padded to REASON_BYTES + 2 ints."""
    if reason is None:
        return [0, 0] + [0] * REASON_BYTES
    raw = reason.encode("utf-8", "replace")[:REASON_BYTES]
    return [1, len(raw)] + list(raw) + [0] * (REASON_BYTES - len(raw))


def decode_reason(words: list[int]) -> str | None:
    if not words[0]:
        return None
    return bytes(words[2:2 + words[1]]).decode("utf-8", "replace")


def combine_reasons(reasons: list[str | None]) -> str | None:
    """One reason for all ranks, naming each rank that failed (None when every rank succeeded)."""
    failed = [(r, why) for r, why in enumerate(reasons) if why is not None]
    if not failed:
        return None
    return "; ".join(f"rank {r}: {why}" for r, why in failed)


def agree(group, local_reason: str | None) -> str | None:
    """Every rank passes its own verdict; every rank gets the same combined verdict."""
    gathered = all_gather_ints(group, encode_reason(local_reason))
    return combine_reasons([decode_reason(w) for w in gathered])


def barrier(group) -> None:
    all_gather_ints(group, [0])
