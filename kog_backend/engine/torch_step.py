"""The torch step: the kog path computed by kog_backend.reference.torch_step on vLLM's weights and paged KV cache.

Runs where the option step_impl is `torch` (validation: slower than stock), and for the one step whose monokernel
launch the launcher refused (its bookkeeping was done; kog is off from the next step). Reads the step's
`input_ids`, `positions`, block-table row and slot (step_io.StepInputs) and writes each position's K and V into
vLLM's cache at that slot. One token: the final hidden state, on which vLLM's own LM head and sampler run in
sample_tokens. K > 1 (greedy): each token is the next position's input, its slot computed on the GPU from the
block-table row (KogScheduler reserved it), and `sample` hands vLLM the tokens (step_io.BurstTokens). All indices
stay on the device.
"""

from __future__ import annotations

from typing import Any

import torch

from kog_backend.engine.step_io import BurstTokens, StepInputs
from kog_backend.path import model_spec
from kog_backend.reference import moe_step, torch_step


class TorchStep:
    name = "torch"

    def __init__(self, model: Any, weights: model_spec.DecoderWeights, kv_caches: list[torch.Tensor],
                 device: torch.device):  # fmt: skip
        self.model = model  # vLLM's model: its embedding and LM head (compute_logits)
        self.weights = weights
        self.kv_caches = kv_caches
        self.device = device
        self.all_reduce = None
        if weights.shape.tp_size > 1:
            from vllm.distributed import tensor_model_parallel_all_reduce

            self.all_reduce = tensor_model_parallel_all_reduce

    def run(self, inputs: StepInputs, k: int) -> tuple[torch.Tensor, BurstTokens | None]:
        """(hidden state [1, H], None) for one token: vLLM's own LM head and sampler run on this hidden state in
        sample_tokens; (last hidden state, the burst's tokens) for k > 1."""
        if k == 1:
            # One token: vLLM's own LM head and sampler run on this hidden state in sample_tokens.
            return self.hidden(inputs.batch, inputs.block_table, inputs.slot, inputs.batch.input_ids[:1], 0), None
        return self.burst(inputs, k)

    def burst(self, inputs: StepInputs, k: int) -> tuple[torch.Tensor, BurstTokens]:
        """Greedy decoding of k tokens, each the next position's input, each position's K/V written into the
        slots KogScheduler reserved. Returns the last hidden state and the tokens for `sample`."""
        input_batch, block_table, slot = inputs.batch, inputs.block_table, inputs.slot
        block_size = self.kv_caches[0].shape[2]
        tokens = torch.empty(1, k, dtype=torch.int64, device=self.device)
        token = input_batch.input_ids[:1]
        position = input_batch.positions[0]
        for j in range(k):
            if j > 0:
                pos = position + j
                slot = block_table[pos // block_size].long() * block_size + pos % block_size
            hidden = self.hidden(input_batch, block_table, slot, token, j)
            logits = self.model.compute_logits(hidden)
            tokens[0, j] = torch_step.greedy(logits[0])
            token = tokens[0, j : j + 1]
        num_sampled = torch.full((1,), k, dtype=torch.int32, device=self.device)
        # post_update advances num_computed_tokens by query_len - num_rejected = 1 - (1 - k) = k positions.
        num_rejected = torch.full((1,), 1 - k, dtype=torch.int32, device=self.device)
        return hidden, BurstTokens(tokens, num_sampled, num_rejected)

    def hidden(
        self, input_batch: Any, block_table: torch.Tensor, slot: torch.Tensor, token: torch.Tensor, offset: int
    ) -> torch.Tensor:
        """Final hidden state [1, H] of `token` (int [1], device) at the step's position + offset. All indices stay
        on the device; the host only knows an upper bound of the context length (seq_lens_cpu_upper_bound)."""
        residual = self.model.model.embed_tokens(token)[0]
        max_seq_len = int(input_batch.seq_lens_cpu_upper_bound[0]) + offset
        moe = getattr(self.weights, "moe", None)  # a Qwen3-MoE model (moe_step.MoeDecoderWeights): its sparse block
        hidden = torch_step.decode_hidden(
            self.weights,
            self.kv_caches,
            residual,
            input_batch.positions[0] + offset,
            slot,
            block_table,
            max_seq_len,
            self.all_reduce,
            mlp=None if moe is None else moe_step.moe_mlp(moe),
        )
        return hidden.view(1, -1)
