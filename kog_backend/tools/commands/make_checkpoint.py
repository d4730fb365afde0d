"""`kog make-checkpoint`: write a random-weight checkpoint of an embedded model shape and print its path.

    kog make-checkpoint                          # llama-3.2-1b, seed 0, ~/.cache/kog_backend/checkpoints/...
    vllm serve "$(kog make-checkpoint)" --backend kog
    kog make-checkpoint --fp8 block              # FP8 weights with 128x128 block scales (tools/fixtures/fp8_checkpoints)
    kog make-checkpoint --shape qwen3-30b-a3b --dummy   # config + tokenizer only: vllm serve ... --load-format dummy
"""

from __future__ import annotations

import argparse
import sys

from kog_backend.tools.fixtures import shapes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", default=shapes.DEFAULT_SHAPE, choices=shapes.shape_names(),
                   help=f"model shape (default {shapes.DEFAULT_SHAPE})")
    p.add_argument("--out", default="", help="output directory (default $KOG_CHECKPOINT_DIR/<shape>-seed<seed> "
                   "or ~/.cache/kog_backend/checkpoints/<shape>-seed<seed>)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--device", default="auto", help="where weights are drawn: auto (cuda if present), cuda, cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--fp8", default=None, choices=["tensor", "channel", "block"],
                   help="store the layers' projections in FP8 (e4m3), quantised from the bf16 weights, in the format "
                        "vLLM loads: tensor (fp8, per-tensor scales), channel (compressed-tensors, per-channel "
                        "scales), block (fp8, 128x128 block scales); embedding, LM head and norms stay bf16")
    p.add_argument("--force", action="store_true", help="replace a different kog checkpoint already in --out")
    p.add_argument("--dummy", action="store_true", help="write config.json, generation_config.json and the tokenizer "
                   "only (no weights), for vLLM's --load-format dummy; default --out <checkpoint dir>/<shape>-dummy")
    p.add_argument("--list", action="store_true", help="list the shapes with their weight bytes per token and exit")


def run(args: argparse.Namespace) -> int:
    if args.list:
        width = max(map(len, shapes.SHAPES))
        for name, cfg in shapes.SHAPES.items():
            print(f"{name:{width}s} {cfg['architectures'][0]:18s} {shapes.param_count(name) / 1e9:6.3f} B params  "
                  f"{shapes.weight_bytes_per_token(name) / 1e9:6.3f} GB read per token (bf16)")
        return 0

    if args.dummy:
        if args.fp8:
            print("kog make-checkpoint: --dummy writes no weights; --fp8 applies to weights only", file=sys.stderr)
            return 2
        from kog_backend.tools.fixtures.checkpoints import write_dummy

        try:
            path = write_dummy(args.shape, args.out or None, force=args.force)
        except FileExistsError as e:
            print(f"kog make-checkpoint: {e}", file=sys.stderr)
            return 2
        print(path)
        return 0

    import torch

    from kog_backend.tools.fixtures.checkpoints import write_checkpoint

    try:
        path = write_checkpoint(
            args.shape,
            args.out or None,
            seed=args.seed,
            device=args.device,
            dtype=getattr(torch, args.dtype),
            force=args.force,
            fp8=args.fp8,
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
        )
    except (FileExistsError, ValueError) as e:
        print(f"kog make-checkpoint: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
