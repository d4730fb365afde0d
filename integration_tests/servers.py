"""Start and stop `vllm serve` subprocesses for the integration tests (loopback only, bounded waits)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import requests

SERVE = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str, args: list[str], env: dict[str, str] | None = None, log_path: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or f"/tmp/kog-serve-{self.port}.log"
        self.cmd = SERVE + [model, "--host", "127.0.0.1", "--port", str(self.port)] + args
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 420) -> "Server":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"server not healthy after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def post(self, path: str, body: dict, timeout: float = 120) -> dict:
        r = requests.post(self.url + path, json=body, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def stream(self, path: str, body: dict, timeout: float = 120) -> list[dict]:
        chunks = []
        with requests.post(self.url + path, json={**body, "stream": True}, stream=True, timeout=timeout) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line or not line.startswith(b"data: "):
                    continue
                data = line[len(b"data: "):]
                if data == b"[DONE]":
                    break
                chunks.append(json.loads(data))
        return chunks
