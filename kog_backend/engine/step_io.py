"""What a kog step reads from vLLM and what it leaves for `KogModelRunner.sample`.

The inputs are vLLM's own GPU buffers of the step, as the stock bookkeeping filled them (`prepare_inputs`,
`prepare_attn`): nothing is read back to the host, which knows only vLLM's upper bound of the context length. The
step leaves either a final hidden state alone (vLLM's LM head and sampler run on it in sample_tokens), or the
monokernel's logits of one token (KernelLogits: vLLM's sampler draws from them), or a burst's tokens (BurstTokens:
handed to vLLM as the step's sampler output).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.v1.worker.gpu.sample.output import SamplerOutput

from kog_backend.engine.kog_request import KogRequest


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """One eligible step of one request."""

    batch: Any  # vLLM's InputBatch: input_ids (the last sampled token, written on the GPU), positions, idx_mapping...
    block_table: torch.Tensor  # int32 [blocks], GPU: the request's row of vLLM's block table (first KV-cache group)
    slot_mapping: torch.Tensor  # int64 [1], GPU: vLLM's slot of this position
    request: KogRequest
    block_tables: Any  # vLLM's BlockTables: how many blocks the request holds (num_blocks, host)

    @property
    def slot(self) -> torch.Tensor:
        """0-dim view of this position's slot."""
        return self.slot_mapping[0]

    def blocks_held(self) -> int:
        """KV blocks the step's request holds (vLLM's host-side block count: KogScheduler's look-ahead included)."""
        return int(self.block_tables.num_blocks.np[0, self.batch.idx_mapping_np[0]])


@dataclasses.dataclass(frozen=True)
class KernelLogits:
    """A K = 1 monokernel launch: vLLM's sampler draws from its logits (exact vLLM semantics for every sampling
    setting); its count (int32 [1], GPU) is 1, or 0 when the launch aborted."""

    logits: torch.Tensor  # bf16 [1, vocab], GPU
    count: torch.Tensor

    def sample(self, sampler: Any, input_batch: Any) -> tuple[SamplerOutput, torch.Tensor, torch.Tensor]:
        out = sampler(self.logits, input_batch)
        # The launch's count (1, or 0 when it aborted: the token drawn from its logits is dropped and the
        # scheduler retakes the position), in place of the sampler's 1.
        count = self.count
        out.num_sampled, out.num_rejected = count, 1 - count
        return out, out.num_sampled, out.num_rejected


@dataclasses.dataclass(frozen=True)
class BurstTokens:
    """A burst's tokens as one step's sampler output: vLLM's postprocess_sampled appends num_sampled tokens to the
    request's GPU state and advances num_computed_tokens by query_len - num_rejected = 1 - (1 - n) = n positions."""

    tokens: torch.Tensor  # int64 [1, K], GPU; entries past num_sampled are unspecified
    num_sampled: torch.Tensor  # int32 [1], GPU
    num_rejected: torch.Tensor  # int32 [1], GPU: 1 - num_sampled

    def sample(self, sampler: Any, input_batch: Any) -> tuple[SamplerOutput, torch.Tensor, torch.Tensor]:
        out = SamplerOutput(
            sampled_token_ids=self.tokens, logprobs_tensors=None, num_nans=None,
            num_sampled=self.num_sampled, num_rejected=self.num_rejected,
        )  # fmt: skip
        return out, self.num_sampled, self.num_rejected
