"""Where `kog bench`'s engines get their weights: an embedded shape's random-weight checkpoint, or vLLM's dummy
weights (`--dummy-weights`).

Dummy: only config.json, generation_config.json and the tokenizer are written (checkpoints.write_dummy, default
<checkpoint dir>/<shape>-dummy) and both engines run with load_format="dummy": vLLM draws uniform +-1e-3 weights
in place, so a step reads the same bytes as the real model (tok/s and GB/s mean what they do with a checkpoint)
but the tokens mean nothing, and stock's and kog's greedy tokens are not compared.

A shape whose checkpoint is not written yet is refused before anything is written, naming --dummy-weights, when it
is one of shapes.DUMMY_ONLY or its weights exceed the free space where the checkpoint would go (the bench
never switches to dummy weights by itself: what a run measured is what its command line says).

--fp8 LAYOUT: the shape's FP8 checkpoint (`kog make-checkpoint --fp8`, <shape>-fp8-<layout>-seed0; one byte per
projection weight), or with --dummy-weights its config with the FP8 quantization_config (<shape>-fp8-<layout>-dummy):
vLLM's dummy loader then fills the float8 weights and their float32 scales alike (uniform +-1e-3), so a step reads
the bytes of the real FP8 model.

Standard library only: the bench's parent process imports neither torch nor vLLM.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Mapping

DUMMY_LOAD_FORMAT = "dummy"
DUMMY_TEXT = "vLLM dummy (load_format=dummy): bytes as the real model, tokens meaningless"


def wants_dummy(dummy_weights: bool, engine_args: Mapping[str, Any] | None) -> bool:
    """--dummy-weights, or --engine-args' load_format "dummy" (the same run: its checkpoint needs no weights)."""
    return dummy_weights or (engine_args or {}).get("load_format") == DUMMY_LOAD_FORMAT


def dummy_engine_args(engine_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """engine_args with load_format "dummy"; ValueError when they set another load_format."""
    given = (engine_args or {}).get("load_format")
    if given is not None and given != DUMMY_LOAD_FORMAT:
        raise ValueError(f"--dummy-weights runs both engines with load_format={DUMMY_LOAD_FORMAT!r}; --engine-args "
                         f"sets load_format={given!r} (drop one of them)")
    return {**(engine_args or {}), "load_format": DUMMY_LOAD_FORMAT}


def write_dummy_dir(shape: str, log: Callable[[str], Any] = print, fp8: str | None = None) -> str:
    """The shape's config + tokenizer directory for load_format="dummy" (written each run: ~1 s, no weights); fp8:
    the config carries that FP8 layout's quantization_config."""
    from kog_backend.tools.fixtures import checkpoints

    path = checkpoints.write_dummy(shape, fp8=fp8)
    what = f"FP8 {fp8} config" if fp8 else "config"
    log(f"{shape}: vLLM dummy weights (load_format=dummy): {what} and tokenizer only, in {path}")
    return path


def checkpoint_bytes(shape: str, fp8: str | None = None) -> int:
    """Bytes of the shape's random-weight checkpoint as the bench writes it: bf16 parameters; with fp8, the decoder
    layers' projections at one byte each (their scales, well under 1% of that, not counted)."""
    from kog_backend.tools.fixtures import shapes

    n = shapes.param_count(shape) * shapes.BF16_BYTES
    if fp8 is not None and not shapes.is_moe(shape):
        n -= shapes.get_shape(shape)["num_hidden_layers"] * shapes.projection_params(shape) * (shapes.BF16_BYTES - 1)
    return n


def free_bytes(path: str) -> int:
    """Free bytes on the file system that holds `path` (or would: its nearest existing parent)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return shutil.disk_usage(p).free


def checkpoint_refusal(shape: str, path: str, fp8: str | None = None) -> str | None:
    """Why the shape's checkpoint (fp8: its FP8 checkpoint of that layout) at `path` cannot be written, naming
    --dummy-weights; None when it is there already (a marker, current or not: write_checkpoint then keeps the
    weights it can) or fits the free space."""
    from kog_backend.tools.fixtures import checkpoints, shapes

    if checkpoints.read_marker(path) is not None:
        return None
    need = checkpoint_bytes(shape, fp8)
    if shape in shapes.DUMMY_ONLY:
        return (f"{shape}: its ~{need / 1e9:.0f} GB of weights are never written (shapes.DUMMY_ONLY); benchmark it "
                f"with --dummy-weights ({DUMMY_TEXT})")
    free = free_bytes(path)
    if need > free:
        what = f"random-weight FP8 {fp8} checkpoint" if fp8 else "random-weight checkpoint"
        return (f"{shape}: its {what} needs ~{need / 1e9:.1f} GB and {path} has {free / 1e9:.1f} GB "
                f"free; benchmark it with --dummy-weights ({DUMMY_TEXT}), or point $KOG_CHECKPOINT_DIR at a larger disk")
    return None
