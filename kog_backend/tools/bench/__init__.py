"""A/B benchmark of stock vLLM against kog on one request (`kog bench`, benchmarks/ab_latency.py).

Imports nothing heavy: torch and vLLM are imported only in the subprocess that runs one engine
(`offline_child`), so each side of the A/B releases its GPU memory when its process exits.

  metrics       ms/token, tok/s, GB/s, share of copy bandwidth: the arithmetic, nothing else
  model_bytes   bytes one decode step reads (weights, KV cache) from a Hugging Face config
  results       the JSON schema (dataclasses, round-trip)
  sampling      which sampling the requests ask for (default: none set, the model's generation config) and how
                the header names the settings in force
  table, chart  the text table and the PNG
  offline       the parent: resolves checkpoints, runs one subprocess per engine, shows progress
  offline_child one engine: copy bandwidth, warm-up, timed generate calls, kog counters
  greedy_rounds --also-greedy: the same rounds greedy in the same engine, each row's own counters, the sampled
                kog row as a percentage of the greedy one
  weights       --dummy-weights: config + tokenizer only and load_format="dummy"; checkpoints too large to write
  fp8           --fp8 LAYOUT: each shape's FP8 checkpoint, its weight format in the header; --also-bf16: kog on
                the bf16 checkpoint too, kog FP8 / kog bf16
  http_client   streaming OpenAI client against live servers (`kog bench --url`)
"""
