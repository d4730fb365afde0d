"""Stand-ins for a loaded vLLM 0.26 decoder (`runner.model` after process_weights_after_loading, and its
vllm_config) built from a synthetic DecoderWeights, with the four projections' parameters as vLLM's FP8 linear
methods leave them on sm_90 without DeepGEMM / FlashInfer (model_spec.fp8_projection names the source lines):

  format         config                                   weight                            scale
  fp8-tensor     quant_method fp8                         [K, N] strides (1, K)             weight_scale fp32 []
  online-tensor  --quantization fp8 on a bf16 checkpoint  [K, N] strides (1, K)             weight_scale fp32 [1]
  ct-tensor      compressed-tensors, strategy tensor      [K, N] strides (1, K)             weight_scale fp32 []
  ct-channel     compressed-tensors, strategy channel     [K, N] strides (1, K)             weight_scale fp32 [N, 1]
  fp8-block      quant_method fp8, weight_block_size      [N, K] row-major                  weight_scale_inv fp32
  ct-block       compressed-tensors, strategy block       [N, K] row-major                  weight_scale fp32

(the block scales [ceil(N/128), ceil(K/128)] row-major). The local venv's vLLM cannot be asked: it picks other
kernels on a CPU host, so these modules carry the parameters by hand.
"""

from __future__ import annotations

import types

import torch

from kog_backend.path.model_spec import SCALE_FIELDS, DecoderWeights

FP8_BLOCK_CFG = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
_CT_W = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
_CT_A = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}


def _ct(strategy: str) -> dict:
    weights = {**_CT_W, "strategy": strategy, "block_structure": [128, 128] if strategy == "block" else None}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": _CT_A}}}


# format -> (layout, config.json quantization_config, vLLM's --quantization, the scale's parameter name)
FORMATS = {
    "fp8-tensor": ("tensor", {"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8", "weight_scale"),
    "online-tensor": ("tensor", None, "fp8", "weight_scale"),
    "ct-tensor": ("tensor", _ct("tensor"), "compressed-tensors", "weight_scale"),
    "ct-channel": ("channel", _ct("channel"), "compressed-tensors", "weight_scale"),
    "fp8-block": ("block", FP8_BLOCK_CFG, "fp8", "weight_scale_inv"),
    "ct-block": ("block", _ct("block"), "compressed-tensors", "weight_scale"),
}


class Node(torch.nn.Module):
    """A module whose keyword arguments become its children, parameters or plain attributes."""

    def __init__(self, **attrs):
        super().__init__()
        for name, value in attrs.items():
            setattr(self, name, value)


class RotaryEmbedding(Node):
    """Named as vLLM's plain RoPE module (model_gate.rotary_reason reads the class name)."""


def _param(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)  # keeps t's strides (a `.t()` view stays one)


def loaded_linear(weight: torch.Tensor, scale: torch.Tensor | None, fmt: str | None, n: int, k: int,
                  bias: torch.Tensor | None = None) -> Node:
    """A vLLM linear module of logical size [n, k] holding `weight` ([N, K] row-major, bf16 or float8) as format
    `fmt` leaves it after loading (None: bf16, as UnquantizedLinearMethod)."""
    attrs = {"input_size_per_partition": k, "output_size_per_partition": n, "bias": bias}
    if fmt is None:
        return Node(weight=_param(weight), **attrs)
    layout, _, _, scale_name = FORMATS[fmt]
    if fmt == "online-tensor":
        scale = scale.reshape(1)
    w = weight if layout == "block" else weight.t()  # CUTLASS's B operand: column-major [K, N]
    return Node(weight=_param(w), **{scale_name: _param(scale)}, **attrs)


def vllm_model(w: DecoderWeights, fmt: str | None = None, tp_size: int = 1):
    """(model, vllm_config) as KogModelRunner.load_model sees them, holding w's tensors (w.fp8 set: w's float8
    weights and scales in format `fmt`, of layout w.fp8)."""
    s = w.shape
    if fmt is not None:
        assert FORMATS[fmt][0] == w.fp8, (fmt, w.fp8)
    D, nq = s.head_dim, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    rope = RotaryEmbedding(is_neox_style=True, rotary_dim=D, cos_sin_cache=w.cos_sin)
    embed = _param(w.embed)
    layers = []
    for lw in w.layers:
        def lin(name, n, k, bias=None, lw=lw):
            return loaded_linear(getattr(lw, name), getattr(lw, SCALE_FIELDS[name]), fmt, n, k, bias)

        attn = {"q_norm": Node(weight=_param(lw.q_norm)), "k_norm": Node(weight=_param(lw.k_norm))} if s.qk_norm else {}
        layers.append(Node(
            input_layernorm=Node(weight=_param(lw.input_norm), variance_epsilon=s.rms_eps),
            post_attention_layernorm=Node(weight=_param(lw.post_norm), variance_epsilon=s.rms_eps),
            self_attn=Node(
                qkv_proj=lin("qkv", nq, s.hidden_size, _param(lw.qkv_bias) if lw.qkv_bias is not None else None),
                o_proj=lin("o_proj", s.hidden_size, s.num_heads * D), head_dim=D, num_heads=s.num_heads,
                num_kv_heads=s.num_kv_heads, rotary_emb=rope, attn=Node(sinks=None), **attn,
            ),
            mlp=Node(gate_up_proj=lin("gate_up", 2 * s.intermediate_size, s.hidden_size),
                     down_proj=lin("down", s.hidden_size, s.intermediate_size)),
        ))  # fmt: skip
    lm_head = embed if s.tied_embeddings else _param(w.lm_head)
    model = Node(model=Node(layers=torch.nn.ModuleList(layers), embed_tokens=Node(weight=embed),
                            norm=Node(weight=_param(w.final_norm))),
                 lm_head=Node(weight=lm_head))  # fmt: skip
    arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM"}[s.arch]
    _, qcfg, method, _ = FORMATS[fmt] if fmt is not None else (None, None, None, None)
    hf = types.SimpleNamespace(architectures=[arch], vocab_size=s.vocab_size, sliding_window=None, rope_scaling=None)
    if qcfg is not None:
        hf.quantization_config = qcfg
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=hf, quantization=method, dtype=torch.bfloat16),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp_size),
    )
    return model, config
