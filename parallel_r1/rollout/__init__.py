"""Fork-join rollouts: the engine and its decoding backends (transformers, vLLM)."""

from .backend import Backend, Decoded, Sampling, Segment
from .engine import ForkJoinEngine, Rollout, RolloutConfig, plain_rollouts
from .hf_backend import TransformersBackend

__all__ = [
    "Backend",
    "Decoded",
    "ForkJoinEngine",
    "Rollout",
    "RolloutConfig",
    "Sampling",
    "Segment",
    "TransformersBackend",
    "plain_rollouts",
]
