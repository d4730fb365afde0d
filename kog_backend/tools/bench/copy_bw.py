"""Device-to-device copy bandwidth of one GPU, the ceiling every figure is compared with.

A 4 GiB buffer is copied into another with `Tensor.copy_`; bytes read plus bytes written over the time of
the copy (CUDA events), median of `reps` after `warmup` (measured-baselines.md: 2.00 ms, 4.29 TB/s on H200).
4 GiB is far past the 60 MB L2, so no repetition is served from cache.
"""

from __future__ import annotations

import statistics

from kog_backend.tools.bench.metrics import copy_bandwidth

COPY_BYTES = 4 * 2**30


def measure_copy_bandwidth(nbytes: int = COPY_BYTES, reps: int = 10, warmup: int = 2, device: int = 0) -> tuple[float, list[float]]:
    """Returns (median bytes/s, per-copy seconds). Frees its buffers before returning."""
    import torch

    dev = torch.device("cuda", device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    src.fill_(1)
    times = []
    try:
        for i in range(warmup + reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end) / 1e3)
    finally:
        del src, dst
        torch.cuda.empty_cache()
    return copy_bandwidth(nbytes, statistics.median(times)), times
