"""Thin TRL trainer subclasses that wire the tag language and the isolated structure into training."""

from .grpo import ParallelGRPOTrainer
from .sft import ParallelSFTTrainer

__all__ = ["ParallelGRPOTrainer", "ParallelSFTTrainer"]
