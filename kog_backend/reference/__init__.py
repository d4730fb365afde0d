"""Torch references of what the kernels compute, stage by stage: the decode step (stock's recipe) and vLLM's
sampler, bit for bit, with the burst's cut schedule."""
