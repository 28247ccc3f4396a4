"""Fork-join rollouts: the engine and its decoding backends (transformers, vLLM)."""

from .arguments import (
    ATTENTION,
    ROLLOUT_MODES,
    ParallelArguments,
    RecordedRolloutArguments,
    RolloutArguments,
)
from .backend import Backend, Decoded, Sampling, Segment
from .engine import EngineTokens, ForkJoinEngine, Rollout, plain_decode, plain_rollouts
from .hf_backend import TransformersBackend

__all__ = [
    "ATTENTION",
    "ROLLOUT_MODES",
    "ParallelArguments",
    "RecordedRolloutArguments",
    "Backend",
    "Decoded",
    "EngineTokens",
    "ForkJoinEngine",
    "Rollout",
    "RolloutArguments",
    "Sampling",
    "Segment",
    "TransformersBackend",
    "plain_decode",
    "plain_rollouts",
]
