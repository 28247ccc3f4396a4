"""What the fork-join engine asks of a decoding backend.

A backend holds *streams*: decoding contexts (a prompt and what follows it). The engine only
ever does six things with them, for whole batches at once:

- `start(prompts)`: one stream per prompt (token ids);
- `append(stream, ids)`: add tokens the runtime inserts (they are read, never sampled);
- `fork(stream, k, isolated, first=0)`: k children that continue the same context independently, as paths
  `first`, ..., `first + k - 1` of one block (`first > 0`: paths added to the block forked last, which the model
  chose to widen);
- `join(parent, children, isolated)`: one stream whose context is the parent followed by every
  child's continuation. Isolated: each child's tokens stay as they were computed (they never saw
  each other) and the positions go on after the longest child. Causal: the children are read one
  after the other, as a single sequence;
- `probe(stream, token)`: a new stream that reads `token` after `stream`, outside every path, at the position of
  the last one `stream` has taken (`next position - 1`), without moving the positions on; after an isolated join
  that is pos(`<Parallel>`) + the longest path, where the isolated structure puts a width decision's probe
  (`parallel_r1.structure`). `stream` is unchanged. A backend that reads joins causally (vLLM) returns a copy of
  `stream`: its last `</Path>` already sees every path;
- `decode(segments)`: continue many streams at once, each until one of its stop tokens, one of its
  end tokens, or its budget. All streams of all forks of a step go in one call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn. temperature 0 is greedy (its log-probs are those of the raw logits)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


@dataclass
class Segment:
    """One stream to continue.

    Decoding stops after `max_new` sampled tokens, or when the sampled token is in `stop_ids` or
    `end_ids` (kept; finish "stop" or "end"). When the budget runs out first, the `closer` (if any) is
    appended as an inserted token. `banned` tokens are never sampled (their probability is 0); with `only`,
    nothing but those ids is (an allow-list over the whole vocabulary).
    """

    stream: Any
    max_new: int
    stop_ids: frozenset = frozenset()
    end_ids: frozenset = frozenset()
    closer: int | None = None
    banned: frozenset = frozenset()
    only: frozenset | None = None


@dataclass
class Decoded:
    """What a segment produced. `sampled[i]` is False for a forced closer (its log-prob is 0.0)."""

    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    sampled: list = field(default_factory=list)
    finish: str = "length"  # "stop", "end" or "length"


class Backend(Protocol):
    def start(self, prompts: list[list[int]]) -> list: ...

    def append(self, stream, ids: list[int]) -> None: ...

    def fork(self, stream, k: int, isolated: bool, first: int = 0) -> list: ...

    def join(self, parent, children: list, isolated: bool): ...

    def probe(self, stream, token: int): ...

    def decode(self, segments: list[Segment]) -> list[Decoded]: ...


def finish_segment(segment: Segment, tokens: list[int], logprobs: list[float]) -> Decoded:
    """Apply a segment's stop/end/closer rules to what a sampler returned (stop tokens included).

    Shared by backends that sample a whole segment in one request (vLLM): the sampler stops on
    stop and end ids itself; this decides what is kept and what is forced.
    """
    tokens, logprobs = list(tokens[: segment.max_new]), list(logprobs[: segment.max_new])
    out = Decoded(tokens=tokens, logprobs=logprobs, sampled=[True] * len(tokens))
    last = tokens[-1] if tokens else None
    if last in segment.stop_ids or last in segment.end_ids:
        out.finish = "stop" if last in segment.stop_ids else "end"
        return out
    if segment.closer is not None:
        tokens.append(segment.closer)
        logprobs.append(0.0)
        out.sampled.append(False)
    return out
