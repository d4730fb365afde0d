"""`vllm serve --backend kog` end to end, next to `--backend stock` and plain `vllm serve`.

Servers start with --enforce-eager (start-up in tens of seconds) and write kog's counters under a per-test
KOG_STATE_DIR, read back as `kog stats` would.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys

import pytest

from kog_backend.counters import read_all
from servers import SERVE, Server

pytestmark = pytest.mark.vllm_gpu

COMMON = ["--enforce-eager", "--gpu-memory-utilization", "0.25", "--max-model-len", "4096", "--seed", "0"]
PROMPTS = ["The history of the city begins", "def fibonacci(n):", "A"]
NEW_TOKENS = 128


def _counters(state_dir) -> dict:
    entries = read_all(str(state_dir))
    assert entries, f"no counters under {state_dir}"
    total = {"kog_steps": 0, "fallbacks": {}}
    for _, s in entries:
        total["kog_steps"] += s["kog_steps"]
        for k, v in s["fallbacks"].items():
            total["fallbacks"][k] = total["fallbacks"].get(k, 0) + v
        total["disabled_reason"] = s.get("disabled_reason")
    return total


@pytest.fixture(scope="module")
def servers(checkpoint, tmp_path_factory):
    model = checkpoint("llama-3.2-1b")
    state = tmp_path_factory.mktemp("kog-state")
    kog = Server(model, ["--backend", "kog"] + COMMON, env={"KOG_STATE_DIR": str(state)}).start()
    stock = Server(model, ["--backend", "stock"] + COMMON).start()
    yield kog, stock, state
    kog.stop()
    stock.stop()


def _greedy_completion(server, prompt, **extra):
    body = {"model": server.cmd[len(SERVE)], "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0,
            "ignore_eos": True, **extra}
    return server.post("/v1/completions", body)


def test_completions_identical_and_on_kog_path(servers):
    kog, stock, state = servers
    before = _counters(state)["kog_steps"] if read_all(str(state)) else 0
    for prompt in PROMPTS:
        got = _greedy_completion(kog, prompt)["choices"][0]["text"]
        want = _greedy_completion(stock, prompt)["choices"][0]["text"]
        assert got == want
    import time

    time.sleep(1.5)  # counters are persisted at most once a second
    c = _counters(state)
    assert c["disabled_reason"] is None, c
    assert c["kog_steps"] - before >= len(PROMPTS) * (NEW_TOKENS - 1), c


def test_streaming_completion_equals_non_streaming(servers):
    kog, _, _ = servers
    body = {"model": kog.cmd[len(SERVE)], "prompt": PROMPTS[0], "max_tokens": 64, "temperature": 0.0, "ignore_eos": True}
    whole = kog.post("/v1/completions", body)["choices"][0]["text"]
    chunks = kog.stream("/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole


def test_chat_streaming_and_not(servers):
    kog, stock, _ = servers
    body = {"model": kog.cmd[len(SERVE)], "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 48, "temperature": 0.0}
    got = kog.post("/v1/chat/completions", body)["choices"][0]["message"]["content"]
    want = stock.post("/v1/chat/completions", body)["choices"][0]["message"]["content"]
    assert got == want
    chunks = kog.stream("/v1/chat/completions", body)
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == got


def test_concurrent_requests_run_stock(servers):
    kog, stock, state = servers
    import time

    time.sleep(1.5)
    before = _counters(state)["fallbacks"].get("batch of several requests", 0)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda p: _greedy_completion(kog, p)["choices"][0]["text"], PROMPTS[:2]))
    want = [_greedy_completion(stock, p)["choices"][0]["text"] for p in PROMPTS[:2]]
    assert got == want
    time.sleep(1.5)
    assert _counters(state)["fallbacks"].get("batch of several requests", 0) > before


def test_logprobs_request_is_answered(servers):
    kog, stock, _ = servers
    got = _greedy_completion(kog, PROMPTS[1], logprobs=2)["choices"][0]
    want = _greedy_completion(stock, PROMPTS[1], logprobs=2)["choices"][0]
    assert got["text"] == want["text"]
    assert got["logprobs"]["tokens"] == want["logprobs"]["tokens"]


def test_unknown_backend_is_refused_at_start(checkpoint):
    proc = subprocess.run(SERVE + [checkpoint("llama-3.2-1b"), "--backend", "bogus"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "bogus" in proc.stderr and "--backend" in proc.stderr, proc.stderr[-2000:]


def test_plain_serve_with_plugin_installed_is_stock(checkpoint, tmp_path):
    """No flag: the same tokens as with vLLM's plugins turned off entirely, and no kog worker."""
    model = checkpoint("llama-3.2-1b")
    plain = Server(model, COMMON, env={"KOG_STATE_DIR": str(tmp_path)}).start()
    try:
        got = [_greedy_completion(plain, p)["choices"][0]["text"] for p in PROMPTS]
        log = plain.log()
    finally:
        plain.stop()
    bare = Server(model, COMMON, env={"VLLM_PLUGINS": ""}).start()
    try:
        want = [_greedy_completion(bare, p)["choices"][0]["text"] for p in PROMPTS]
    finally:
        bare.stop()
    assert got == want
    assert "KogWorker" not in log and "kog:" not in log
    assert not read_all(str(tmp_path))
