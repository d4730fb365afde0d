"""Which quantised-weight format a checkpoint's quantization_config describes, as vLLM 0.26 would load it.

Facts only (names, shapes, dtypes); the gate (kog_backend.path.gate.model) turns them into reasons. The FP8 (e4m3)
formats, each a layout of the scale that multiplies the stored weight, w = float(w_fp8) * scale:

  layout   config.json quantization_config                              scale tensor of a weight [N, K]
  tensor   quant_method "fp8", no weight_block_size (AutoFP8)           weight_scale     [] fp32
           compressed-tensors, weights strategy "tensor"                weight_scale     [1]
  channel  compressed-tensors, weights strategy "channel"               weight_scale     [N, 1]
  block    quant_method "fp8", weight_block_size [128, 128]             weight_scale_inv [ceil(N/128), ceil(K/128)] fp32
           compressed-tensors, weights strategy "block", [128, 128]     weight_scale     same shape

Sources (the venv's vllm 0.26.0, vllm/model_executor/...):
  layers/quantization/fp8.py:156-173             Fp8Config.from_config: quant_method, activation_scheme,
                                                 ignored_layers (or modules_to_not_convert), weight_block_size
  layers/quantization/fp8.py:354-379             weight; weight_scale (per tensor) or weight_scale_inv (block)
  layers/quantization/utils/fp8_utils.py:1247-1308  weight float8_e4m3fn [N, K]; scales float32: per tensor one
                                                 per fused shard, channel [N, 1], block [ceil(N/bn), ceil(K/bk)]
  parameter.py:302-306                           AutoFP8 per-tensor scales have no shape, compressed-tensors' [1]
  layers/quantization/compressed_tensors/compressed_tensors.py:526-560, 611-630, 812-846
                                                 which config_groups are FP8 (W8A8 on sm_89+, W8A16 otherwise)
  layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py:121-134  weight, weight_scale
The scales' dtype on disk: vLLM copies any float dtype into its float32 parameter. The `fp8` releases ship float32;
llm-compressor computes the scale in the observed weight's dtype (compressed_tensors/quantization/utils/
helpers.py:86), bf16 for a bf16 model.

Quantised: the seven projections of every decoder layer (q, k, v, o, gate, up, down); vLLM quantises only
LinearBase layers (fp8.py:175-220), so the embedding, the LM head (a VocabParallelEmbedding) and the norms stay in
the checkpoint's dtype. `ignored_layers` / `ignore` lists more modules kept unquantised.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

LAYOUTS = ("tensor", "channel", "block")
BLOCK = (128, 128)  # [block_n, block_k]: rows x input columns per block scale (the Qwen3-*-FP8 releases' size)
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
WEIGHT_DTYPE = "float8_e4m3fn"
SCALE_DTYPES = ("float32", "bfloat16", "float16")  # what vLLM's float32 scale parameters load from
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_LAYER_WEIGHT = re.compile(r"model\.layers\.(\d+)\.(" + "|".join(re.escape(p) for p in PROJECTIONS) + r")\.weight")


@dataclasses.dataclass(frozen=True)
class Fp8Format:
    """An FP8 weight format vLLM loads; `layout` is one of LAYOUTS."""

    method: str  # config.json quant_method: "fp8" or "compressed-tensors"
    layout: str
    ignored: tuple[str, ...] = ()  # module names kept unquantised (ignored_layers / ignore)
    online: bool = False  # quant_method fp8 with bf16 weights on disk: vLLM quantises them at load (per tensor)

    @property
    def scale_name(self) -> str:
        """The scale's suffix next to `<module>.weight` (fp8.py:366, :379; compressed_tensors_w8a8_fp8.py:134)."""
        return "weight_scale_inv" if (self.method == "fp8" and self.layout == "block") else "weight_scale"

    def scale_shapes(self, n: int, k: int) -> tuple[tuple[int, ...], ...]:
        """Scale shapes vLLM loads for a weight of [n, k] (a per-tensor scale: no shape or [1], parameter.py:302)."""
        if self.layout == "tensor":
            return ((), (1,))
        if self.layout == "channel":
            return ((n, 1),)
        return ((math.ceil(n / BLOCK[0]), math.ceil(k / BLOCK[1])),)

    def describe(self) -> str:
        """The layout as reasons and docs name it."""
        return f"{self.layout}, quantised at load" if self.online else layout_name(self.layout)

    def is_quantised(self, weight_name: str) -> bool:
        """A decoder projection's `.weight` that the format stores in FP8 (not listed as ignored)."""
        if _LAYER_WEIGHT.fullmatch(weight_name) is None:
            return False
        module = weight_name.removesuffix(".weight")
        return not any(_ignores(ig, module) for ig in self.ignored)


def layout_name(layout: str) -> str:
    """A layout as reasons and docs name it: tensor, channel, block 128x128."""
    return f"block {BLOCK[0]}x{BLOCK[1]}" if layout == "block" else layout


def _ignores(entry: str, module: str) -> bool:
    """An ignored_layers / ignore entry: a module name (or its tail), or compressed-tensors' "re:<pattern>"."""
    if entry.startswith("re:"):
        return re.match(entry[3:], module) is not None
    return module == entry or module.endswith("." + entry)


def quantised_weights(fmt: Fp8Format, names: Iterable[str]) -> list[str]:
    """The names among `names` that the format stores in FP8, sorted."""
    return sorted(n for n in names if fmt.is_quantised(n))


def weight_format(qcfg: Mapping[str, Any] | None, method: str | None = None) -> Fp8Format | str | None:
    """The FP8 format of config.json's quantization_config (or vLLM's --quantization `method` alone), or the name
    of a method that is not one of them (a str, for the gate's reason), or None when the weights are not quantised."""
    qcfg = _as_dict(qcfg)
    quant_method = str(qcfg.get("quant_method") or method or "") if qcfg else (method or "")
    if not quant_method:
        return None
    if quant_method == "fp8":
        return _fp8_method(qcfg, online=not qcfg)
    if quant_method == "compressed-tensors":
        return _compressed_tensors(qcfg)
    algo = qcfg.get("quant_algo") or (qcfg.get("quantization") or {}).get("quant_algo")  # modelopt: FP8, NVFP4, ...
    return f"{quant_method} {algo}" if algo else quant_method


def _as_dict(qcfg: Any) -> dict[str, Any]:
    if qcfg is None:
        return {}
    if isinstance(qcfg, Mapping):
        return dict(qcfg)
    to_dict = getattr(qcfg, "to_dict", None)  # a transformers QuantizationConfigMixin
    return dict(to_dict()) if to_dict is not None else {}


def _fp8_method(qcfg: Mapping[str, Any], online: bool) -> Fp8Format | str:
    if qcfg.get("activation_scheme", "dynamic") != "dynamic":
        return "fp8 with static activation scales"
    block = qcfg.get("weight_block_size")
    ignored = tuple(qcfg.get("ignored_layers") or qcfg.get("modules_to_not_convert") or ())
    if block is None:
        return Fp8Format("fp8", "tensor", ignored, online=online)
    if list(block) != list(BLOCK):
        return f"fp8 with weight_block_size {list(block)}"
    return Fp8Format("fp8", "block", ignored)


def _compressed_tensors(qcfg: Mapping[str, Any]) -> Fp8Format | str:
    if qcfg.get("kv_cache_scheme"):
        return "compressed-tensors kv_cache_scheme (quantised KV cache)"
    groups = list((qcfg.get("config_groups") or {}).values())
    if not groups:
        return "compressed-tensors without config_groups"
    layouts = {_ct_group(g) for g in groups}
    if len(layouts) > 1:
        return "compressed-tensors with mixed schemes " + ", ".join(sorted(layouts))
    layout = layouts.pop()
    if layout not in LAYOUTS:
        return layout
    return Fp8Format("compressed-tensors", layout, tuple(qcfg.get("ignore") or ()))


def _ct_group(group: Mapping[str, Any]) -> str:
    """One config group: an FP8 layout, or what the scheme is (compressed_tensors.py:526-560, 611-630)."""
    w = group.get("weights") or {}
    act = group.get("input_activations")
    kind, bits = w.get("type"), w.get("num_bits")
    if kind == "float" and bits == 4:
        return "compressed-tensors fp4 (nvfp4 / mxfp4)"
    if kind != "float" or bits != 8:
        a = f"a{act.get('num_bits')}" if act else "a16"
        return f"compressed-tensors {kind or '?'} w{bits}{a}"
    if not w.get("symmetric", True) or w.get("dynamic"):
        return "compressed-tensors fp8 with asymmetric or dynamic weights"
    if not act:
        # W8A16: vLLM 0.26 on CUDA runs it through Humming's or Marlin's FP8 kernel (model_executor/kernels/linear/
        # __init__.py, _POSSIBLE_WFP8A16_KERNELS), which repack and pad the weights: nothing kog could read.
        return "compressed-tensors fp8 weights only (w8a16: vLLM repacks them for its Humming / Marlin kernel)"
    if not act.get("dynamic"):
        return "compressed-tensors fp8 with static activation scales"
    strategy = w.get("strategy")
    if strategy == "block" and list(w.get("block_structure") or ()) != list(BLOCK):
        return f"compressed-tensors fp8 with block_structure {w.get('block_structure')}"
    if strategy in LAYOUTS:
        return strategy
    return f"compressed-tensors fp8 with strategy {strategy}"
