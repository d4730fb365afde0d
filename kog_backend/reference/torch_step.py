"""One decode step of a Llama/Qwen3 dense model in plain torch, on vLLM's own weights and paged KV cache.

This is the kog path until the monokernel serves it, and the oracle the monokernel is checked against, stage by
stage. The numeric recipe mirrors vLLM 0.26's stock path (vllm/ir/ops/layernorm.py, rotary_embedding, SiluAndMul,
FlashAttention) so that greedy tokens agree with stock up to bf16 rounding of differently ordered sums:

  rms_norm        y = bf16(x_f32 * rsqrt(mean(x_f32^2) + eps)) * w                        (product rounded to bf16)
  add_rms_norm    s = x_f32 + r_f32; residual' = bf16(s); y = rms_norm recipe applied to s (unrounded)
  linear          fp32 accumulation, bf16 output; FP8 weights (DecoderWeights.fp8): dequantised to fp32 with their
                  scales, then the same (kog_backend.reference.fp8_linear; `project` picks)
  qk-norm         rms_norm per head on q and k, before RoPE (Qwen3)
  rope (neox)     fp32 from bf16 x and bf16 cos/sin, one rounding to bf16
  attention       fp32 scores * D^-0.5, fp32 softmax, fp32 P.V, bf16 output
  silu_and_mul    fp32 silu(gate) * up from bf16, one rounding to bf16
  logits          bf16; greedy = first index of the maximum over the logical vocabulary

Shapes: one token; x is [H]; q [nh, D]; k, v [nkv, D]. All tensors live on the weights' device. Positions and
slots may be host ints or 0-dim device tensors: the runner passes device tensors so that no step synchronises
with the host, plus a host upper bound of the context length; attention masks positions beyond the real one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kog_backend.path.model_spec import SCALE_FIELDS, DecoderWeights, KVCacheView, LayerWeights, kv_cache_view
from kog_backend.reference import fp8_linear

AllReduce = Callable[[torch.Tensor], torch.Tensor]
Index = int | torch.Tensor  # a host int or a 0-dim integer tensor on the device


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y.to(w.dtype) * w


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.float() + residual.float()
    y = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y.to(w.dtype) * w, s.to(residual.dtype)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ w[out, in]^T (+ bias) with fp32 accumulation, rounded to w's dtype once (the bias joins the
    fp32 sum, as in cuBLAS's bias epilogue that vLLM's biased linear layers run through)."""
    y = torch.matmul(x.float(), w.float().t())
    if bias is not None:
        y = y + bias.float()
    return y.to(w.dtype)


def project(x: torch.Tensor, lw: LayerWeights, name: str, fp8: str | None,
            bias: torch.Tensor | None = None, act: bool = False) -> torch.Tensor:
    """x [..., in] through layer projection `name` (qkv, o_proj, gate_up, down) (+ bias): `linear` for bf16
    weights; for FP8 weights (fp8: DecoderWeights.fp8, the scales' layout) fp8_linear's dequantised fp32 product,
    the bias joining the fp32 sum, rounded once to bf16; act (DecoderWeights.fp8_act): x quantised to e4m3 first,
    as stock does (fp8_linear.quantise_input)."""
    w = getattr(lw, name)
    if fp8 is None:
        return linear(x, w, bias)
    return fp8_linear.linear(x, w, getattr(lw, SCALE_FIELDS[name]), fp8, bias=bias, quantise_x=act)


def rope(x: torch.Tensor, cos_sin: torch.Tensor, position: Index) -> torch.Tensor:
    """Neox-style rotation of x [heads, D] at `position`; cos_sin [max_pos, D] = cos | sin."""
    d2 = x.shape[-1] // 2
    cs = cos_sin[position].float()
    cos, sin = cs[:d2], cs[d2:]
    xf = x.float()
    x1, x2 = xf[..., :d2], xf[..., d2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def qkv_rope(
    lw: LayerWeights, x: torch.Tensor, weights: DecoderWeights, position: Index
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused QKV projection (+ Qwen2's bias), Qwen3 qk-norm, RoPE. Returns q [nh, D], k [nkv, D], v [nkv, D]
    (bf16)."""
    s = weights.shape
    qkv = project(x, lw, "qkv", weights.fp8, lw.qkv_bias, act=weights.fp8_act)
    q = qkv[: s.q_size].view(s.num_heads, s.head_dim)
    k = qkv[s.q_size : s.q_size + s.kv_size].view(s.num_kv_heads, s.head_dim)
    v = qkv[s.q_size + s.kv_size :].view(s.num_kv_heads, s.head_dim)
    if lw.q_norm is not None:
        q = rms_norm(q, lw.q_norm, s.rms_eps)
        k = rms_norm(k, lw.k_norm, s.rms_eps)
    return rope(q, weights.cos_sin, position), rope(k, weights.cos_sin, position), v


def append_kv(cache: KVCacheView, k: torch.Tensor, v: torch.Tensor, slot: Index) -> None:
    """Write this position's K and V ([nkv, D]) at vLLM's slot = block_id * block_size + pos % block_size."""
    blk, off = slot // cache.block_size, slot % cache.block_size
    cache.k[blk, off] = k
    cache.v[blk, off] = v


def gather_context(cache: KVCacheView, block_table: torch.Tensor, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions [0, max_seq_len) as [max_seq_len, nkv, D] through the request's block table."""
    bs = cache.block_size
    pos = torch.arange(max_seq_len, device=block_table.device)
    blocks = block_table[pos // bs].long()
    offs = pos % bs
    return cache.k[blocks, offs], cache.v[blocks, offs]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position: Index | None = None) -> torch.Tensor:
    """GQA attention of one query token at `position` over k, v [T, nkv, D] (rows past `position` masked;
    None = all T rows are context). q [nh, D] -> [nh * D] bf16."""
    nh, d = q.shape
    group = nh // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)  # [T, nh, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,thd->ht", q.float(), kf) * (d**-0.5)
    if position is not None:  # rows past the position may hold anything, NaN included: drop them from both sums
        beyond = torch.arange(k.shape[0], device=q.device) > position
        scores = scores.masked_fill(beyond, float("-inf"))
        vf = vf.masked_fill(beyond[:, None, None], 0.0)
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("ht,thd->hd", p, vf).to(q.dtype).reshape(nh * d)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(g) * u).to(gate_up.dtype)


def attention_block(
    lw: LayerWeights,
    x: torch.Tensor,
    weights: DecoderWeights,
    cache: KVCacheView,
    block_table: torch.Tensor,
    position: Index,
    slot: Index,
    max_seq_len: int,
    all_reduce: AllReduce | None,
) -> torch.Tensor:
    q, k, v = qkv_rope(lw, x, weights, position)
    append_kv(cache, k, v, slot)
    k_ctx, v_ctx = gather_context(cache, block_table, max_seq_len)
    out = project(decode_attention(q, k_ctx, v_ctx, position), lw, "o_proj", weights.fp8, act=weights.fp8_act)
    return all_reduce(out) if all_reduce is not None else out


def mlp_block(lw: LayerWeights, x: torch.Tensor, all_reduce: AllReduce | None,
              fp8: str | None = None, act: bool = False) -> torch.Tensor:
    """Gate/up, SiLU-and-mul, down; fp8: DecoderWeights.fp8 (None: bf16 weights), act: DecoderWeights.fp8_act."""
    out = project(silu_and_mul(project(x, lw, "gate_up", fp8, act=act)), lw, "down", fp8, act=act)
    return all_reduce(out) if all_reduce is not None else out


def embed(weights: DecoderWeights, token: int) -> torch.Tensor:
    """Row `token` of an unsharded embedding (TP=1; the runner uses vLLM's VocabParallelEmbedding)."""
    assert weights.shape.tp_size == 1
    return weights.embed[token].clone()


def decode_hidden(
    weights: DecoderWeights,
    kv_caches: list[torch.Tensor],
    embedded: torch.Tensor,
    position: Index,
    slot: Index,
    block_table: torch.Tensor,
    max_seq_len: int,
    all_reduce: AllReduce | None = None,
    mlp: Callable[[LayerWeights, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Final-normed hidden state [H] of the token whose embedding row is `embedded` [H], at `position` (the
    context is [0, position]; max_seq_len >= position + 1 bounds it on the host); appends its K/V to every layer.
    `mlp(layer_weights, x)`: the block after the post-attention norm, mlp_block by default (moe_step passes its
    MoE block)."""
    if mlp is None:
        mlp = lambda lw, x: mlp_block(lw, x, all_reduce, weights.fp8, weights.fp8_act)  # noqa: E731
    s = weights.shape
    residual = embedded
    x = rms_norm(residual, weights.layers[0].input_norm, s.rms_eps)
    for i, lw in enumerate(weights.layers):
        cache = kv_cache_view(kv_caches[i], s.head_dim)
        if i > 0:
            x, residual = add_rms_norm(x, residual, lw.input_norm, s.rms_eps)
        x = attention_block(lw, x, weights, cache, block_table, position, slot, max_seq_len, all_reduce)
        x, residual = add_rms_norm(x, residual, lw.post_norm, s.rms_eps)
        x = mlp(lw, x)
    x, _ = add_rms_norm(x, residual, weights.final_norm, s.rms_eps)
    return x


def logits(weights: DecoderWeights, hidden: torch.Tensor) -> torch.Tensor:
    """bf16 logits of this rank's LM-head shard, padded rows dropped (TP=1: the logical vocabulary)."""
    s = weights.shape
    local_valid = max(0, min(s.padded_vocab_local, s.vocab_size - s.vocab_start))
    return linear(hidden, weights.lm_head[:local_valid])


def greedy(logits_row: torch.Tensor) -> torch.Tensor:
    """First index of the maximum (torch.argmax's tie rule, which vLLM's sampler shares)."""
    return torch.argmax(logits_row.float(), dim=-1)
