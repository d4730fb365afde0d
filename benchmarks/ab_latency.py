#!/usr/bin/env python3
"""A/B latency of stock vLLM against kog, batch 1: the script form of `kog bench` (same options).

    python3 benchmarks/ab_latency.py                                  # llama-3.2-1b shape, 32-token prompt, 512 new tokens
    python3 benchmarks/ab_latency.py --model qwen3-1.7b --model llama-3.1-8b -K 8 --out results/
    python3 benchmarks/ab_latency.py --url http://127.0.0.1:8000 --url http://127.0.0.1:8001 --label stock --label kog

Runs from a checkout without installing: the repository root is put on sys.path.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kog_backend.tools.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
