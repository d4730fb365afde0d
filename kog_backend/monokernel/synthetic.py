"""Random-weight decoders and paged KV caches built directly on a device, in vLLM's layout (no vLLM needed).

Used by the GPU kernel tests and benchmarks/bench_monokernel.py. Scales keep activations O(1): projections
N(0, 1/in), embedding N(0, 1), norms 1 + N(0, 0.1^2). With `fp8` (a quant_format layout: tensor, channel, block)
the same bf16 projections are quantised to float8 e4m3 by `kog make-checkpoint --fp8`'s quantiser, each fused
matrix (qkv, gate_up) as one tensor, with fp32 scales in the kernel's layout (model_spec's module docstring).
"""

from __future__ import annotations

import math

import torch

from kog_backend.path.model_spec import DecoderShape, DecoderWeights, LayerWeights, kv_cache_view
from kog_backend.path.quant_format import LAYOUTS

SHAPES = {
    # name: (arch, layers, hidden, heads, kv heads, head dim, intermediate, vocab, tied)
    "llama-3.2-1b": ("llama", 16, 2048, 32, 8, 64, 8192, 128256, True),
    "qwen3-1.7b": ("qwen3", 28, 2048, 16, 8, 128, 6144, 151936, True),
    "llama-3.1-8b": ("llama", 32, 4096, 32, 8, 128, 14336, 128256, False),
    # the shape classes the derived tiling opened (hidden 2560 / 3584 / 5120 / 896, GQA 3-7, down rows > 32 KiB:
    # enlarged slots); layer counts as published (the GPU tests cut them)
    "qwen3-4b": ("qwen3", 36, 2560, 32, 8, 128, 9728, 151936, True),
    "qwen3-14b": ("qwen3", 40, 5120, 40, 8, 128, 17408, 151936, False),
    "qwen3-32b": ("qwen3", 64, 5120, 64, 8, 128, 25600, 151936, False),
    "qwen2.5-0.5b": ("qwen2", 24, 896, 14, 2, 64, 4864, 151936, True),
    "qwen2.5-coder-1.5b": ("qwen2", 28, 1536, 12, 2, 128, 8960, 151936, True),
    "qwen2.5-coder-7b": ("qwen2", 28, 3584, 28, 4, 128, 18944, 152064, False),
    "qwen2.5-coder-32b": ("qwen2", 64, 5120, 40, 8, 128, 27648, 152064, False),
    "llama-3.2-3b": ("llama", 28, 3072, 24, 8, 128, 8192, 128256, True),
    "mistral-7b": ("llama", 32, 4096, 32, 8, 128, 14336, 32768, False),
}


def make_shape(arch, layers, hidden, heads, kv_heads, head_dim, inter, vocab, tied, max_position=40960):
    return DecoderShape(
        arch=arch, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=inter, vocab_size=vocab, padded_vocab_local=(vocab + 63) // 64 * 64,
        vocab_start=0, rms_eps=1e-6 if arch in ("qwen3", "qwen2") else 1e-5, qk_norm=arch == "qwen3",
        tied_embeddings=tied, max_position=max_position, qkv_bias=arch == "qwen2",
    )  # fmt: skip


def rope_cache(max_position: int, head_dim: int, theta: float, device) -> torch.Tensor:
    """[max_position, D] bf16: cos | sin halves (neox), as vLLM's RotaryEmbedding.cos_sin_cache."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    f = torch.arange(max_position, dtype=torch.float32, device=device)[:, None] * inv[None]
    return torch.cat((f.cos(), f.sin()), dim=-1).to(torch.bfloat16)


def quantise_fp8(weight: torch.Tensor, layout: str,
                 spread: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn [N, K], fp32 scale) of a bf16 weight [N, K] in `layout`, as `kog make-checkpoint --fp8`
    quantises it (fp8_checkpoints.quantise: amax / 448 per tensor, row or 128 x 128 block, times 2^U[0, 1) drawn
    from `spread`), the scale as vLLM holds it after loading: float32 (a channel scale is rounded to bf16 on disk
    first, as the checkpoint stores it), [] / [N, 1] / [ceil(N/128), ceil(K/128)], contiguous."""
    from kog_backend.tools.fixtures.fp8_checkpoints import FORMATS, quantise

    q, scale = quantise(weight, FORMATS[layout], spread=spread)
    return q, scale.float().contiguous()


def random_decoder(shape: DecoderShape, device, seed: int = 0, fp8: str | None = None) -> DecoderWeights:
    """Random weights of `shape` on `device`; fp8: None (bf16 projections) or the FP8 layout of the four
    projections (tensor, channel, block), quantised from the bf16 ones the same seed gives."""
    if fp8 is not None and fp8 not in LAYOUTS:
        raise ValueError(f"fp8 {fp8!r}: one of {LAYOUTS}")
    g = torch.Generator(device=device).manual_seed(seed)
    # (the FP8 scales' spread from a generator of its own, so that every layout draws the same bf16 weights)
    spread = torch.Generator(device=device).manual_seed(seed + 0x5EED) if fp8 is not None else None
    bf = torch.bfloat16
    H, D, I = shape.hidden_size, shape.head_dim, shape.intermediate_size

    def proj(out_f, in_f):
        return (torch.randn(out_f, in_f, generator=g, device=device) * (1.0 / math.sqrt(in_f))).to(bf)

    def layer_proj(out_f, in_f):
        """{"w": weight} (bf16), or {"w": float8 weight, "s": its scale}."""
        w = proj(out_f, in_f)
        if fp8 is None:
            return {"w": w, "s": None}
        q, scale = quantise_fp8(w, fp8, spread)
        return {"w": q, "s": scale}

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g, device=device)).to(bf)

    layers = []
    for _ in range(shape.num_layers):
        input_norm = norm(H)  # drawn in this order for every layout: the same seed gives the same bf16 weights
        qkv = layer_proj((shape.num_heads + 2 * shape.num_kv_heads) * D, H)
        q_norm = norm(D) if shape.qk_norm else None
        k_norm = norm(D) if shape.qk_norm else None
        o_proj = layer_proj(H, shape.num_heads * D)
        post_norm = norm(H)
        gate_up = layer_proj(2 * I, H)
        down = layer_proj(H, I)
        # Qwen2's trained biases are O(1) on K (larger than the projection): N(0, 0.5^2)
        qkv_bias = (0.5 * torch.randn((shape.num_heads + 2 * shape.num_kv_heads) * D, generator=g,
                                      device=device)).to(bf) if shape.qkv_bias else None  # fmt: skip
        layers.append(
            LayerWeights(
                input_norm=input_norm, qkv=qkv["w"], q_norm=q_norm, k_norm=k_norm, o_proj=o_proj["w"],
                post_norm=post_norm, gate_up=gate_up["w"], down=down["w"], qkv_bias=qkv_bias,
                qkv_scale=qkv["s"], o_scale=o_proj["s"], gate_up_scale=gate_up["s"], down_scale=down["s"],
            )  # fmt: skip
        )
    embed = torch.randn(shape.padded_vocab_local, H, generator=g, device=device).to(bf)
    lm_head = embed if shape.tied_embeddings else proj(shape.padded_vocab_local, H)
    theta = 1e6 if shape.arch in ("qwen3", "qwen2") else 5e5
    return DecoderWeights(
        shape=shape, embed=embed, layers=layers, final_norm=norm(H), lm_head=lm_head,
        cos_sin=rope_cache(shape.max_position, D, theta, device), fp8=fp8,
    )  # fmt: skip


def random_moe_decoder(shape: DecoderShape, moe, device, seed: int = 0):
    """Random Qwen3-MoE weights (moe_step.MoeDecoderWeights; moe a moe_step.MoeShape) of `shape` on `device`: the
    dense layer's attention and norms, a router scaled so that routes are not near-ties, and E experts in vLLM's
    fused layout (w13 [E, 2 I, H], w2 [E, H, I])."""
    from kog_backend.reference import moe_step

    g = torch.Generator(device=device).manual_seed(seed)
    bf = torch.bfloat16
    H, D, E, I = shape.hidden_size, shape.head_dim, moe.num_experts, moe.intermediate_size

    def proj(*size):
        return (torch.randn(*size, generator=g, device=device) * (1.0 / math.sqrt(size[-1]))).to(bf)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g, device=device)).to(bf)

    layers = []
    for _ in range(shape.num_layers):
        layers.append(moe_step.MoeLayerWeights(
            input_norm=norm(H), qkv=proj((shape.num_heads + 2 * shape.num_kv_heads) * D, H), q_norm=norm(D),
            k_norm=norm(D), o_proj=proj(H, shape.num_heads * D), post_norm=norm(H),
            router=(proj(E, H).float() * 4).to(bf), w13=proj(E, 2 * I, H), w2=proj(E, H, I),
        ))  # fmt: skip
    embed = torch.randn(shape.padded_vocab_local, H, generator=g, device=device).to(bf)
    lm_head = embed if shape.tied_embeddings else proj(shape.padded_vocab_local, H)
    return moe_step.MoeDecoderWeights(
        shape=shape, moe=moe, embed=embed, layers=layers, final_norm=norm(H), lm_head=lm_head,
        cos_sin=rope_cache(shape.max_position, D, 1e6, device),
    )  # fmt: skip


def paged_kv_caches(shape: DecoderShape, num_blocks: int, block_size: int, device, layout: str = "NHD"):
    """Per layer, vLLM's logical [blocks, kv_heads, block, 2D] cache over NHD (default) or HND memory, NaN-filled."""
    out = []
    for _ in range(shape.num_layers):
        if layout == "NHD":
            mem = torch.full((num_blocks, block_size, shape.num_kv_heads, 2 * shape.head_dim), math.nan,
                             dtype=torch.bfloat16, device=device)  # fmt: skip
            out.append(mem.permute(0, 2, 1, 3))
        else:
            out.append(torch.full((num_blocks, shape.num_kv_heads, block_size, 2 * shape.head_dim), math.nan,
                                  dtype=torch.bfloat16, device=device))  # fmt: skip
    return out


def fill_context(kv_caches, block_table: torch.Tensor, num_positions: int, head_dim: int, seed: int = 0) -> None:
    """Random K/V (N(0, 1)) at the slots of positions [0, num_positions) through block_table."""
    if num_positions == 0:
        return
    g = torch.Generator(device=block_table.device).manual_seed(seed)
    pos = torch.arange(num_positions, device=block_table.device)
    for kv in kv_caches:
        view = kv_cache_view(kv, head_dim)
        bs = view.block_size
        blocks, offs = block_table[pos // bs].long(), pos % bs
        shp = (num_positions, view.k.shape[2], head_dim)
        view.k[blocks, offs] = torch.randn(shp, generator=g, device=kv.device).to(kv.dtype)
        view.v[blocks, offs] = torch.randn(shp, generator=g, device=kv.device).to(kv.dtype)


def shuffled_block_table(num_blocks: int, needed: int, width: int, device, seed: int = 0) -> torch.Tensor:
    """int32 [width]: `needed` distinct random blocks from 1..num_blocks-1, then padding zeros (block 0 is never
    used for data, so a read through padding sees NaN)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.zeros(width, dtype=torch.int32)
    t[:needed] = (torch.randperm(num_blocks - 1, generator=g)[:needed] + 1).to(torch.int32)
    return t.to(device)
