"""µs per step of the MoE kernel instantiation (csrc/include/kog/moe_stages.cuh) on random weights of Qwen3-30B-A3B's
shape (or fewer of its layers), without vLLM, beside the device-to-device copy rate measured in the same process.

    python3 benchmarks/bench_moe_monokernel.py [--layers 48] [--ctx 32,4096] [--tokens 1,8] [--reps 20]

Bytes per token are the ones a token reads: attention's projections, the router and the k routed experts of every
layer (moe_plan.MoePlan.layer_bytes), the LM head, the norms, one embedding row and the KV cache up to the context.
The whole shape holds about 61 GB of bf16 weights (an H100 80GB holds it with a short context).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_monokernel import copy_bandwidth, time_steps  # noqa: E402

from kog_backend.monokernel import Monokernel, synthetic  # noqa: E402
from kog_backend.reference.moe_step import MoeShape  # noqa: E402
from kog_backend.tools.fixtures.shapes import SHAPES  # noqa: E402

BS = 16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (default: the shape's)")
    ap.add_argument("--ctx", default="32,4096", help="context lengths (positions), comma-separated")
    ap.add_argument("--tokens", default="1,8", help="tokens per launch (K), comma-separated")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    ctxs = [int(x) for x in args.ctx.split(",")]
    ks = [int(x) for x in args.tokens.split(",")]
    c = SHAPES[args.shape]
    layers = args.layers or c["num_hidden_layers"]
    max_ctx = max(ctxs) + max(ks) + 8
    s = synthetic.make_shape("qwen3", layers, c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                             c["head_dim"], c["intermediate_size"], c["vocab_size"], c["tie_word_embeddings"],
                             max_ctx + 64)  # fmt: skip
    moe = MoeShape(c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"], c["norm_topk_prob"])
    copy_gbs = copy_bandwidth(dev)
    w = synthetic.random_moe_decoder(s, moe, dev, seed=1)
    num_blocks = max_ctx // BS + 16
    caches = synthetic.paged_kv_caches(s, num_blocks, BS, dev)
    mk = Monokernel(w, caches, dev, max_model_len=max_ctx, max_tokens_per_launch=max(ks))
    plan = mk.moe_plan
    H, D = s.hidden_size, s.head_dim
    weight_bytes = (layers * plan.layer_bytes() + plan.kernel.stages[4].bytes
                    + (layers * (2 * H + 2 * D) + H) * 2 + H * 2)  # fmt: skip
    bt = synthetic.shuffled_block_table(num_blocks, num_blocks - 1, num_blocks, dev, seed=3)
    synthetic.fill_context(caches, bt, max(ctxs), D, seed=4)
    ids = torch.tensor([42], device=dev)
    print(f"{args.shape}, {layers} layers, {torch.cuda.get_device_name(dev)}: copy bandwidth {copy_gbs:.0f} GB/s; "
          f"{weight_bytes / 1e9:.3f} GB of weights per token; grid {plan.kernel.grid}, {plan.kernel.num_slots} slots "
          f"of {plan.kernel.slot_bytes} B")  # fmt: skip
    print(f"{'ctx':>7} {'K':>3} {'us/token':>9} {'tok/s':>7} {'GB/s':>6} {'% of copy':>9}")
    for ctx in ctxs:
        pos = ctx - 1
        positions = torch.tensor([pos], device=dev)
        slots = torch.tensor([int(bt[pos // BS]) * BS + pos % BS], device=dev)
        for k in ks:
            secs = time_steps(lambda: mk.generate(ids, positions, bt, slots, k), args.reps) / k
            diag = mk.diagnostics()
            if diag is not None:
                print(f"{ctx:>7} {k:>3} aborted: {diag}")
                mk.reset_counters()
                continue
            nbytes = weight_bytes + (ctx + (k - 1) / 2) * s.kv_bytes_per_position
            gbs = nbytes / secs / 1e9
            print(f"{ctx:>7} {k:>3} {secs * 1e6:>9.1f} {1 / secs:>7.1f} {gbs:>6.0f} {100 * gbs / copy_gbs:>8.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
