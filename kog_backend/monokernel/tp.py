"""Tensor parallelism for the monokernel: vLLM's TP sharding of a decoder, and the set-up of the buffer each rank
shares with the others through CUDA IPC (its layout: tp_layout.py; csrc/include/kog/tp.cuh).
"""

from __future__ import annotations

import dataclasses

import torch

from kog_backend.monokernel.tp_layout import TPBufferLayout, tp_buffer_layout  # noqa: F401 (re-exported)
from kog_backend.path.gate import monokernel as gate
from kog_backend.path.model_spec import DecoderShape, DecoderWeights, LayerWeights


def tp_unsupported_reason(shape: DecoderShape, world: int) -> str | None:
    """Why a model sharded `world` ways cannot run on the TP monokernel (None: it can): the gate's reason."""
    return gate.tp_reason(shape, world)


def _split_rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = t.shape[0] // world
    return t[rank * n : (rank + 1) * n]


def shard_decoder(w: DecoderWeights, rank: int, world: int) -> DecoderWeights:
    """Rank `rank`'s shard of full weights `w` as vLLM lays them out at tensor parallelism `world`: QKV
    (QKVParallelLinear: this rank's Q heads, then its K heads, then its V heads), gate/up (MergedColumnParallel:
    its gate rows then its up rows), O and down (RowParallel: its input columns), LM head (ParallelLMHead: an even
    share of the padded vocabulary rows). Norms, RoPE cache and the embedding stay whole: the kernel reads the
    token's embedding row from a full table (vLLM shards it; the runner gathers it once, see Monokernel)."""
    s = w.shape
    if w.fp8 is not None:
        raise ValueError(f"FP8 weights ({w.fp8}): the FP8 kernel is TP = 1 only, no sharding here")
    if s.num_heads % world or s.num_kv_heads % world or s.intermediate_size % world:
        raise ValueError(
            f"heads {s.num_heads}/{s.num_kv_heads} or intermediate {s.intermediate_size} not divisible by {world}"
        )
    if w.lm_head.shape[0] % world:
        raise ValueError(f"{w.lm_head.shape[0]} LM-head rows not divisible by {world}")
    D, nh, nkv, I = s.head_dim, s.num_heads // world, s.num_kv_heads // world, s.intermediate_size // world
    vocab_local = w.lm_head.shape[0] // world
    shape = dataclasses.replace(
        s, num_heads=nh, num_kv_heads=nkv, intermediate_size=I, padded_vocab_local=vocab_local,
        vocab_start=rank * vocab_local, tp_size=world, tp_rank=rank,
    )  # fmt: skip
    layers = []
    for lw in w.layers:
        q, k, v = lw.qkv.split([s.num_heads * D, s.num_kv_heads * D, s.num_kv_heads * D])
        qkv = torch.cat([_split_rows(q, rank, world), _split_rows(k, rank, world), _split_rows(v, rank, world)])
        bias = None
        if lw.qkv_bias is not None:
            bq, bk, bv = lw.qkv_bias.split([s.num_heads * D, s.num_kv_heads * D, s.num_kv_heads * D])
            bias = torch.cat([_split_rows(bq, rank, world), _split_rows(bk, rank, world), _split_rows(bv, rank, world)])
        gate, up = lw.gate_up.split([s.intermediate_size, s.intermediate_size])
        layers.append(
            LayerWeights(
                input_norm=lw.input_norm, qkv=qkv.contiguous(), q_norm=lw.q_norm, k_norm=lw.k_norm,
                o_proj=lw.o_proj[:, rank * nh * D : (rank + 1) * nh * D].contiguous(), post_norm=lw.post_norm,
                gate_up=torch.cat([_split_rows(gate, rank, world), _split_rows(up, rank, world)]).contiguous(),
                down=lw.down[:, rank * I : (rank + 1) * I].contiguous(),
                qkv_bias=bias.contiguous() if bias is not None else None,
            )  # fmt: skip
        )
    return DecoderWeights(
        shape=shape, embed=w.embed, layers=layers, final_norm=w.final_norm,
        lm_head=_split_rows(w.lm_head, rank, world).contiguous(), cos_sin=w.cos_sin,
    )  # fmt: skip


def shard_kv_caches(caches: list[torch.Tensor], rank: int, world: int) -> list[torch.Tensor]:
    """This rank's KV heads of full caches ([blocks, nkv, block, 2D] views), copied into caches of the same memory
    layout (vLLM allocates each rank's cache for its own heads)."""
    out = []
    for kv in caches:
        n = kv.shape[1] // world
        part = kv[:, rank * n : (rank + 1) * n]
        # keep the physical order of the full cache's dimensions (NHD or HND)
        order = sorted(range(4), key=lambda d: -kv.stride(d))
        mem = part.permute(*order).clone(memory_format=torch.contiguous_format)  # a copy even at world 1
        inv = [order.index(d) for d in range(4)]
        out.append(mem.permute(*inv))
    return out


def setup_tp_monokernel(weights: DecoderWeights, kv_caches: list[torch.Tensor], device: torch.device,
                        max_model_len: int, max_tokens_per_launch: int, cpu_group, gather_rows):
    """(Monokernel, None) on every rank of the TP group, or (None, the same reason) on every rank: a rank must never
    launch the TP kernel while a peer runs anything else (it would wait for partials that never come).

    Collective over `cpu_group` (gloo: the verdicts, the IPC handles) and, through gather_rows(t) (an all-gather
    of t's rows in rank order on the device group, e.g. vLLM's tensor_model_parallel_all_gather(t, dim=0)), the
    whole embedding table: V_pad x H bf16 more per rank (525 MB for Llama-3.2-1B), so that a token's row is one
    read. weights.embed is vLLM's shard."""
    import torch.distributed as dist

    from kog_backend import ops as kog_ops
    from kog_backend.collective import groupcomm
    from kog_backend.collective.ipc import SharedBuffer
    from kog_backend.monokernel.host import Monokernel, unsupported_reason

    world = dist.get_world_size(cpu_group)
    local = tp_unsupported_reason(weights.shape, world) or unsupported_reason(
        weights, kv_caches, device, tp_world=world
    )
    reason = groupcomm.agree(cpu_group, local)
    if reason is not None:
        return None, reason
    full = dataclasses.replace(weights, embed=gather_rows(weights.embed).contiguous())
    nbytes = tp_buffer_layout(full.shape, world).nbytes
    buf, reason = SharedBuffer.create(kog_ops.ops(), cpu_group, device.index, nbytes)
    if buf is None:
        return None, gate.tp_shared_buffer_reason(reason)
    mk, local = None, None
    try:
        mk = Monokernel(full, kv_caches, device, max_model_len, max_tokens_per_launch=max_tokens_per_launch,
                        tp_buffer=buf)  # fmt: skip
    except (ValueError, RuntimeError) as e:
        local = gate.tp_setup_failed(e)
    reason = groupcomm.agree(cpu_group, local)
    if reason is not None:
        buf.close(group=cpu_group)
        return None, reason
    return mk, None
