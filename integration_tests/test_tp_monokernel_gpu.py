"""The tensor-parallel monokernel at world sizes 2 and 4 against world size 1, on one H200.

Ranks are processes sharing the GPU under CUDA MPS, each launching a grid of SMs / W blocks; they exchange their
O / down partial sums and LM-head keys through CUDA IPC exactly as they would between GPUs (csrc/include/kog/tp.cuh).
Each rank builds the same random full-weight model (same seed), keeps vLLM's TP shard of it (tp.shard_decoder) and
its KV heads of the same random context, and runs LAUNCHES launches of K greedy tokens (the second continues from
the first's last token: epochs advance across launches, no counter is reset).

Checks: each rank's logits of the first TF_STEPS tokens against the TP schedule's torch reference
(reference.reference_step_tp, fed the kernel's tokens) within REF_RTOL, and world 1's against reference_step;
all ranks produce the same tokens; the world-W tokens equal world 1's; wherever they first differ, the world-1
logits there have a top-2 margin below 2% of the top logit (a bf16 near-tie: each rank rounds its partial to bf16
before the sum, as vLLM's all-reduce does) and until then the logits agree within W1_RTOL relative norm; no wait
timed out.

Run on the device:  python -m pytest integration_tests/test_tp_monokernel_gpu.py
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from kernel_gpu import require_sm90_extension  # noqa: E402

pytestmark = pytest.mark.gpu

require_sm90_extension()

BS = 16
CTX = 32
K = 16
LAUNCHES = 2
FIRST_TOKEN = 1234
TF_STEPS = 4  # tokens each rank checks against reference_step_tp
# Kernel vs its schedule's torch reference, full-depth random-weight models (16-28 layers): measured on an H200,
# world 2: up to 2.5e-2 on the Qwen3-1.7B shape (only the order of fp32 sums differs; bf16 roundings that flip
# compound over 28 layers). test_monokernel_gpu.py's 2e-2 is for 2-layer models. World 1 is held to the same bound.
REF_RTOL = 3e-2
W1_RTOL = 4e-2  # world 2 vs world 1: two bf16 schedules, each within ~REF_RTOL of the exact result


def tp_worker(rank: int, world: int, shape_name: str, out_dir: str, grid_share: int) -> dict:
    import torch.distributed as dist

    from kog_backend import ops
    from kog_backend.collective.ipc import SharedBuffer
    from kog_backend.monokernel import Monokernel, synthetic, tp

    dev = torch.device("cuda", torch.cuda.current_device())
    shape = synthetic.make_shape(*synthetic.SHAPES[shape_name], max_position=4096)
    w = synthetic.random_decoder(shape, dev, seed=5)
    total = CTX + K * LAUNCHES
    nblocks = total // BS + 8
    caches = synthetic.paged_kv_caches(shape, nblocks, BS, dev)
    bt = synthetic.shuffled_block_table(nblocks, (total + BS - 1) // BS, nblocks, dev, seed=1)
    synthetic.fill_context(caches, bt, CTX, shape.head_dim, seed=2)
    # the context before any launch, for the reference: the whole cache, or each rank's heads
    buf, full = None, None
    if world == 1:
        ref_caches = [c.clone() for c in caches]
    else:
        full = w
        ref_caches = [tp.shard_kv_caches(caches, r, world) for r in range(world)]
        w = tp.shard_decoder(full, rank, world)
        caches = tp.shard_kv_caches(caches, rank, world)
        torch.cuda.empty_cache()
        nbytes = tp.tp_buffer_layout(w.shape, world).nbytes
        buf, reason = SharedBuffer.create(ops.ops(), dist.group.WORLD, dev.index, nbytes)
        if buf is None:
            return {"error": f"shared buffer: {reason}"}
    sms = torch.cuda.get_device_properties(dev).multi_processor_count // grid_share
    mk = Monokernel(w, caches, dev, max_model_len=4096, max_tokens_per_launch=K, sm_count=sms, tp_buffer=buf)
    tokens, logits, token, pos = [], [], FIRST_TOKEN, CTX
    for _ in range(LAUNCHES):
        lo = torch.empty(K, mk.logical_vocab, dtype=torch.bfloat16, device=dev)
        slot = int(bt[pos // BS]) * BS + pos % BS
        toks, count = mk.generate(torch.tensor([token], device=dev), torch.tensor([pos], device=dev), bt,
                                  torch.tensor([slot], device=dev), K, logits_out=lo)  # fmt: skip
        n = int(count.item())
        tokens += toks[:n].tolist()
        logits.append(lo[:n].cpu())
        token, pos = tokens[-1], pos + n
    diag = mk.diagnostics()
    logits = torch.cat(logits)
    torch.save(logits, os.path.join(out_dir, f"logits_w{world}_r{rank}.pt"))
    # this rank's logits against its schedule's torch reference (reference_step_tp; reference_step at world 1),
    # fed the kernel's own tokens
    from kog_backend.monokernel import reference

    ref_rel = []
    shards = [tp.shard_decoder(full, r, world) for r in range(world)] if full is not None else None
    lo, n = w.shape.vocab_start, mk.logical_vocab
    for i in range(TF_STEPS):
        pos = CTX + i
        slot = int(bt[pos // BS]) * BS + pos % BS
        inp = FIRST_TOKEN if i == 0 else tokens[i - 1]
        if shards is None:
            r = reference.reference_step(w, ref_caches, inp, pos, slot, bt, mk.attention_splits(pos + 1))
        else:
            r = reference.reference_step_tp(shards, ref_caches, inp, pos, slot, bt, mk.attention_splits(pos + 1))
        exp = r["logits"][lo : lo + n].float().cpu()
        ref_rel.append(((logits[i].float() - exp).norm() / exp.norm()).item())
    if buf is not None:
        buf.close(group=dist.group.WORLD)
    return {"tokens": tokens, "diag": diag, "grid": mk.plan.grid, "splits": mk.plan.num_splits, "ref_rel": ref_rel}


@pytest.fixture(scope="module")
def mps_status():
    from kog_backend.collective.testing import mps

    with mps() as status:
        yield status


def _margin(row: torch.Tensor) -> tuple[float, float]:
    top2 = row.float().topk(2).values
    return float(top2[0] - top2[1]), float(top2[0].abs())


@pytest.mark.parametrize("shape_name,world", [("llama-3.2-1b", 2), ("qwen3-1.7b", 2), ("llama-3.2-1b", 4)])
def test_tp_tokens_match_world1(shape_name, world, mps_status, tmp_path):
    from kog_backend.collective.testing import run_ranks

    if not mps_status.startswith("mps"):
        pytest.skip(f"two ranks on one GPU need CUDA MPS to run concurrently ({mps_status})")
    base = run_ranks(tp_worker, 1, args=(shape_name, str(tmp_path), 1), timeout_s=300)[0]
    ranks = run_ranks(tp_worker, world, args=(shape_name, str(tmp_path), world), timeout_s=300)
    problems = [f"rank {r}: {res['error']}" for r, res in enumerate(ranks) if "error" in res]
    assert not problems, problems
    problems += [f"world 1: timeout: {base['diag']}"] if base["diag"] else []
    problems += [f"rank {r}: timeout: {res['diag']}" for r, res in enumerate(ranks) if res["diag"]]
    for r in range(1, world):
        assert ranks[r]["tokens"] == ranks[0]["tokens"], f"ranks 0, {r}: {ranks[0]['tokens']} vs {ranks[r]['tokens']}"
    t1, t2 = base["tokens"], ranks[0]["tokens"]
    l1 = torch.load(tmp_path / "logits_w1_r0.pt")
    l2 = torch.cat([torch.load(tmp_path / f"logits_w{world}_r{r}.pt") for r in range(world)], dim=1)
    assert l2.shape[1] == l1.shape[1], (l1.shape, l2.shape)
    first = next((i for i, (a, b) in enumerate(zip(t1, t2)) if a != b), None)
    upto = first + 1 if first is not None else min(len(t1), len(t2))
    for name, res in [("world 1", base)] + [(f"rank {r}", res) for r, res in enumerate(ranks)]:
        for i, rel in enumerate(res["ref_rel"]):
            if rel > REF_RTOL:
                problems.append(f"{name}, token {i}: logits rel err {rel:.2e} vs its torch reference")
    worst = 0.0
    for i in range(upto):
        rel = ((l2[i].float() - l1[i].float()).norm() / l1[i].float().norm()).item()
        worst = max(worst, rel)
        if rel > W1_RTOL:
            problems.append(f"token {i}: logits rel err {rel:.2e} (world {world} vs world 1)")
    report = (f"{shape_name}: world 1 grid {base['grid']}, world {world} grid {ranks[0]['grid']} x {world}; "
              f"{upto if first is None else first} of {len(t1)} greedy tokens identical; logits vs world 1 within "
              f"{worst:.2e}; vs the torch reference: world {world} within "
              f"{max(x for res in ranks for x in res['ref_rel']):.2e}, "
              f"world 1 within {max(base['ref_rel']):.2e}")  # fmt: skip
    if first is not None:
        margin, top = _margin(l1[first])
        report += f"; first difference at {first}: world-1 top-2 margin {margin:.4f} of top {top:.3f}"
        if margin > 0.02 * top:
            problems.append(f"token {first} differs ({t1[first]} vs {t2[first]}) with a top-2 margin of {margin:.4f}")
    else:
        assert len(t1) == len(t2) == K * LAUNCHES, (len(t1), len(t2))
    print(report)
    assert not problems, "\n".join([report] + problems)
