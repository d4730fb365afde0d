"""Torch reference of the monokernel's schedule, stage by stage, built on torch_step's numeric recipe.

What the kernel does differently from torch_step is only the order of floating-point sums, plus split-K
attention: each of S context splits keeps (m, l, acc) in log2 units and the splits are combined
(docs/monokernel.md). `split_attention` is that algebra in torch; `reference_step` runs a whole step recording
every buffer the kernel writes; `expected_from_kernel` recomputes each buffer from the kernel's own upstream
buffers (teacher forcing), so a GPU test can say which stage of which layer is wrong. FP8 weights
(DecoderWeights.fp8) go through torch_step.project: dequantised with their scales, fp32 sums, one bf16 rounding.
"""

from __future__ import annotations

import math

import torch

from kog_backend.reference import torch_step
from kog_backend.path.model_spec import DecoderWeights, kv_cache_view
from kog_backend.monokernel import layout
from kog_backend.monokernel.plan import lm_rows

LOG2E = math.log2(math.e)


def split_bounds(ctx: int, num_splits: int) -> list[tuple[int, int]]:
    """[start, end) of each split of a context of ctx positions (empty splits have start >= end), as
    plan_attention_split: a split longer than kAttnShortLen is rounded up to whole kAttnTileLen tiles."""
    n = (ctx + num_splits - 1) // num_splits
    tile = layout.CONFIG["kAttnTileLen"]
    if n > layout.CONFIG["kAttnShortLen"]:
        n = (n + tile - 1) // tile * tile
    return [(j * n, min((j + 1) * n, ctx)) for j in range(num_splits)]


def split_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [nh, D] bf16; k, v [T, nkv, D] (the whole context). Returns (out bf16 [nh * D], m [nh, S] (log2 units,
    -inf for an empty split), l [nh, S], acc [nh, S, D]) computed in fp32 as the kernel's CUDA-core pass does (its
    tensor-core pass, the default for long splits, rounds P to bf16 for the PV product: the GPU tests bound that)."""
    nh, d = q.shape
    t, nkv, _ = k.shape
    g = nh // nkv
    kf = k.float().repeat_interleave(g, dim=1)  # [T, nh, D]
    vf = v.float().repeat_interleave(g, dim=1)
    s2 = torch.einsum("hd,thd->ht", q.float(), kf) * (d**-0.5 * LOG2E)  # [nh, T]
    ms, ls, accs = [], [], []
    for start, end in split_bounds(t, num_splits):
        if start >= end:
            ms.append(torch.full((nh,), -math.inf, device=q.device))
            ls.append(torch.zeros(nh, device=q.device))
            accs.append(torch.zeros(nh, d, device=q.device))
            continue
        sj = s2[:, start:end]
        mj = sj.max(dim=1).values
        pj = torch.exp2(sj - mj[:, None])
        ms.append(mj)
        ls.append(pj.sum(dim=1))
        accs.append(torch.einsum("ht,thd->hd", pj, vf[start:end]))
    m = torch.stack(ms, dim=1)
    l = torch.stack(ls, dim=1)
    acc = torch.stack(accs, dim=1)
    out = combine_splits(m, l, acc).to(q.dtype).reshape(nh * d)
    return out, m, l, acc


def combine_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """fp32 [nh, D] = sum_j 2^(m_j - M) acc_j / sum_j 2^(m_j - M) l_j."""
    big = m.max(dim=1, keepdim=True).values
    w = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), torch.exp2(m - big))
    return (w[:, :, None] * acc).sum(dim=1) / (w * l).sum(dim=1)[:, None]


def _qkv_split(weights: DecoderWeights, qkv: torch.Tensor):
    s = weights.shape
    q = qkv[: s.q_size].view(s.num_heads, s.head_dim)
    k = qkv[s.q_size : s.q_size + s.kv_size].view(s.num_kv_heads, s.head_dim)
    v = qkv[s.q_size + s.kv_size :].view(s.num_kv_heads, s.head_dim)
    return q, k, v


def norm_rope(weights: DecoderWeights, x: torch.Tensor, norm_w: torch.Tensor | None, pos: int) -> torch.Tensor:
    """qk-norm (when the model has it) then RoPE of x [heads, D] bf16 (torch_step's recipe)."""
    if norm_w is not None:
        x = torch_step.rms_norm(x, norm_w, weights.shape.rms_eps)
    return torch_step.rope(x, weights.cos_sin, pos)


def _attention(w: DecoderWeights, lw, x: torch.Tensor, kv_cache: torch.Tensor, pos: int, slot: int,
               block_table: torch.Tensor, num_splits: int):
    """QKV projection, qk-norm + RoPE, K/V append at `slot`, split attention over the context (kernel's schedule).
    Returns (qkv_out, q after norm/RoPE, split_attention's (out, m, l, acc))."""
    qkv = torch_step.project(x, lw, "qkv", w.fp8, lw.qkv_bias)
    q, k, v = _qkv_split(w, qkv)
    q = norm_rope(w, q, lw.q_norm, pos)
    k = norm_rope(w, k, lw.k_norm, pos)
    cache = kv_cache_view(kv_cache, w.shape.head_dim)
    torch_step.append_kv(cache, k, v, slot)
    k_ctx, v_ctx = torch_step.gather_context(cache, block_table, pos + 1)
    return qkv, q, split_attention(q, k_ctx, v_ctx, num_splits)


def reference_step(
    weights: DecoderWeights,
    kv_caches: list[torch.Tensor],
    token: int,
    pos: int,
    slot: int,
    block_table: torch.Tensor,
    num_splits: int,
) -> dict:
    """One decode step in the kernel's schedule. Appends K/V to kv_caches. Returns {"layers": [per-layer dict of
    qkv_out, q_out, attn_out, attn_m, attn_l, attn_acc, o_out, rmid, act, down_out, rin_next], "logits", "token"}."""
    s = weights.shape
    eps = s.rms_eps
    rin = weights.embed[token]
    x = torch_step.rms_norm(rin, weights.layers[0].input_norm, eps)
    recs = []
    for i, lw in enumerate(weights.layers):
        rec: dict[str, torch.Tensor] = {}
        if i > 0:
            x = torch_step.add_rms_norm(recs[-1]["down_out"], recs[-1]["rmid"], lw.input_norm, eps)[0]
        rec["qkv_out"], q, attn = _attention(weights, lw, x, kv_caches[i], pos, slot, block_table, num_splits)
        rec["q_out"] = q.reshape(-1)
        rec["attn_out"], rec["attn_m"], rec["attn_l"], rec["attn_acc"] = attn
        rec["o_out"] = torch_step.project(rec["attn_out"], lw, "o_proj", weights.fp8)
        h, rec["rmid"] = torch_step.add_rms_norm(rec["o_out"], rin, lw.post_norm, eps)
        rec["act"] = torch_step.silu_and_mul(torch_step.project(h, lw, "gate_up", weights.fp8))
        rec["down_out"] = torch_step.project(rec["act"], lw, "down", weights.fp8)
        rec["rin_next"] = (rec["down_out"].float() + rec["rmid"].float()).to(rin.dtype)
        rin = rec["rin_next"]
        recs.append(rec)
    hf = torch_step.add_rms_norm(recs[-1]["down_out"], recs[-1]["rmid"], weights.final_norm, eps)[0]
    logits = torch_step.linear(hf, weights.lm_head[: lm_rows(s)])
    return {"layers": recs, "logits": logits, "token": int(torch_step.greedy(logits))}


def expected_from_kernel(
    weights: DecoderWeights,
    kv_caches: list[torch.Tensor],
    got: list[dict[str, torch.Tensor]],
    got_logits: torch.Tensor,
    token: int,
    pos: int,
    block_table: torch.Tensor,
    num_splits: int,
) -> dict:
    """Each kernel buffer recomputed from the kernel's own inputs to that stage (`got`: per-layer kernel buffers,
    shapes as in reference_step; kv_caches: after the kernel ran). Also the expected K/V row of this position
    per layer (`k_new`, `v_new`) and the argmax of the kernel's own logits."""
    s = weights.shape
    eps = s.rms_eps
    emb = weights.embed[token]
    out = []
    for i, lw in enumerate(weights.layers):
        g = got[i]
        e: dict[str, torch.Tensor] = {}
        if i == 0:
            x = torch_step.rms_norm(emb, lw.input_norm, eps)
            rin = emb
        else:
            x = torch_step.add_rms_norm(got[i - 1]["down_out"], got[i - 1]["rmid"], lw.input_norm, eps)[0]
            rin = got[i - 1]["rin_next"]
        e["qkv_out"] = torch_step.project(x, lw, "qkv", weights.fp8, lw.qkv_bias)
        q, k, v = _qkv_split(weights, g["qkv_out"])
        e["q_out"] = norm_rope(weights, q, lw.q_norm, pos).reshape(-1)
        e["k_new"] = norm_rope(weights, k, lw.k_norm, pos)
        e["v_new"] = v.clone()
        cache = kv_cache_view(kv_caches[i], s.head_dim)
        k_ctx, v_ctx = torch_step.gather_context(cache, block_table, pos + 1)
        qg = g["q_out"].view(s.num_heads, s.head_dim)
        e["attn_out"], e["attn_m"], e["attn_l"], e["attn_acc"] = split_attention(qg, k_ctx, v_ctx, num_splits)
        e["attn_out_from_partials"] = combine_splits(g["attn_m"], g["attn_l"], g["attn_acc"]).to(emb.dtype).reshape(-1)
        e["o_out"] = torch_step.project(g["attn_out"], lw, "o_proj", weights.fp8)
        e["rmid"] = (g["o_out"].float() + rin.float()).to(emb.dtype)
        h = torch_step.add_rms_norm(g["o_out"], rin, lw.post_norm, eps)[0]
        e["act"] = torch_step.silu_and_mul(torch_step.project(h, lw, "gate_up", weights.fp8))
        e["down_out"] = torch_step.project(g["act"], lw, "down", weights.fp8)
        e["rin_next"] = (g["down_out"].float() + g["rmid"].float()).to(emb.dtype)
        out.append(e)
    hf = torch_step.add_rms_norm(got[-1]["down_out"], got[-1]["rmid"], weights.final_norm, eps)[0]
    logits = torch_step.linear(hf, weights.lm_head[: lm_rows(s)])
    return {"layers": out, "logits": logits, "token": int(torch_step.greedy(got_logits))}


def allreduce_bf16(parts: list[torch.Tensor]) -> torch.Tensor:
    """The TP kernel's (and vLLM's custom all-reduce's) sum of bf16 partials: fp32, rank order, rounded once."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(parts[0].dtype)


def reference_step_tp(
    shards: list[DecoderWeights],
    kv_caches: list[list[torch.Tensor]],
    token: int,
    pos: int,
    slot: int,
    block_table: torch.Tensor,
    num_splits: int,
) -> dict:
    """One decode step of the tensor-parallel kernel's schedule over every rank's shard (tp.shard_decoder) and KV
    caches (kv_caches[rank], appended to). Each rank's O / down partial is bf16; ranks combine them with
    allreduce_bf16. Returns {"logits": the logical vocabulary's logits (every rank's rows, in order), "token"}."""
    s = shards[0].shape
    eps = s.rms_eps
    rin = shards[0].embed[token]
    x = torch_step.rms_norm(rin, shards[0].layers[0].input_norm, eps)
    rmid, d = None, None
    for i in range(s.num_layers):
        if i > 0:
            x, rin = torch_step.add_rms_norm(d, rmid, shards[0].layers[i].input_norm, eps)
        o_parts = []
        for r, w in enumerate(shards):
            attn = _attention(w, w.layers[i], x, kv_caches[r][i], pos, slot, block_table, num_splits)[2][0]
            o_parts.append(torch_step.project(attn, w.layers[i], "o_proj", w.fp8))
        o = allreduce_bf16(o_parts)
        h, rmid = torch_step.add_rms_norm(o, rin, shards[0].layers[i].post_norm, eps)
        d = allreduce_bf16(
            [torch_step.mlp_block(w.layers[i], h, None, w.fp8) for w in shards]
        )  # fmt: skip
    hf = torch_step.add_rms_norm(d, rmid, shards[0].final_norm, eps)[0]
    logits = torch.cat([torch_step.linear(hf, w.lm_head[: lm_rows(w.shape)]) for w in shards])
    return {"logits": logits, "token": int(torch_step.greedy(logits))}
