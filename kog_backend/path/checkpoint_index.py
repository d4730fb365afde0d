"""The tensor index of a safetensors checkpoint: every tensor's name, shape and dtype, read from the files' headers
(standard library only: no tensor is loaded).

A .safetensors file starts with an 8-byte little-endian header length, then that many bytes of JSON:
{name: {"dtype": "F8_E4M3", "shape": [N, K], "data_offsets": [begin, end]}, "__metadata__": {...}}.
"""

from __future__ import annotations

import json
import os
import struct

# safetensors dtype tag -> torch dtype name
DTYPES = {
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "BF16": "bfloat16",
    "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8", "U8": "uint8", "I16": "int16",
    "I32": "int32", "I64": "int64", "BOOL": "bool",
}

TensorIndex = dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, torch dtype name)


def read_header(path: str) -> TensorIndex:
    """The tensors of one .safetensors file."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return {name: (tuple(int(d) for d in info["shape"]), DTYPES.get(info["dtype"], info["dtype"]))
            for name, info in header.items() if name != "__metadata__"}


def read_index(checkpoint_dir: str) -> TensorIndex:
    """The tensors of every .safetensors file in checkpoint_dir (one file, or the shards of an index)."""
    out: TensorIndex = {}
    for name in sorted(os.listdir(checkpoint_dir)):
        if name.endswith(".safetensors"):
            out.update(read_header(os.path.join(checkpoint_dir, name)))
    return out
