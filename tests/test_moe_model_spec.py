"""model_spec.from_vllm_model on a Qwen3-MoE model as vLLM 0.26 holds it after loading (a stand-in of its modules:
mlp.gate, mlp.experts.routed_experts.w13_weight / w2_weight, mlp.experts being a MoERunner): with the kog option
moe_kernel, views of vLLM's own parameters as moe_step.MoeDecoderWeights, which the MoE kernel's gate accepts; without
it, the mixture-of-experts reason; configs with dense layers, quantised weights or another MoE backend refused with
theirs. Fresh random weights each run."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from vllm_fp8_models import Node, RotaryEmbedding, _param  # noqa: E402

from kog_backend.monokernel import synthetic  # noqa: E402
from kog_backend.path import model_spec  # noqa: E402
from kog_backend.path.gate import monokernel as mk_gate  # noqa: E402
from kog_backend.reference.moe_step import MoeShape  # noqa: E402

CPU = torch.device("cpu")


def _weights(moe=MoeShape(16, 8, 128, True)):
    shape = synthetic.make_shape("qwen3", 2, 256, 8, 2, 128, 128, 512, False, 64)
    return synthetic.random_moe_decoder(shape, moe, CPU, seed=int(torch.randint(0, 2**31, (1,))))


TRITON = types.SimpleNamespace(name="TRITON")  # vLLM's UnquantizedMoeBackend.TRITON, as the gate reads it (.name)


def _vllm_moe_model(w, backend=TRITON, **hf_over):
    """A stand-in of vLLM's Qwen3MoeForCausalLM over w (its experts on `backend`) and its config."""
    s, moe = w.shape, w.moe
    rope = RotaryEmbedding(is_neox_style=True, rotary_dim=s.head_dim, cos_sin_cache=w.cos_sin)
    layers = []
    for lw in w.layers:
        layers.append(Node(
            input_layernorm=Node(weight=_param(lw.input_norm), variance_epsilon=s.rms_eps),
            post_attention_layernorm=Node(weight=_param(lw.post_norm), variance_epsilon=s.rms_eps),
            self_attn=Node(
                qkv_proj=Node(weight=_param(lw.qkv)), o_proj=Node(weight=_param(lw.o_proj)), head_dim=s.head_dim,
                num_heads=s.num_heads, num_kv_heads=s.num_kv_heads, rotary_emb=rope, attn=Node(sinks=None),
                q_norm=Node(weight=_param(lw.q_norm)), k_norm=Node(weight=_param(lw.k_norm)),
            ),
            mlp=Node(gate=Node(weight=_param(lw.router)),  # vLLM 0.26: mlp.experts is a MoERunner
                     experts=Node(routed_experts=Node(w13_weight=_param(lw.w13), w2_weight=_param(lw.w2),
                                                      quant_method=Node(unquantized_backend=backend)))),
        ))  # fmt: skip
    model = Node(model=Node(layers=torch.nn.ModuleList(layers), embed_tokens=Node(weight=_param(w.embed)),
                            norm=Node(weight=_param(w.final_norm))),
                 lm_head=Node(weight=_param(w.lm_head)))  # fmt: skip
    hf = types.SimpleNamespace(
        architectures=["Qwen3MoeForCausalLM"], vocab_size=s.vocab_size, sliding_window=None, rope_scaling=None,
        num_experts=moe.num_experts, num_experts_per_tok=moe.top_k, moe_intermediate_size=moe.intermediate_size,
        norm_topk_prob=moe.norm_topk_prob, mlp_only_layers=[], decoder_sparse_step=1,
    )  # fmt: skip
    for k, v in hf_over.items():
        setattr(hf, k, v)
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=hf, quantization=None, dtype=torch.bfloat16),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
    )
    return model, config


def test_qwen3_moe_is_read_as_views_of_vllm_parameters():
    w = _weights()
    model, config = _vllm_moe_model(w)
    got = model_spec.from_vllm_model(model, config, moe_kernel=True)
    assert got.moe == w.moe and got.shape == w.shape
    for i, (lw, layer) in enumerate(zip(got.layers, model.model.layers)):
        assert lw.router is layer.mlp.gate.weight and lw.w13 is layer.mlp.experts.routed_experts.w13_weight, i
        assert lw.w2 is layer.mlp.experts.routed_experts.w2_weight and lw.qkv is layer.self_attn.qkv_proj.weight, i
        assert torch.equal(lw.w13, w.layers[i].w13) and lw.q_norm is layer.self_attn.q_norm.weight
    assert got.lm_head is model.lm_head.weight and got.embed is model.model.embed_tokens.weight
    assert mk_gate.weights_reason(got, CPU) is None
    assert not isinstance(mk_gate.moe_plan_or_reason(got.shape, got.moe, 132, 1), str)


def test_without_the_option_moe_stays_stock():
    model, config = _vllm_moe_model(_weights())
    with pytest.raises(model_spec.UnsupportedModel, match="mixture-of-experts is not on the kog path"):
        model_spec.from_vllm_model(model, config)


@pytest.mark.parametrize("over, match", [
    (dict(mlp_only_layers=[1]), r"mlp_only_layers \[1\] / decoder_sparse_step 1"),
    (dict(decoder_sparse_step=2), "decoder_sparse_step 2"),
    (dict(architectures=["Qwen2MoeForCausalLM"]), "mixture-of-experts is not on the kog path"),
])  # fmt: skip
def test_configs_the_moe_kernel_does_not_run(over, match):
    model, config = _vllm_moe_model(_weights(), **over)
    with pytest.raises(model_spec.UnsupportedModel, match=match):
        model_spec.from_vllm_model(model, config, moe_kernel=True)


@pytest.mark.parametrize("backend", ["FLASHINFER_CUTLASS", "FLASHINFER_TRTLLM", "AITER", None])
def test_moe_backends_other_than_triton_are_refused(backend):
    """Only the Triton backend keeps w13 as [gate rows; up rows] (FlashInfer's CUTLASS backend swaps them with the
    same shape): any other backend, or experts without one, is refused with the backend named."""
    w = _weights()
    model, config = _vllm_moe_model(w, backend=types.SimpleNamespace(name=backend) if backend else None)
    with pytest.raises(model_spec.UnsupportedModel, match=f"vLLM's MoE backend {backend}: the MoE kernel reads"):
        model_spec.from_vllm_model(model, config, moe_kernel=True)


class FusedTopKRouter:  # vLLM's softmax top-k router (fused_moe/router/fused_topk_router.py), as the gate reads it
    def __init__(self, renormalize, scoring_func="softmax"):
        self.renormalize, self.scoring_func = renormalize, scoring_func


class RoutingSimulatorRouter(FusedTopKRouter):  # VLLM_MOE_ROUTING_SIMULATION_STRATEGY's router
    pass


@pytest.mark.parametrize("case, match", [
    ("tp2", "split over GPUs \\(tensor parallelism 2"),
    ("expert_shards", r"w13 \[8, 256\] for \[16, 256\]"),
    ("shared_expert", "layer 0 has a shared expert"),
    ("simulated_router", "vLLM routes with RoutingSimulatorRouter"),
    ("no_renormalize", r"FusedTopKRouter \(scoring softmax, renormalize False\)"),
    ("vllm_router", None),
])  # fmt: skip
def test_moe_blocks_computed_otherwise_are_refused(case, match):
    """A layer kog's MoE block would not compute as vLLM does is refused before any launch: experts split over GPUs
    (tensor parallelism, or expert parallelism's share of E), a shared expert, a router other than vLLM's softmax
    top-k with the config's renormalisation; vLLM's own router with norm_topk_prob passes."""
    w = _weights()
    model, config = _vllm_moe_model(w)
    mlp = model.model.layers[0].mlp
    if case == "tp2":
        config.parallel_config.tensor_parallel_size = 2
    elif case == "expert_shards":
        mlp.experts.routed_experts.w13_weight = _param(w.layers[0].w13[:8])
    elif case == "shared_expert":
        mlp.shared_expert = Node()
    elif case == "simulated_router":
        mlp.experts.router = RoutingSimulatorRouter(True)
    elif case == "no_renormalize":
        mlp.experts.router = FusedTopKRouter(False)
    else:
        mlp.experts.router = FusedTopKRouter(True)
    if match is None:
        assert model_spec.from_vllm_model(model, config, moe_kernel=True).moe == w.moe
        return
    with pytest.raises(model_spec.UnsupportedModel, match=match):
        model_spec.from_vllm_model(model, config, moe_kernel=True)


def test_quantised_moe_is_refused():
    model, config = _vllm_moe_model(_weights())
    config.model_config.quantization = "fp8"
    config.model_config.hf_config.quantization_config = {"quant_method": "fp8"}
    with pytest.raises(model_spec.UnsupportedModel, match="mixture of experts: the MoE kernel streams bf16"):
        model_spec.from_vllm_model(model, config, moe_kernel=True)


def test_expert_shapes_the_kernel_cannot_read_are_refused():
    w = _weights()
    model, config = _vllm_moe_model(w)
    got = model_spec.from_vllm_model(model, config, moe_kernel=True)
    got.layers[1].w13 = got.layers[1].w13.transpose(1, 2)  # a backend that kept [E, H, 2 I]
    assert "layer 1 w13" in mk_gate.weights_reason(got, CPU)
