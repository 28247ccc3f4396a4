"""Thin TRL trainer subclasses that wire the tag language and the isolated structure into training.

Each trainer is imported on first use: TRL's GRPOTrainer imports vLLM where it is installed (seconds of a launch),
which an SFT run never needs."""

import importlib

_MODULES = {"ParallelGRPOTrainer": ".grpo", "ParallelSFTTrainer": ".sft"}
__all__ = list(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name], __name__), name)
