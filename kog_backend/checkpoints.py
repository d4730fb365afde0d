"""Random-weight checkpoints with a real model's shape, written locally (no downloads).

`write_checkpoint("llama-3.2-1b", out_dir)` writes what `vllm serve out_dir` and
`transformers.AutoModelForCausalLM.from_pretrained(out_dir)` read:
  config.json              the shape's config (kog_backend.shapes)
  generation_config.json   the model family's published file (shapes.generation_config): sampling defaults
                           that vLLM applies to requests that set none, end-of-generation ids
  model.safetensors        or model-0000k-of-0000n.safetensors + model.safetensors.index.json above 5 GB
  tokenizer.json, tokenizer_config.json, special_tokens_map.json   (kog_backend.tokenizer_builder)
  kog_checkpoint.json      marker: shape, seed, config; written last, so its presence means complete

Parameter names and shapes come from transformers' own model class instantiated on the meta device, so
they are exactly a real checkpoint's (tied LM heads are not stored, as in the published files). Each tensor
is drawn on `device` in the target dtype from its own generator, seeded by (seed, name): the full model never
exists in fp32 and only one shard (<= 5 GB) is held on the host at a time. The same seed gives the same
weights on the same device type; CPU and CUDA generators differ.

Init: linear and embedding weights N(0, initializer_range), the config's own init std (0.02 for the real
shapes, as those models are initialised before training); RMSNorm weights 1 + N(0, 0.02). For Llama-3.2-1B
the last-position logits then have a std of about 1 over the vocabulary and greedy decoding gives a distinct
token at nearly every step. As with any random model, logits are close to Gaussian, so the top two are often
near-tied (measured on the 1B in fp32: median top-1 minus top-2 = 0.16 logit std; 6% of steps below 0.02
std): two bf16 implementations that differ in rounding can pick different greedy tokens at such steps.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from typing import Any, Callable

from kog_backend import shapes, tokenizer_builder

MARKER = "kog_checkpoint.json"
MARKER_FORMAT = 1
MAX_SHARD_BYTES = 5 * 10**9
NORM_NOISE_STD = 0.02
_OWNED_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", MARKER)


def default_checkpoint_dir(shape: str, seed: int = 0) -> str:
    """$KOG_CHECKPOINT_DIR/<shape>-seed<seed>, else ~/.cache/kog_backend/checkpoints/<shape>-seed<seed>."""
    base = os.environ.get("KOG_CHECKPOINT_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "kog_backend", "checkpoints")
    return os.path.join(base, f"{shape}-seed{seed}")


def read_marker(out_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(out_dir, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def expected_generation_config(shape_name: str, cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """The shape's generation_config.json, checked against the tokenizer the project builds for it: same BOS,
    the same end-of-generation ids (end of text, end of turn), and config.json's eos_token_id among them."""
    cfg = shapes.get_shape(shape_name) if cfg is None else cfg
    gen = shapes.generation_config(shape_name if shape_name in shapes.GENERATION_CONFIGS else cfg)
    ids = tokenizer_builder.generation_config(tokenizer_builder.spec_for_config(cfg))
    if gen["bos_token_id"] != ids["bos_token_id"] or gen["eos_token_id"] != ids["eos_token_id"]:
        raise ValueError(f"{shape_name}: generation config ids {gen['bos_token_id']}, {gen['eos_token_id']} differ "
                         f"from the tokenizer's {ids['bos_token_id']}, {ids['eos_token_id']}")
    if cfg["eos_token_id"] not in gen["eos_token_id"]:
        raise ValueError(f"{shape_name}: config eos_token_id {cfg['eos_token_id']} not in {gen['eos_token_id']}")
    return gen


def is_current(out_dir: str, shape_name: str, seed: int = 0, dtype: str = "bfloat16") -> bool:
    """out_dir holds a complete checkpoint of shape_name and seed that write_checkpoint would leave as it is
    (same config, same generation config). Standard library only (the bench's parent process calls it)."""
    marker = read_marker(out_dir)
    if marker is None or shape_name not in shapes.SHAPES:
        return False
    cfg = shapes.get_shape(shape_name)
    cfg["torch_dtype"] = dtype
    return _marker_current(marker, shape_name, seed, cfg, expected_generation_config(shape_name, cfg))


def _marker_current(marker: dict[str, Any], shape_name: str, seed: int, cfg: dict[str, Any], gen: dict[str, Any]) -> bool:
    return (marker.get("shape") == shape_name and marker.get("seed") == seed and marker.get("format") == MARKER_FORMAT
            and marker.get("config") == cfg and marker.get("generation_config") == gen)


def _write_json(path: str, obj: Any) -> None:
    """Write through a temporary file and rename, so that a reader never sees half a file."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def write_metadata(out_dir: str, cfg: dict[str, Any], gen: dict[str, Any]) -> None:
    """Everything but the weights and the marker: config.json, generation_config.json, the tokenizer files."""
    os.makedirs(out_dir, exist_ok=True)
    for name, obj in (("config.json", cfg), ("generation_config.json", gen)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    tokenizer_builder.save_tokenizer(tokenizer_builder.spec_for_config(cfg), out_dir)


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _plan_shards(named_shapes: list[tuple[str, tuple[int, ...]]], elem_bytes: int) -> list[list[str]]:
    """Consecutive groups of parameter names of at most MAX_SHARD_BYTES each (one group if it all fits)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in named_shapes:
        n = elem_bytes
        for d in shape:
            n *= d
        if groups[-1] and size + n > MAX_SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += n
    return groups


def _shard_names(n: int) -> list[str]:
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def _resolve_device(device: str | None) -> str:
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def write_checkpoint(
    shape_name: str = shapes.DEFAULT_SHAPE,
    out_dir: str | None = None,
    seed: int = 0,
    device: str | None = None,
    dtype: Any = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> str:
    """Write a random-weight checkpoint of `shape_name` into out_dir (default: default_checkpoint_dir) and
    return the directory. If it already holds one with the same shape, seed and config, nothing is written.
    A directory holding a different kog checkpoint is refused unless force=True."""
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    cfg = shapes.get_shape(shape_name)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    out_dir = os.path.abspath(out_dir or default_checkpoint_dir(shape_name, seed))
    say = log or (lambda _msg: None)
    # Writers of one directory (servers or test sessions started together) take turns; the second finds
    # the first's marker and returns.
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    with open(out_dir + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _write_locked(shape_name, cfg, out_dir, seed, device, dtype, force, say)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_locked(shape_name, cfg, out_dir, seed, device, dtype, force, say) -> str:
    import torch

    gen = expected_generation_config(shape_name, cfg)
    marker = read_marker(out_dir)
    if marker is not None:
        same_run = marker.get("shape") == shape_name and marker.get("seed") == seed
        if _marker_current(marker, shape_name, seed, cfg, gen):
            say(f"{out_dir} already holds {shape_name} seed {seed}; nothing to do")
            return out_dir
        if same_run and marker.get("format") == MARKER_FORMAT and marker.get("config") == cfg:
            # Same weights (they depend on the shape's config, the seed and the device type only); a checkpoint
            # written before its generation config changed gets the current file, and the marker last.
            _write_json(os.path.join(out_dir, "generation_config.json"), gen)
            _write_json(os.path.join(out_dir, MARKER), {**marker, "generation_config": gen})
            say(f"{out_dir}: wrote the current generation_config.json of {shape_name}; weights kept")
            return out_dir
        if not same_run and not force:
            raise FileExistsError(
                f"{out_dir} holds kog checkpoint {marker.get('shape')} seed {marker.get('seed')}; "
                f"pass force=True (--force) to replace it with {shape_name} seed {seed}")
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    _remove_owned(out_dir)
    os.makedirs(out_dir, exist_ok=True)

    write_metadata(out_dir, cfg, gen)

    # Parameter names/shapes exactly as transformers defines them, read back from the config just written.
    hf_config = AutoConfig.from_pretrained(out_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    params = dict(model.named_parameters())  # shared (tied) tensors appear once, under the embedding's name
    if cfg["tie_word_embeddings"]:
        params.pop("lm_head.weight", None)
    extra = [k for k in model.state_dict() if k not in params and not (cfg["tie_word_embeddings"] and k == "lm_head.weight")]
    if extra:
        raise NotImplementedError(f"persistent buffers with no init rule: {extra}")
    named_shapes = [(name, tuple(p.shape)) for name, p in params.items()]
    del model, params

    device = _resolve_device(device)
    std = float(cfg["initializer_range"])
    elem_bytes = torch.empty((), dtype=dtype).element_size()
    groups = _plan_shards(named_shapes, elem_bytes)
    files = _shard_names(len(groups))
    shape_of = dict(named_shapes)
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for fname, names in zip(files, groups):
        shard: dict[str, torch.Tensor] = {}
        for name in names:
            g = torch.Generator(device=device).manual_seed(_tensor_seed(seed, name))
            t = torch.empty(shape_of[name], dtype=dtype, device=device)
            if name.endswith("norm.weight"):
                t.normal_(1.0, NORM_NOISE_STD, generator=g)
            elif t.dim() >= 2:
                t.normal_(0.0, std, generator=g)
            else:
                t.zero_()  # biases (none in the shipped shapes)
            shard[name] = t.cpu()
            del t
            weight_map[name] = fname
            total_bytes += shard[name].numel() * elem_bytes
        tmp = os.path.join(out_dir, fname + ".tmp")
        save_file(shard, tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(out_dir, fname))
        say(f"wrote {fname} ({len(names)} tensors)")
        del shard
    if len(files) > 1:
        index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")

    marker = {
        "format": MARKER_FORMAT,
        "shape": shape_name,
        "seed": seed,
        "device_type": torch.device(device).type,
        "param_count": sum(_numel(s) for _, s in named_shapes),
        "weight_bytes": total_bytes,
        "files": files,
        "config": cfg,
        "generation_config": gen,
    }
    _write_json(os.path.join(out_dir, MARKER), marker)
    return out_dir


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _remove_owned(out_dir: str) -> None:
    """Remove files a previous (possibly partial) write left, and nothing else."""
    if not os.path.isdir(out_dir):
        return
    for name in os.listdir(out_dir):
        owned = name in _OWNED_FILES or (name.startswith("model-") and ".safetensors" in name) or name.endswith(".tmp")
        path = os.path.join(out_dir, name)
        if owned and os.path.isfile(path):
            os.remove(path)
        elif owned and os.path.isdir(path):
            shutil.rmtree(path)
