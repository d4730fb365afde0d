"""The KV cache vLLM allocated, as the kog path reads it: one bf16 tensor per layer, logical
[num_blocks, num_kv_heads, block_size, 2 * head_dim] (K in [..., :D], V in [..., D:]), NHD or HND in memory.

The torch step needs the layout; the monokernel also needs 16-byte-aligned head rows and one set of strides for
every layer (it reads them once into its argument table). A reason turns kog off for the whole server.
"""

from __future__ import annotations

from typing import Any

# KV-cache block sizes (positions per block) the kernel tests cover (integration_tests/test_monokernel_gpu.py and
# test_monokernel_long_context_gpu.py, which imports this constant); vLLM's default is 16. Powers of two only: the
# attention split finds a position's block and row with a shift and a mask (attn_split.cuh, KvSource::row).
TESTED_BLOCK_SIZES = (16, 32, 64, 128)

REASONS = {
    "groups": "several KV-cache groups (hybrid or sliding-window attention)",
    "not_bf16_tensor": "KV cache of layer {layer} is not a bf16 tensor",
    "layout": "KV cache of shape {shape} is not the flash layout [blocks, kv_heads, block, 2*{head_dim}]",
    "head_dim_strided": "KV cache's head dimension is not contiguous",
    "page_order": "KV cache strides {strides} of shape {shape} are neither NHD (*, {nhd}) nor HND (*, {hnd}) "
                  "with whole pages",
    "block_size": "KV cache block size {block} (tested: {tested})",
    # the monokernel's requirements (monokernel.unsupported_reason)
    "dtype": "KV cache of layer {layer} is {dtype}; the kernel reads the model's dtype (bf16) only",
    "device": "KV cache of layer {layer} is on {device}, not {expected}",
    "shape": "KV cache of layer {layer} has shape {shape}, expected [blocks, {kv_heads}, block, {row}]",
    "alignment": "KV cache of layer {layer} (strides {strides}) is not 16-byte aligned per head row",
    "strides": "KV cache of layer {layer} has strides {strides}, layer 0 has {first} (one set of strides only)",
}


def groups_reason(num_groups: int) -> str | None:
    return REASONS["groups"] if num_groups != 1 else None


def layer_reason(layer: int, cache: Any) -> str | None:
    """vLLM's kv_cache attribute of one attention layer (its first entry if a list)."""
    import torch

    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.bfloat16:
        return REASONS["not_bf16_tensor"].format(layer=layer)
    return None


def layout_reason(cache: Any, head_dim: int) -> str | None:
    """vLLM's flash layout (FLASH_ATTN, TRITON_ATTN), logical [num_blocks, num_kv_heads, block_size, 2 * head_dim],
    whose head dimension is contiguous (model_spec.kv_cache_view reads every other stride; the torch step reads
    any such cache)."""
    if cache.dim() != 4 or cache.shape[-1] != 2 * head_dim:
        return REASONS["layout"].format(shape=tuple(cache.shape), head_dim=head_dim)
    if cache.stride(-1) != 1:
        return REASONS["head_dim_strided"]
    return None


def served_layout_reason(cache: Any, head_dim: int) -> str | None:
    """What a server's KV cache must be for the kog path (the runner checks every layer): layout_reason's flash
    layout, in NHD memory order ([blocks][block_size][kv_heads][2D], vLLM's default) or HND ([blocks][kv_heads]
    [block_size][2D], VLLM_KV_CACHE_LAYOUT=HND) within a block, a block stride of at least one page (vLLM pads or
    packs pages for some configurations; the kernel reads the stride), and a block size in TESTED_BLOCK_SIZES.
    Element units (bf16)."""
    reason = layout_reason(cache, head_dim)
    if reason is not None:
        return reason
    shape = tuple(cache.shape)
    _, nkv, bs, d2 = shape
    strides = tuple(cache.stride())
    nhd, hnd = (d2, nkv * d2, 1), (bs * d2, d2, 1)
    if strides[1:] not in (nhd, hnd) or strides[0] < nkv * bs * d2:
        return REASONS["page_order"].format(strides=strides, shape=shape, nhd=nhd, hnd=hnd)
    if bs not in TESTED_BLOCK_SIZES:
        return REASONS["block_size"].format(block=bs, tested=", ".join(map(str, TESTED_BLOCK_SIZES)))
    return None


def monokernel_reason(layer: int, kv: Any, num_kv_heads: int, head_dim: int, device: Any, first: Any) -> str | None:
    """One layer's cache as the monokernel reads it; `first` is layer 0's cache (None for layer 0 itself)."""
    import torch

    if kv.dtype != torch.bfloat16:
        return REASONS["dtype"].format(layer=layer, dtype=kv.dtype)
    if kv.device != device:
        return REASONS["device"].format(layer=layer, device=kv.device, expected=device)
    if kv.dim() != 4 or kv.shape[1] != num_kv_heads or kv.shape[3] != 2 * head_dim:
        return REASONS["shape"].format(layer=layer, shape=tuple(kv.shape), kv_heads=num_kv_heads, row=2 * head_dim)
    if kv.stride(3) != 1 or any(kv.stride(d) % 8 for d in range(3)) or kv.data_ptr() % 16:
        return REASONS["alignment"].format(layer=layer, strides=kv.stride())
    if first is not None and (kv.stride() != first.stride() or kv.shape != first.shape):
        return REASONS["strides"].format(layer=layer, strides=kv.stride(), first=first.stride())
    return None
