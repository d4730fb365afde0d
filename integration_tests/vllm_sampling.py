"""vLLM 0.26's own sampling kernels on one row of logits: the draw kog's bursts must reproduce (GPU, vLLM needed)."""

from __future__ import annotations

import torch


def vllm_draw(x: torch.Tensor, *, temperature: float, seed: int, position: int, top_k: int = 0, top_p: float = 1.0,
              min_p: float = 0.0) -> int:
    """The token vLLM's V2 Sampler draws (its Gumbel-max path: seeded, or no FlashInfer) from bf16 logits x [V]:
    its _temperature_kernel, _min_p_kernel, apply_top_k_top_p and gumbel_sample, with SamplingStates' gating."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.worker.gpu.sample import gumbel, min_p as min_p_mod

    from kog_backend.reference.sampling import normalize_top_k_top_p

    dev = x.device
    logits = x.clone().unsqueeze(0)
    idx = torch.zeros(1, dtype=torch.int32, device=dev)
    temp = torch.tensor([temperature], dtype=torch.float32, device=dev)
    if float(temp) not in (0.0, 1.0):
        gumbel.apply_temperature(logits, idx, temp)
    if min_p != 0.0:
        min_p_mod.apply_min_p(logits, idx, torch.tensor([min_p], dtype=torch.float32, device=dev))
    k, p = normalize_top_k_top_p(top_k, top_p, logits.shape[1])
    logits = apply_top_k_top_p(
        logits,
        torch.tensor([k], dtype=torch.int32, device=dev) if k is not None else None,
        torch.tensor([p], dtype=torch.float32, device=dev) if p is not None else None,
    )
    return int(gumbel.gumbel_sample(
        logits, idx, temp, torch.tensor([seed], dtype=torch.int64, device=dev),
        torch.tensor([position], dtype=torch.int64, device=dev), apply_temperature=False, use_fp64=False,
    )[0])  # fmt: skip


def vllm_penalize(x: torch.Tensor, prompt_mask: torch.Tensor, output_counts: torch.Tensor, *,
                  repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
                  presence_penalty: float = 0.0) -> torch.Tensor:
    """vLLM 0.26's _penalties_kernel on a copy of bf16 logits x [V], with a request's PenaltiesState rows
    (prompt_mask int32 [ceil(V / 32)], output_counts int32 [V]); returns the penalised logits (bf16)."""
    from vllm.v1.worker.gpu.sample import penalties

    dev = x.device
    logits = x.clone().unsqueeze(0)
    zero = torch.zeros(1, dtype=torch.int32, device=dev)
    values = [torch.tensor([v], dtype=torch.float32, device=dev)
              for v in (repetition_penalty, frequency_penalty, presence_penalty)]
    penalties.apply_penalties(logits, zero, zero, zero, *values, prompt_mask.view(1, -1).contiguous(),
                              output_counts.view(1, -1).contiguous())
    return logits[0]
