"""Thin TRL trainer subclasses that wire the tag language and the isolated structure into training."""

from .grpo import ParallelGRPOConfig, ParallelGRPOTrainer
from .sft import ParallelSFTConfig, ParallelSFTTrainer

__all__ = ["ParallelGRPOConfig", "ParallelGRPOTrainer", "ParallelSFTConfig", "ParallelSFTTrainer"]
