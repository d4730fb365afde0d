"""CPU checks of the tensor-parallel monokernel's host side: vLLM-style sharding, the shared-buffer layout, and
the torch reference of the TP schedule against the unsharded one.

Tolerances: in float32 the TP schedule differs from the unsharded one only in the order of fp32 sums (rel 1e-5);
in bf16 also by the rounding of each rank's partial before the all-reduce (rel 2e-2 on logits).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kog_backend.reference import torch_step
from kog_backend.path.model_spec import LayerWeights
from kog_backend.monokernel import layout, reference, synthetic
from kog_backend.monokernel.tp import shard_decoder, shard_kv_caches, tp_buffer_layout, tp_unsupported_reason

BS = 16


def _weights(arch="llama", head_dim=64, dtype=torch.bfloat16, seed=0):
    heads, kv = 8, 4
    shape = synthetic.make_shape(arch, 2, 256, heads, kv, head_dim, 512, 1000, arch == "llama", 256)
    w = synthetic.random_decoder(shape, "cpu", seed=seed)
    if dtype == torch.bfloat16:
        return w

    def conv(t):
        return None if t is None else t.to(dtype)

    layers = [LayerWeights(*(conv(t) for t in dataclasses.astuple(lw))) for lw in w.layers]
    lm = conv(w.embed) if w.lm_head is w.embed else conv(w.lm_head)
    emb = lm if w.lm_head is w.embed else conv(w.embed)
    return dataclasses.replace(w, embed=emb, layers=layers, final_norm=conv(w.final_norm), lm_head=lm,
                               cos_sin=conv(w.cos_sin))  # fmt: skip


def _caches(shape, dtype, ctx, seed=0):
    caches = synthetic.paged_kv_caches(shape, 8, BS, "cpu")
    caches = [c.to(dtype) for c in caches]
    bt = torch.tensor([3, 5, 1, 7, 2, 0, 0, 0], dtype=torch.int32)
    synthetic.fill_context(caches, bt, ctx, shape.head_dim, seed=seed)
    return caches, bt


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("world", [2, 4])
def test_shards_reproduce_the_full_projections(world, arch):
    """Each rank's rows (and Qwen2's QKV bias) and columns reproduce the unsharded projections."""
    w = _weights(arch, dtype=torch.float32)
    assert (w.layers[0].qkv_bias is not None) == (arch == "qwen2")
    s = w.shape
    D = s.head_dim
    shards = [shard_decoder(w, r, world) for r in range(world)]
    x = torch.randn(s.hidden_size)
    lw = w.layers[0]
    full = torch_step.linear(x, lw.qkv, lw.qkv_bias)
    q, k, v = full.split([s.num_heads * D, s.num_kv_heads * D, s.num_kv_heads * D])
    qs, ks, vs = [], [], []
    for sh in shards:
        ss = sh.shape
        assert (ss.tp_size, ss.num_heads, ss.num_kv_heads) == (world, s.num_heads // world, s.num_kv_heads // world)
        sizes = [ss.num_heads * D, ss.num_kv_heads * D, ss.num_kv_heads * D]
        a, b, c = torch_step.linear(x, sh.layers[0].qkv, sh.layers[0].qkv_bias).split(sizes)
        qs.append(a), ks.append(b), vs.append(c)
    torch.testing.assert_close(torch.cat(qs), q)
    torch.testing.assert_close(torch.cat(ks), k)
    torch.testing.assert_close(torch.cat(vs), v)
    a = torch.randn(s.num_heads * D)
    o = sum(torch_step.linear(a[r * len(a) // world : (r + 1) * len(a) // world], sh.layers[0].o_proj)
            for r, sh in enumerate(shards))  # fmt: skip
    torch.testing.assert_close(o, torch_step.linear(a, lw.o_proj), rtol=1e-5, atol=1e-5)
    act = torch.cat([torch_step.silu_and_mul(torch_step.linear(x, sh.layers[0].gate_up)) for sh in shards])
    torch.testing.assert_close(act, torch_step.silu_and_mul(torch_step.linear(x, lw.gate_up)))
    d = sum(torch_step.linear(act[r * 512 // world : (r + 1) * 512 // world], sh.layers[0].down)
            for r, sh in enumerate(shards))  # fmt: skip
    torch.testing.assert_close(d, torch_step.linear(act, lw.down), rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.cat([sh.lm_head for sh in shards]), w.lm_head)
    assert [sh.shape.vocab_start for sh in shards] == [r * w.lm_head.shape[0] // world for r in range(world)]
    assert all(sh.embed is w.embed for sh in shards)  # the kernel reads any token's row from the whole table


@pytest.mark.parametrize("layout_name", ["NHD", "HND"])
def test_shard_kv_caches_keeps_heads_and_memory_order(layout_name):
    s = _weights().shape
    caches = synthetic.paged_kv_caches(s, 4, BS, "cpu", layout_name)
    for c in caches:
        c.copy_(torch.randn(c.shape).to(c.dtype))
    for r in range(2):
        part = shard_kv_caches(caches, r, 2)
        for c, p in zip(caches, part):
            n = s.num_kv_heads // 2
            assert torch.equal(p, c[:, r * n : (r + 1) * n])
            assert sorted(range(4), key=lambda d: -p.stride(d)) == sorted(range(4), key=lambda d: -c.stride(d))


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_tp_reference_matches_unsharded(world, dtype, rtol, arch):
    """Five decode steps of the TP schedule (each rank its shard and its KV heads; Qwen2: its share of the QKV
    bias) against the unsharded reference; at world 1 and in float32 the two are the same computation."""
    w = _weights(arch=arch, dtype=dtype, seed=3)
    ctx = 20
    caches, bt = _caches(w.shape, dtype, ctx)
    shards = [shard_decoder(w, r, world) for r in range(world)]
    tp_caches = [shard_kv_caches(caches, r, world) for r in range(world)]
    token = 17
    for t in range(5):
        pos = ctx + t
        slot = int(bt[pos // BS]) * BS + pos % BS
        full = reference.reference_step(w, caches, token, pos, slot, bt, 3)
        tp = reference.reference_step_tp(shards, tp_caches, token, pos, slot, bt, 3)
        assert tp["logits"].shape == full["logits"].shape
        rel = ((tp["logits"].float() - full["logits"].float()).norm() / full["logits"].float().norm()).item()
        assert rel < rtol, f"step {t}: logits rel err {rel:.2e}"
        if world == 1:
            assert torch.equal(tp["logits"], full["logits"])
        token = full["token"]


def test_allreduce_bf16_is_one_rounding_in_rank_order():
    a = torch.tensor([1.0, 256.0], dtype=torch.bfloat16)
    b = torch.tensor([2.0**-8, 1.0], dtype=torch.bfloat16)
    c = torch.tensor([2.0**-8, 1.0], dtype=torch.bfloat16)
    # fp32 sums then one rounding: 1 + 2^-7 is representable in bf16, (1 + 2^-8) would round back to 1
    assert reference.allreduce_bf16([a, b, c]).tolist() == [1.0 + 2.0**-7, 258.0]


def test_tp_buffer_layout():
    s = _weights().shape
    for world in (2, 4, 8):
        lay = tp_buffer_layout(s, world)
        assert lay.counters == 0
        assert lay.keys >= layout.num_counters(s.num_layers, s.num_kv_heads) * 4
        assert lay.parts >= lay.keys + 2 * world * 8
        assert lay.keys % 256 == 0 and lay.parts % 256 == 0 and lay.nbytes % 256 == 0
        assert lay.nbytes >= lay.parts + s.num_layers * 2 * world * s.hidden_size * 2


def test_tp_unsupported_reasons():
    w = _weights()
    assert tp_unsupported_reason(w.shape, 1) is None
    sh = shard_decoder(w, 0, 2).shape
    assert tp_unsupported_reason(sh, 2) is None
    assert "sharded 2 ways" in tp_unsupported_reason(sh, 4)
    assert "at most 8" in tp_unsupported_reason(dataclasses.replace(sh, tp_size=16), 16)
    with pytest.raises(ValueError, match="not divisible"):
        shard_decoder(w, 0, 3)


def _setup_worker(rank: int, world: int, bad_rank: int) -> dict:
    """setup_tp_monokernel on the CPU: unsupported everywhere (no GPU), and rank `bad_rank` also sharded wrongly."""
    import torch.distributed as dist

    from kog_backend.monokernel.tp import setup_tp_monokernel

    w = _weights()
    shard = shard_decoder(w, rank, world)
    if rank == bad_rank:
        shard = dataclasses.replace(shard, shape=dataclasses.replace(shard.shape, tp_size=world + 1))
    caches = shard_kv_caches(synthetic.paged_kv_caches(w.shape, 4, BS, "cpu"), rank, world)

    def gather(t):
        raise AssertionError("the embedding must not be gathered when a rank refused")

    mk, reason = setup_tp_monokernel(shard, caches, torch.device("cpu"), 256, 1, dist.group.WORLD, gather)
    return {"mk": mk is not None, "reason": reason}


@pytest.mark.parametrize("bad_rank", [-1, 1])
def test_setup_tp_monokernel_agrees_on_one_verdict(bad_rank):
    """Every rank gets the same verdict naming every rank's own reason, and nobody proceeds alone."""
    from kog_backend.collective.testing import run_ranks

    res = run_ranks(_setup_worker, 2, args=(bad_rank,), timeout_s=120)
    assert [r["mk"] for r in res] == [False, False]
    assert res[0]["reason"] == res[1]["reason"]
    assert "rank 0: device cpu is not a CUDA GPU" in res[0]["reason"]
    if bad_rank == 1:
        assert "rank 1: the weights are sharded 3 ways, the group has 2 ranks" in res[0]["reason"]
