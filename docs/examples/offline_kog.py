#!/usr/bin/env python3
"""kog offline, with vLLM's own arguments: `python3 docs/examples/offline_kog.py CHECKPOINT [K]`.

Generates from one prompt with kog selected and prints the text and the kog workers' counters.
"""

import sys

from vllm import LLM, SamplingParams

ckpt = sys.argv[1]
k = int(sys.argv[2]) if len(sys.argv) > 2 else 8

llm = LLM(
    model=ckpt,
    worker_cls="kog_backend.engine.worker.KogWorker",
    additional_config={"kog": {"tokens_per_step": k}},
    scheduler_cls="kog_backend.engine.scheduler.KogScheduler",  # needed for tokens_per_step > 1
    max_model_len=2048,
)
out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=64, temperature=0.0))
print(repr(out[0].outputs[0].text))
stats = llm.collective_rpc("kog_stats")  # one dict per worker
print(stats)
sys.exit(0 if stats[0]["kog_steps"] > 0 else 1)
