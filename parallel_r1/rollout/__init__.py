"""Fork-join rollouts: the engine and its decoding backends (transformers, vLLM)."""

from .arguments import (
    ATTENTION,
    ROLLOUT_MODES,
    ParallelArguments,
    RecordedRolloutArguments,
    RolloutArguments,
)
from .backend import Backend, Decoded, Sampling, Segment
from .engine import (
    ContinuousBatch,
    EngineTokens,
    ForkJoinEngine,
    PlainEngine,
    Rollout,
    plain_decode,
)
from .hf_backend import TransformersBackend

__all__ = [
    "ATTENTION",
    "ROLLOUT_MODES",
    "ParallelArguments",
    "RecordedRolloutArguments",
    "Backend",
    "ContinuousBatch",
    "Decoded",
    "EngineTokens",
    "ForkJoinEngine",
    "PlainEngine",
    "Rollout",
    "RolloutArguments",
    "Sampling",
    "Segment",
    "TransformersBackend",
    "plain_decode",
]
