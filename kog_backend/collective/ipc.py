"""One device buffer per rank, shared with every rank of a CPU group through CUDA IPC.

`SharedBuffer.create` is collective: every rank allocates (zeroed), exports its handle, gathers the others'
over the group and opens them. Failures on any rank are gathered too, so every rank returns the same
verdict instead of one rank raising while the others wait.
"""

from __future__ import annotations

import logging
import socket

from kog_backend.collective import groupcomm

logger = logging.getLogger("kog_backend.collective")

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


def _node_id() -> int:
    """A 62-bit id of this host (CUDA IPC only works between processes of one node)."""
    import hashlib

    name = socket.gethostname()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            name += f.read().strip()
    except OSError:
        pass
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 2


class SharedBuffer:
    def __init__(self, ops, device_index: int, nbytes: int, rank: int, bases: list[int]):
        self.ops = ops
        self.device_index = device_index
        self.nbytes = nbytes
        self.rank = rank
        self.bases = bases  # bases[r]: rank r's buffer in this process's address space (ours at [rank])
        self.closed = False

    @classmethod
    def create(cls, ops, group, device_index: int, nbytes: int) -> tuple[SharedBuffer | None, str | None]:
        import torch.distributed as dist

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        nodes = groupcomm.all_gather_ints(group, [_node_id()])
        if len({n[0] for n in nodes}) != 1:
            return None, "the group spans several nodes (CUDA IPC needs one node)"

        own, local_reason, handle = 0, None, [0] * HANDLE_BYTES
        try:
            own = ops.ipc_alloc(nbytes, device_index)
            handle = list(ops.ipc_get_handle(own, device_index))
        except RuntimeError as e:
            local_reason = f"allocating/exporting {nbytes} B failed: {e}"
        gathered = groupcomm.all_gather_ints(group, [0 if local_reason is None else 1] + handle)
        reason = groupcomm.combine_reasons(
            ["could not export its buffer" if g[0] else None for g in gathered])

        bases = [0] * world
        if reason is None:
            bases[rank] = own
            for r, g in enumerate(gathered):
                if r == rank:
                    continue
                try:
                    bases[r] = ops.ipc_open(g[1:], device_index)
                except RuntimeError as e:
                    local_reason = f"cudaIpcOpenMemHandle of rank {r}'s buffer failed: {e}"
                    break
            reason = groupcomm.agree(group, local_reason)

        bases[rank] = own
        buf = cls(ops, device_index, nbytes, rank, bases)
        if reason is not None:
            buf.close(group=group)  # every rank is on this branch (the verdict is shared)
            return None, reason
        return buf, None

    def close(self, group=None) -> None:
        """Unmaps the peers' buffers, waits for every rank to do the same (when `group` is given), then frees
        ours. Without a group our buffer is freed at once, which is only safe when no peer mapped it."""
        if self.closed:
            return
        self.closed = True
        import torch

        try:
            if torch.cuda.is_initialized():  # otherwise no kernel of this process can be using the buffers
                torch.cuda.synchronize(self.device_index)
        except RuntimeError as e:  # a sticky context error: nothing can be freed safely any more
            logger.warning("kog collective: not freeing IPC buffers after a CUDA error: %s", e)
            return
        for r, b in enumerate(self.bases):
            if r != self.rank and b:
                try:
                    self.ops.ipc_close(b, self.device_index)
                except RuntimeError as e:
                    logger.warning("kog collective: closing rank %d's IPC mapping failed: %s", r, e)
        if group is not None:
            try:
                groupcomm.barrier(group)
            except RuntimeError as e:
                logger.warning("kog collective: barrier before freeing the IPC buffer failed (%s); leaking it", e)
                return
        own = self.bases[self.rank]
        if own:
            self.ops.ipc_free(own, self.device_index)
        self.bases = [0] * len(self.bases)
