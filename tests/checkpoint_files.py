"""Reading a written checkpoint back in the checkpoint tests: every tensor of its safetensors files, and the
offline hub settings under which transformers loads it (no download is ever wanted there)."""

from __future__ import annotations

import os

import pytest


def read_tensors(path: str) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """name -> tensor over every *.safetensors file of the checkpoint directory `path`, in file-name order."""
    from safetensors import safe_open

    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), framework="pt") as st:
                out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch):
    """Autouse in every module that imports it: transformers and huggingface_hub never reach the network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
