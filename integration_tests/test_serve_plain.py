"""Plain `vllm serve` with kog_backend installed is stock vLLM: the same tokens as with vLLM's plugins turned off,
no kog worker, no counters. A module of its own so that no other server holds GPU memory meanwhile."""

from __future__ import annotations

import pytest

from kog_backend.path.counters import read_all
from servers import SERVE, Server

pytestmark = pytest.mark.vllm_gpu

COMMON = ["--enforce-eager", "--gpu-memory-utilization", "0.25", "--max-model-len", "4096", "--seed", "0"]
PROMPTS = ["The history of the city begins", "def fibonacci(n):"]


def _ids(server, prompt):
    body = {"model": server.cmd[len(SERVE)], "prompt": prompt, "max_tokens": 64, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    return server.post("/v1/completions", body)["choices"][0]["token_ids"]


def test_plain_serve_with_plugin_installed_is_stock(checkpoint, tmp_path):
    model = checkpoint("llama-3.2-1b")
    plain = Server(model, COMMON, env={"KOG_STATE_DIR": str(tmp_path)}).start()
    try:
        got = [_ids(plain, p) for p in PROMPTS]
        log = plain.log()
    finally:
        plain.stop()
    bare = Server(model, COMMON, env={"VLLM_PLUGINS": "none"}).start()
    try:
        want = [_ids(bare, p) for p in PROMPTS]
        bare_log = bare.log()
    finally:
        bare.stop()
    assert got == want
    assert "kog_backend.engine.worker.KogWorker" not in log and "kog: " not in log
    assert "Platform plugin kog" in log and "Platform plugin kog" not in bare_log
    assert not read_all(str(tmp_path))
