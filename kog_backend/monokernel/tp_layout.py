"""The buffer each rank of a TP monokernel shares with the others through CUDA IPC (csrc/include/kog/tp.cuh).

Shared buffer of one rank (bytes, from its base; every rank's has the same layout):
  [0, counters)            the kernel's dependency counters (layout.num_counters words), so peers can add to them
  [keys, keys + 16 W)      uint64 [2 (token parity)][W]: each rank's best LM-head key of a token
  [parts, parts + 4 L W H) bf16 [L][2 (O, down)][W][H]: each rank's partial sums of a layer's O / down projections
For Llama-3.2-1B at W = 2: 256 KiB of partials plus 7 KiB of counters per rank.
"""

from __future__ import annotations

import dataclasses

from kog_backend.monokernel import layout
from kog_backend.path.model_spec import DecoderShape


@dataclasses.dataclass(frozen=True)
class TPBufferLayout:
    counters: int  # byte offsets from the buffer's base
    keys: int
    parts: int
    nbytes: int


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


def tp_buffer_layout(shape: DecoderShape, world: int) -> TPBufferLayout:
    counters = _align(layout.num_counters(shape.num_layers, shape.num_kv_heads) * 4)
    keys = _align(2 * world * 8)
    parts = shape.num_layers * 2 * world * shape.hidden_size * 2
    return TPBufferLayout(counters=0, keys=counters, parts=counters + keys, nbytes=_align(counters + keys + parts))
