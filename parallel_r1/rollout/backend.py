"""What the fork-join engine asks of a decoding backend.

A backend holds *streams*: decoding contexts (a prompt and what follows it). The engine does eight things with
them:

- `start(prompts, seeds)`: one stream per prompt (token ids); `seeds[i]` is the completion's own random stream
  (`completion_seeds`), from which every token of that completion is drawn;
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
- `submit(segments)`: start continuing these streams, each until one of its stop tokens, one of its end tokens,
  or its budget;
- `release(stream)`: the completion of `stream` is over (the backend may forget what it keeps for it);
- `step()`: advance every submitted segment by one decoding step (the transformers backend: one model forward
  over every stream that has tokens to read; vLLM: one engine step, or the next server answer) and return the
  segments that ended in it, with what they produced. A segment submitted between two steps joins the next one:
  nothing waits for the others of its batch. A backend that sees tokens as they come ends a segment whose `Room`
  is full as its budget would; one that does not (a vLLM server) decodes it whole, and nothing kept differs.

Sampling does not depend on scheduling: the i-th token a stream draws comes from random numbers that are a
function of the stream's key (its completion's seed and its place in the completion: which block, which path)
and of i alone (`stream_seed`, `exponential_noise`, `request_seed`), whatever else is decoded beside it and whenever it
finishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import torch

_MASK64 = (1 << 64) - 1

SegmentFinish = Literal["stop", "eos", "length"]  # a segment's end: a stop id, an end id (EOS) or its budget
Finish = Literal["eos", "length"]  # a completion's end: its EOS or its length cap (the segment finishes that end one)


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn. temperature 0 is greedy (its log-probs are those of the raw logits). `seed` seeds the
    backend's generator, which gives each call's completions their seeds (`completion_seeds`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def of(self, segment: Segment) -> Sampling:
        """How `segment` is drawn: its completion's own sampling when it has one (`Segment.sampling`), else this
        one, at the segment's own temperature when it sets one, unless that sampling is greedy."""
        drawn = segment.sampling or self
        if segment.temperature is None or drawn.temperature == 0:
            return drawn
        return replace(drawn, temperature=segment.temperature)


@dataclass(eq=False)
class Segment:
    """One stream to continue (compared and hashed by identity: `step` returns the very objects submitted).

    Decoding stops after `max_new` sampled tokens, or when the sampled token is in `stop_ids` or
    `end_ids` (kept; finish "stop" or "eos"). When the budget runs out first, the `closer` (if any) is
    appended as an inserted token. `banned` tokens are never sampled (their probability is 0); with `only`,
    nothing but those ids is (an allow-list over the whole vocabulary). `sampling`, when set, is its completion's
    own (a served request's), in place of the backend's; `temperature`, when set, replaces that sampling's
    temperature for this segment (unless that is 0: greedy stays greedy). `room`: the room it
    shares with the segments decoded beside it, at `place` in their order, which may end it before its budget
    (`Room`).
    """

    stream: Any
    max_new: int
    stop_ids: frozenset = frozenset()
    end_ids: frozenset = frozenset()
    closer: int | None = None
    banned: frozenset = frozenset()
    only: frozenset | None = None
    sampling: Sampling | None = None
    temperature: float | None = None
    room: Room | None = None
    place: int = 0


@dataclass(eq=False)
class Room:
    """The room that segments decoded at once share when their tokens are kept one after the other, each after
    `openers` inserted tokens, and only the first `size` of them all are kept (a block's first paths near the
    completion's length cap). A segment knows its place in that order (`Segment.place`).

    A segment is full once every token it could still sample would land past the room: the tokens before it (the
    earlier segments so far, which can only grow) and its own fill it. A backend that sees a segment's tokens as
    they come reports them (`update`) and ends a full segment as if its budget had run out. That changes nothing
    that is kept, since each segment's tokens are drawn from its own stream (`stream_seed`), and it saves decoding
    tokens that would be thrown away. The room holds counts, not segments, so it keeps nothing alive."""

    size: int
    openers: int
    produced: list  # tokens each segment has produced so far, in the order they are kept

    def update(self, place: int, produced: int) -> bool:
        """The segment at `place` has produced `produced` tokens: is it full?"""
        self.produced[place] = produced
        return sum(self.openers + count for count in self.produced[: place + 1]) >= self.size


@dataclass
class Decoded:
    """What a segment produced. `sampled[i]` is False for a forced closer (its log-prob is 0.0). `finish` is a
    `SegmentFinish` once the segment has ended ("running" while a backend is still decoding it)."""

    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    sampled: list = field(default_factory=list)
    finish: Literal[SegmentFinish, "running"] = "length"


class Backend(Protocol):
    def start(self, prompts: list[list[int]], seeds: list[int] | None = None) -> list: ...

    def append(self, stream, ids: list[int]) -> None: ...

    def fork(self, stream, k: int, isolated: bool, first: int = 0) -> list: ...

    def join(self, parent, children: list, isolated: bool): ...

    def probe(self, stream, token: int): ...

    def submit(self, segments: list[Segment]) -> None: ...

    def step(self) -> list[tuple[Segment, Decoded]]: ...

    def release(self, stream) -> None: ...


def finish_segment(segment: Segment, tokens: list[int], logprobs: list[float]) -> Decoded:
    """Apply a segment's stop/end/closer rules to what a sampler returned (stop tokens included).

    Shared by backends that sample a whole segment in one request (vLLM): the sampler stops on
    stop and end ids itself; this decides what is kept and what is forced.
    """
    tokens, logprobs = list(tokens[: segment.max_new]), list(logprobs[: segment.max_new])
    out = Decoded(tokens=tokens, logprobs=logprobs, sampled=[True] * len(tokens))
    last = tokens[-1] if tokens else None
    if last in segment.stop_ids or last in segment.end_ids:
        out.finish = "stop" if last in segment.stop_ids else "eos"
        return out
    if segment.closer is not None:
        tokens.append(segment.closer)
        logprobs.append(0.0)
        out.sampled.append(False)
    return out


# ---------------------------------------------------------------------------------------------------- randomness


def _mix(value: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that scatters every input bit over the output."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _hash(*parts: int) -> int:
    """A 64-bit hash of a sequence of integers (negative ones included), the same in every process."""
    value = 0
    for part in parts:
        value = _mix(value ^ (part & _MASK64))
    return value


FORK, JOIN, PROBE = 0, 1, 2  # how a stream was derived from another: part of its key


def path_keys(stream, k: int, first: int) -> list[tuple]:
    """The keys of paths `first`..`first + k - 1` forked from `stream` (which counts its blocks in `forks`: a fork
    with `first == 0` opens a new one): (FORK, block, path) after the stream's key. Every stream of a completion has
    its own key, so no two of them draw the same numbers."""
    if first == 0:
        stream.forks += 1
    return [(*stream.key, FORK, stream.forks - 1, first + path) for path in range(k)]


def join_key(parent, paths: int) -> tuple:
    """The key of the context after a join of `paths` paths of `parent`'s last block."""
    return (*parent.key, JOIN, parent.forks - 1, paths)


def probe_key(stream) -> tuple:
    """The key of a probe of `stream` (its draws so far tell two probes of one stream apart)."""
    return (*stream.key, PROBE, stream.draws)


def completion_seeds(generator: torch.Generator, count: int) -> list[int]:
    """`count` completion seeds for one call: one draw from `generator`, then one seed per completion index."""
    base = int(torch.randint(0, 2**62, (1,), generator=generator))
    return [_hash(base, index) for index in range(count)]


def stream_seed(key: tuple, draw: int) -> int:
    """The 64-bit seed of the `draw`-th token of the stream with this key."""
    return _hash(*key, draw)


def request_seed(key: tuple, draw: int) -> int:
    """A vLLM request seed for a segment that starts at the stream's `draw`-th token (63 bits)."""
    return stream_seed(key, draw) >> 1


def exponential_noise(seed: int, size: int, device=None) -> torch.Tensor:
    """`size` Exp(1) numbers from a generator seeded with `seed` (a `stream_seed`). argmax(probs / noise) draws a
    token from the distribution (the exponential race, which vLLM's sampler runs too); unlike the inverse of a CDF it
    moves only if the two best ratios are within a rounding error of each other, so a logit off in its last bits
    (another batch beside it) practically never changes the token."""
    generator = torch.Generator(device).manual_seed(seed)
    return torch.empty(size, device=device).exponential_(generator=generator)
