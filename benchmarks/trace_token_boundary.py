"""Where a multi-token launch spends the token boundary: the timeline of one K-token launch (a KOG_TRACE build,
Monokernel.trace_table) from the last layer's completion of token t to the next token's first layer, per token.

Times in us relative to the moment the last layer of token t completed (latest kEvDownDone over blocks); each
event as min / median / max over the blocks that recorded it. Random weights with the real shapes (synthetic).
  PYTHONPATH=$PWD python3 benchmarks/trace_token_boundary.py --shape qwen3-1.7b --ctx 32 --tokens 4
"""

from __future__ import annotations

import argparse

import torch

from kog_backend.monokernel import Monokernel, synthetic
from kog_backend.monokernel.layout import TRACE_EVENTS

BS = 16
EV = {name: i for i, name in enumerate(TRACE_EVENTS)}
# (row: "L" the LM head's row of token t, "0" layer 0 of token t + 1; event; label)
POINTS = (
    ("L", "kEvLoaderLayer", "loader: first LM chunk issued"),
    ("L", "kEvQkvReady", "LM norm done (LmReady)"),
    ("L", "kEvQkvDone", "argmax slot published (LmDone)"),
    ("L", "kEvAttnReady", "next token seen (TokenSeen)"),
    ("0", "kEvLoaderLayer", "next token: loader's first layer-0 chunk"),
    ("0", "kEvQkvReady", "next token: layer-0 QKV norm done"),
    ("0", "kEvQkvLanded", "next token: last QKV chunk landed"),
    ("0", "kEvQkvDone", "next token: QKV published"),
    ("0", "kEvDownDone", "next token: layer 0 complete"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-1.7b")
    ap.add_argument("--ctx", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=4)
    args = ap.parse_args()
    dev = torch.device("cuda")
    s = synthetic.make_shape(*synthetic.SHAPES[args.shape], max_position=args.ctx + 64 + args.tokens)
    w = synthetic.random_decoder(s, dev, seed=1)
    num_blocks = (args.ctx + args.tokens) // BS + 16
    caches = synthetic.paged_kv_caches(s, num_blocks, BS, dev)
    mk = Monokernel(w, caches, dev, max_model_len=args.ctx + 8 + args.tokens)
    bt = synthetic.shuffled_block_table(num_blocks, num_blocks - 1, num_blocks, dev, seed=3)
    synthetic.fill_context(caches, bt, args.ctx, s.head_dim, seed=4)
    pos = args.ctx - 1
    positions = torch.tensor([pos], device=dev)
    slots = torch.tensor([int(bt[pos // BS]) * BS + pos % BS], device=dev)
    ids = torch.tensor([42], device=dev)
    table, tl = mk.trace_table(num_tokens=args.tokens)
    for _ in range(3):  # warm-up, then the traced launch
        tl.zero_()
        mk.generate(ids, positions, bt, slots, args.tokens, model_table=table)
        torch.cuda.synchronize()
    diag = mk.diagnostics()
    if diag:
        raise SystemExit(f"wait timed out: {diag}")
    tr = tl.to(torch.float64).cpu()
    L = s.num_layers
    print(f"{args.shape} ctx {args.ctx}, {args.tokens}-token launch: us after token t's last layer completed "
          "(min / median / max over blocks)")
    for t in range(args.tokens - 1):
        d = tr[t, L - 1, EV["kEvDownDone"]]
        t0 = float(d[d > 0].max())
        nxt = tr[t + 1, 0, EV["kEvDownDone"]]
        print(f"-- token {t} -> {t + 1}: next token's layer 0 complete at "
              f"{(float(nxt[nxt > 0].max()) - t0) / 1e3:.1f} us")
        for row, ev, label in POINTS:
            v = tr[t, L, EV[ev]] if row == "L" else tr[t + 1, 0, EV[ev]]
            v = (v[v > 0] - t0) / 1e3
            if v.numel():
                print(f"  {label:44s} {v.min():8.1f} {v.median():8.1f} {v.max():8.1f}  ({v.numel()} blocks)")
    # A layer in the middle of a token, for scale (its start: the previous layer complete).
    m = L // 2
    a, b = tr[1, m - 1, EV["kEvDownDone"]], tr[1, m, EV["kEvDownDone"]]
    print(f"-- for scale: layer {m} of token 1 took {(float(b[b > 0].max()) - float(a[a > 0].max())) / 1e3:.1f} us")


if __name__ == "__main__":
    main()
