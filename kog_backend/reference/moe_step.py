"""One decode step of a Qwen3-MoE model (Qwen3MoeForCausalLM) in plain torch, on weights in vLLM 0.26's fused-MoE
layout: the oracle a MoE monokernel will be checked against, stage by stage. Attention, norms, embedding and LM head
are the dense step's (kog_backend.reference.torch_step); the sparse MoE block replaces the dense MLP.

Weights per layer (bf16, row-major [out, in]), as vLLM 0.26 holds them:
  router  [E, H]        mlp.gate.weight, a ReplicatedLinear (model_executor/models/qwen3_moe.py:172-178)
  w13     [E, 2 I, H]   mlp.experts.routed_experts.w13_weight (mlp.experts is a MoERunner, fused_moe/layer.py):
                        per expert rows [0, I) gate_proj, [I, 2 I) up_proj
                        (model_executor/layers/fused_moe/unquantized_fused_moe_method.py:102-111 allocates it;
                        fused_moe/routed_experts.py:483-489 loads checkpoint shard w1 = gate_proj into rows [0, I)
                        and w3 = up_proj into rows [I, 2 I))
  w2      [E, H, I]     mlp.experts.routed_experts.w2_weight (unquantized_fused_moe_method.py:121-131), down_proj
I is moe_intermediate_size; E num_experts; k num_experts_per_tok.

Numeric recipe of the MoE block, after vLLM 0.26's unquantized Triton path (what fused_moe/oracle/unquantized.py:
75-79 picks first on SM 90: FlashInfer's backends go to the back there):
  router      logits = bf16(x @ router^T), fp32 accumulation                                         [E]
  route       p = softmax(fp32(logits)); the k largest p, in decreasing order, equal p to the lower expert index
              (vLLM's topk_softmax kernel, csrc/moe/topk_softmax_kernels.cu: "We want lower indices to 'win'");
              w = p[chosen], fp32; norm_topk_prob (vLLM's renormalize, qwen3_moe.py:211): w = w / sum(w)   [k]
  expert      gu = bf16(x @ w13[e]^T) [2 I]; a = bf16(bf16(silu(fp32 gate)) * fp32 up) [I]
              (experts/triton_moe.py:345-346 and 446, fused_moe/activation.py:161: torch.ops._C.silu_and_mul,
              whose silu_kernel returns the input's dtype before the bf16 product);
              y = bf16(fp32(a @ w2[e]^T) * w) [H]: the routing weight scales the fp32 accumulator before the one
              rounding (fused_moe.py:566-576, MUL_ROUTED_WEIGHT on the w2 GEMM, triton_moe.py:464-476)
  combine     out = bf16 of the k slot outputs added in fp32 in slot order ((0 + y_0) + y_1 + ...), rounded once
              (ops.moe_sum, triton_moe.py:536; the wheel's _moe_C holds moe_sum_vec_kernel for k in {1, 2, 4, 6,
              8, 9} and a dynamic and a scalar form, which accumulate in float: csrc/libtorch_stable/moe/
              moe_align_sum_kernels.cu)
The CUDA kernels (_moe_C) ship compiled in the wheel: their rules above were read from vLLM's source, not run here.
Ties: torch.topk does not specify which of equal values comes first; `route` sorts stably instead, so equal
probabilities go to the lower expert index, as the kernel does. The residual and post-attention norm are the dense
step's (add_rms_norm).

Hugging Face's Qwen3MoeForCausalLM (transformers 5) computes the same function with other roundings: routing
weights rounded to the activations' dtype, expert outputs scaled in that dtype and summed by index_add_
(models/qwen3_moe/modeling_qwen3_moe.py:241-245, 259-266). tests/test_moe_step.py compares the two.

Qwen3-MoE configs may make some layers dense (mlp_only_layers, decoder_sparse_step > 1) and Qwen2-MoE adds a shared
expert: this reference covers the sparse-only layout of Qwen3-30B-A3B and Qwen3-Coder-30B-A3B. Without the kog option
`moe_kernel` the gate refuses every MoE model (kog_backend.path.gate.model, reason `mixture_of_experts`).
"""

from __future__ import annotations

import dataclasses

import torch

from kog_backend.path.model_spec import DecoderShape
from kog_backend.reference import torch_step
from kog_backend.reference.torch_step import Index, linear


@dataclasses.dataclass(frozen=True)
class MoeShape:
    num_experts: int  # E
    top_k: int  # k, num_experts_per_tok
    intermediate_size: int  # I, moe_intermediate_size
    norm_topk_prob: bool  # renormalise the k routing weights to sum 1


@dataclasses.dataclass
class MoeLayerWeights:
    """One Qwen3-MoE decoder layer: the dense layer's attention and norms, then the sparse MoE block."""

    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(nh + 2 nkv) D, H], rows Q | K | V
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor  # [D]
    o_proj: torch.Tensor  # [H, nh D]
    post_norm: torch.Tensor  # [H]
    router: torch.Tensor  # [E, H]
    w13: torch.Tensor  # [E, 2 I, H], per expert rows gate | up
    w2: torch.Tensor  # [E, H, I]
    qkv_bias: None = None  # Qwen3-MoE has none; torch_step.attention_block reads the field


@dataclasses.dataclass
class MoeDecoderWeights:
    """A Qwen3-MoE model: `shape` as the dense model's (its intermediate_size is unused), `moe` the experts'."""

    shape: DecoderShape
    moe: MoeShape
    embed: torch.Tensor  # [V, H]
    layers: list[MoeLayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]
    cos_sin: torch.Tensor  # [max_pos, D], cos | sin
    fp8: None = None  # bf16 projections; torch_step's projections read the field (DecoderWeights.fp8)


@dataclasses.dataclass(frozen=True)
class Route:
    """One layer's routing of one token."""

    experts: torch.Tensor  # [k] int64, decreasing probability, equal ones by increasing index
    weights: torch.Tensor  # [k] fp32, renormalised when norm_topk_prob
    probs: torch.Tensor  # [E] fp32, the router's softmax


def route(logits: torch.Tensor, moe: MoeShape) -> Route:
    """Softmax over the E router logits in fp32, the k largest probabilities (ties: lower expert index first),
    renormalised to sum 1 when norm_topk_prob."""
    probs = torch.softmax(logits.float(), dim=-1)
    order = torch.sort(probs, descending=True, stable=True).indices[: moe.top_k]
    weights = probs[order]
    if moe.norm_topk_prob:
        weights = weights / weights.sum()
    return Route(order, weights, probs)


def expert_outputs(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, r: Route) -> torch.Tensor:
    """[k, H]: each chosen expert's down projection of silu(gate) * up, scaled by its routing weight in fp32 and
    rounded to w2's dtype once. x [H]; w13 [E, 2 I, H]; w2 [E, H, I]."""
    gate_up = torch.einsum("h,kjh->kj", x.float(), w13[r.experts].float()).to(w13.dtype)  # [k, 2 I]
    act = silu_and_mul_op(gate_up)  # [k, I]
    down = torch.einsum("ki,khi->kh", act.float(), w2[r.experts].float())  # [k, H] fp32
    return (down * r.weights[:, None]).to(w2.dtype)


def silu_and_mul_op(gate_up: torch.Tensor) -> torch.Tensor:
    """vLLM's silu_and_mul op on [..., 2 I] (gate, up): silu(gate) in fp32 rounded to the input's dtype, times up,
    rounded again (the dense step's torch_step.silu_and_mul rounds once, as the dense kernel does)."""
    g, u = gate_up.chunk(2, dim=-1)
    silu = (g.float() / (1.0 + torch.exp(-g.float()))).to(gate_up.dtype)
    return (silu.float() * u.float()).to(gate_up.dtype)


def combine(outputs: torch.Tensor) -> torch.Tensor:
    """Sum of the k slot outputs [k, H] in slot order, accumulated in fp32 and rounded to their dtype once (vLLM's
    moe_sum)."""
    acc = outputs[0].float()
    for y in outputs[1:]:
        acc = acc + y.float()
    return acc.to(outputs.dtype)


def moe_block(lw: MoeLayerWeights, x: torch.Tensor, moe: MoeShape, routes: list[Route] | None = None) -> torch.Tensor:
    """The sparse MoE block on x [H] (the post-attention norm's output) -> [H]; appends its Route to `routes`."""
    r = route(linear(x, lw.router), moe)
    if routes is not None:
        routes.append(r)
    return combine(expert_outputs(x, lw.w13, lw.w2, r))


def moe_mlp(moe: MoeShape, routes: list[Route] | None = None):
    """torch_step.decode_hidden's `mlp` for a Qwen3-MoE model: each layer's sparse MoE block (moe_block)."""
    return lambda lw, x: moe_block(lw, x, moe, routes)


def decode_hidden(
    weights: MoeDecoderWeights,
    kv_caches: list[torch.Tensor],
    embedded: torch.Tensor,
    position: Index,
    slot: Index,
    block_table: torch.Tensor,
    max_seq_len: int,
    routes: list[Route] | None = None,
) -> torch.Tensor:
    """Final-normed hidden state [H] of the token whose embedding row is `embedded` [H], at `position`:
    torch_step.decode_hidden with the MoE block for the MLP (TP = 1); appends its K/V to every layer and, when
    `routes` is given, each layer's Route in layer order."""
    return torch_step.decode_hidden(weights, kv_caches, embedded, position, slot, block_table, max_seq_len,
                                    mlp=moe_mlp(weights.moe, routes))
