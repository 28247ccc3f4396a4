"""The fork-join rollout engine: a small state machine per completion over a decoding backend.

Each completion moves through its phases on its own schedule: as soon as the segments of one phase have ended
(a main stretch; a block's paths, decoded concurrently; a width decision; a summary), the next phase's segments
go to the backend, which decodes them beside whatever other completions are doing:

    main     decode until <Parallel> or EOS
    path     min_paths paths, each = context + <Path> (inserted), decoded until </Path>;
             a path cut by its budget is closed with an inserted </Path>
    decide   (only while min_paths <= paths < max_paths) the model writes one token, <Path> or </Parallel>
             (`Grammar.decision_ids`, nothing else allowed): <Path> opens one more path, decoded as above from
             the context alone (the <Path> is the sampled one), then the model decides again
    summary  insert </Parallel> (unless the model wrote it) SEPARATOR <Summary>, decode until </Summary>
             (closed the same way if cut), then back to main

`fork` decodes the first min_paths paths of a block concurrently, each from the context alone (the backend forks
the stream and joins the paths afterwards: `isolated` keeps each path's own KV for the summary, `causal` and `tree`
re-read the paths one after the other, as a serving engine does, which samples the `tree` policy exactly); a path
the model adds is decoded alone, after the decision that opened it. `sequential` decodes every path one after the
other in the same stream, so each path reads the earlier ones (the causal "Seen" policy, exactly). What a width
decision reads is the structure's (`parallel_r1.structure`): in line after the joined paths for `causal` and
`tree` (and in `sequential`, the stream itself); for `isolated`, a probe (`Backend.probe`): `</Path>` read after
the isolated join, outside every path, at pos(<Parallel>) + the longest path. Everything else is the same in both
modes: the same inserted tokens, the same budgets, the same rule for the number of paths per block.

Rules:
- What may be sampled is the tag grammar's (`parallel_r1.tags.grammar`), applied to every segment on every
  backend: after `max_blocks` blocks <Parallel> is banned (so the final answer is never cut by the block
  limit); inside a path or a summary only its closer may be sampled, and no EOS; a width decision is <Path> or
  </Parallel>.
- The completion never exceeds `max_completion_length`: a block that would overflow is cut there
  (what is kept was sampled exactly as kept). A block's first paths share the room left (`backend.Room`): a
  backend that sees their tokens as they come ends a path once all it could still add lies past the cap.
- Inserted tokens carry env_mask 0 and log-prob 0.0; sampled tokens (width decisions included) carry env_mask 1
  and the sampler's log-prob. A completion holds at most one EOS, at its end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from tqdm.auto import tqdm

from ..structure import PROBE
from ..tags.grammar import Grammar, SampledPhase
from ..tags.language import PARALLEL_CLOSE, PATH_CLOSE, PATH_OPEN, SUMMARY_CLOSE, SUMMARY_OPEN, TagVocab
from ..tags.tokens import tag_vocab
from .arguments import ENGINE_MODES, RolloutArguments
from .backend import Backend, Decoded, Finish, Room, Sampling, Segment

SEPARATOR = "\n"  # inserted between </Parallel> and <Summary>
EnginePhase = Literal[SampledPhase, "done"]  # a completion's phase: one the model samples in, or over


@dataclass(frozen=True)
class EngineTokens:
    """What the engine takes from a tokenizer, read once (`of`): the tags' ids and the blank ids (`vocab`), the ids
    that end a completion (`eos_ids`) and the ids of SEPARATOR (`separator_ids`)."""

    vocab: TagVocab
    eos_ids: frozenset
    separator_ids: tuple

    def __post_init__(self):
        if not all(i in self.vocab.blank_ids for i in self.separator_ids):
            # the trainer finds the summary by parsing the ids: a separator that is not whitespace would end the block
            raise ValueError(
                f"the separator inserted before <Summary> must be whitespace tokens, got {self.separator_ids}"
            )

    @classmethod
    def of(cls, tokenizer, eos_ids, vocab: TagVocab | None = None) -> EngineTokens:
        """The engine's tokens of `tokenizer`; `vocab` when the caller has read it already
        (`tags.tokens.tag_vocab`)."""
        separator = tokenizer.encode(SEPARATOR, add_special_tokens=False)
        return cls(vocab if vocab is not None else tag_vocab(tokenizer), frozenset(eos_ids), tuple(separator))

    def grammar(self, settings) -> Grammar:
        """The tag grammar over these tokens for `settings` (any object with `max_blocks`, `min_paths` and
        `max_paths`): what the engine samples under and the training forward re-applies."""
        return Grammar(self.vocab, self.eos_ids, settings.max_blocks, settings.min_paths, settings.max_paths)


@dataclass
class Rollout:
    """One completion as sampled. `logprobs` and `env_mask` have one entry per completion token."""

    prompt_ids: list
    completion_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    env_mask: list = field(default_factory=list)
    blocks: int = 0
    finish: Finish = "length"


@dataclass
class _State:
    rollout: Rollout
    stream: object
    cap: int  # the completion's length cap
    sampling: Sampling | None = None  # its own sampling (None: the backend's)
    phase: EnginePhase = "main"
    parent: object = None  # fork: the stream through the block's <Parallel>
    children: list = field(default_factory=list)  # fork: the block's paths so far
    decoding: list = field(default_factory=list)  # fork: the paths being decoded now
    paths: int = 0  # paths of the current block decoded so far (from min_paths on, the model opened each)
    decision_stream: object = None  # what the width decision reads
    waiting: list = field(default_factory=list)  # the segments of the current phase, in order
    results: dict = field(default_factory=dict)  # those that ended, with what they produced

    def release(self) -> None:
        """Let go of every stream (and so of the cache rows they hold)."""
        self.stream = self.parent = self.decision_stream = None
        self.children, self.decoding, self.waiting, self.results = [], [], [], {}


class _Engine:
    """What every engine shares: `generate` over a `ContinuousBatch`, and submitting and ending completions. A
    subclass says what each phase asks the backend (`_segments`) and does with what it returns (`_advance`)."""

    backend: Backend
    schedule: Literal["per_completion", "rounds"] = "per_completion"
    max_completion_length: int

    def generate(
        self, prompts: list[list[int]], seeds: list[int] | None = None, progress: bool = False
    ) -> list[Rollout]:
        """One rollout per prompt. `seeds[i]`: completion i's random stream (default: drawn by the backend), so a
        completion is the same whatever else is in the call."""
        batch = ContinuousBatch(self)
        bar = tqdm(total=len(prompts), desc="rollouts", unit="completion", disable=not progress, leave=False)
        try:
            rollouts = batch.add(prompts, seeds)
            while batch:
                bar.update(len(batch.step()))
        finally:  # after an error too: the backend keeps nothing of this call
            batch.cancel_all()
            bar.close()
        return rollouts

    def _finish(self, state: _State) -> None:
        self.backend.release(state.stream)
        state.release()

    def _launch(self, states: list[_State], owners: dict) -> None:
        """Submit the segments of each state's current phase, all in one call (the backend makes room at once)."""
        segments = []
        for state in states:
            state.waiting, state.results = self._segments(state), {}
            for segment in state.waiting:
                owners[segment] = state
            segments += state.waiting
        if segments:
            self.backend.submit(segments)

    @staticmethod
    def _record(rollout: Rollout, decoded: Decoded) -> None:
        rollout.completion_ids += decoded.tokens
        rollout.logprobs += decoded.logprobs
        rollout.env_mask += [int(s) for s in decoded.sampled]

    @staticmethod
    def _insert(rollout: Rollout, ids: list[int]) -> None:
        rollout.completion_ids += ids
        rollout.logprobs += [0.0] * len(ids)
        rollout.env_mask += [0] * len(ids)

    def _segments(self, state: _State) -> list[Segment]:
        raise NotImplementedError

    def _advance(self, state: _State, results: list[Decoded]) -> None:
        raise NotImplementedError


class ForkJoinEngine(_Engine):
    """Rollouts of `config` on `backend`, sampled under `grammar` (the policy's: `ParallelPolicy.grammar`, the one
    the training forward re-applies). `schedule`: "per_completion" (each completion moves to its next phase
    as soon as its own segments end) or "rounds" (every completion waits until all the segments of the batch have
    ended, as earlier versions did: the baseline of `benchmarks/bench_rollout.py`)."""

    def __init__(
        self,
        backend: Backend,
        tokens: EngineTokens,
        grammar: Grammar,
        config: RolloutArguments,
        schedule: Literal["per_completion", "rounds"] = "per_completion",
    ):
        if config.rollout_mode not in ENGINE_MODES:
            raise ValueError(f"the engine samples rollout_mode {ENGINE_MODES}, not {config.rollout_mode!r}")
        if schedule not in ("per_completion", "rounds"):
            raise ValueError(f"schedule must be 'per_completion' or 'rounds', got {schedule!r}")
        self.backend, self.config, self.schedule = backend, config, schedule
        self.max_completion_length = config.max_completion_length
        self.tag = tokens.vocab.ids
        self.grammar = grammar
        self.separator = list(tokens.separator_ids)
        self.fork = config.rollout_mode == "fork"
        self.isolated = config.attention == "isolated"
        self._after: dict[SampledPhase, Callable[[_State, list[Decoded]], None]] = {
            "main": self._after_main,
            "path": self._after_path,
            "decide": self._after_decide,
            "summary": self._after_summary,
        }

    # -- what each phase asks the backend
    def _segment(self, state: _State, stream, phase: SampledPhase, max_new: int, closer: int | None = None) -> Segment:
        """Decode `stream` of `state`'s completion in `phase`: the grammar's allowed tags stop it, its allowed EOS ends
        it, the rest is banned; it is drawn with the completion's sampling, a summary at `summary_temperature` when
        one is set."""
        blocks = state.rollout.blocks
        allowed = self.grammar.allowed(phase, blocks)
        eos = self.grammar.eos_ids
        return Segment(
            stream,
            max_new=max_new,
            stop_ids=allowed - eos,
            end_ids=allowed & eos,
            closer=closer,
            banned=self.grammar.banned(phase, blocks),
            only=self.grammar.only(phase),
            sampling=state.sampling,
            temperature=self.config.summary_temperature if phase == "summary" else None,
        )

    def _segments(self, state: _State) -> list[Segment]:
        cfg, rollout = self.config, state.rollout
        room = state.cap - len(rollout.completion_ids)
        if state.phase == "main":
            return [self._segment(state, state.stream, "main", room)]
        if state.phase == "path":
            budget = max(1, min(cfg.max_path_tokens, room - 1))
            streams = state.decoding if self.fork else [state.stream]
            segments = [self._segment(state, s, "path", budget, self.tag[PATH_CLOSE]) for s in streams]
            if len(segments) > 1 and len(segments) * (budget + 2) >= room:  # the paths may overflow the cap
                shared = Room(room, openers=1, produced=[0] * len(segments))
                for place, segment in enumerate(segments):
                    segment.room, segment.place = shared, place
            return segments
        if state.phase == "decide":
            return [self._segment(state, state.decision_stream, "decide", 1)]
        budget = max(1, min(cfg.max_summary_tokens, room - 1))
        return [self._segment(state, state.stream, "summary", budget, self.tag[SUMMARY_CLOSE])]

    # -- what each phase does with the result
    def _advance(self, state: _State, results: list[Decoded]) -> None:
        self._after[state.phase](state, results)
        rollout = state.rollout
        if state.phase != "done" and len(rollout.completion_ids) >= state.cap:
            cap = state.cap
            del rollout.completion_ids[cap:], rollout.logprobs[cap:], rollout.env_mask[cap:]
            state.phase, rollout.finish = "done", "length"

    def _after_main(self, state: _State, results: list[Decoded]) -> None:
        (decoded,) = results
        self._record(state.rollout, decoded)
        if decoded.finish == "eos":
            state.phase, state.rollout.finish = "done", "eos"
        elif decoded.finish == "length":
            state.phase = "done"
        else:  # <Parallel> was sampled
            opener = [self.tag[PATH_OPEN]]
            state.paths = 0
            if self.fork:
                state.parent = state.stream
                state.children = self.backend.fork(state.stream, self.config.min_paths, self.isolated)
                state.decoding = list(state.children)
                for child in state.children:
                    self.backend.append(child, opener)
            else:
                self.backend.append(state.stream, opener)
            state.phase = "path"

    def _after_path(self, state: _State, results: list[Decoded]) -> None:
        for decoded in results:
            if state.paths < self.config.min_paths:  # the runtime opened it; the model opens the later ones
                self._insert(state.rollout, [self.tag[PATH_OPEN]])
            self._record(state.rollout, decoded)
            state.paths += 1
        if state.paths < self.config.min_paths:  # sequential: the runtime opens the next path
            self.backend.append(state.stream, [self.tag[PATH_OPEN]])
            return
        if self.fork:
            state.stream = self.backend.join(state.parent, state.children, self.isolated)
        if state.paths < self.config.max_paths:
            probe = self.fork and self.isolated
            state.decision_stream = self.backend.probe(state.stream, self.tag[PROBE]) if probe else state.stream
            state.phase = "decide"
            return
        self._close_block(state, [self.tag[PARALLEL_CLOSE]])

    def _after_decide(self, state: _State, results: list[Decoded]) -> None:
        (decoded,) = results
        self._record(state.rollout, decoded)
        (token,) = decoded.tokens
        if token == self.tag[PARALLEL_CLOSE]:
            if state.decision_stream is not state.stream:  # the probe read it, the block's stream has not
                self.backend.append(state.stream, [token])
            self._close_block(state, [])
            return
        if self.fork:  # <Path>: one more path
            (child,) = self.backend.fork(state.parent, 1, self.isolated, first=state.paths)
            self.backend.append(child, [token])
            state.children.append(child)
            state.decoding = [child]
        state.phase = "path"

    def _close_block(self, state: _State, closer: list[int]) -> None:
        """Insert `closer` (the runtime's </Parallel>, or nothing after the model's), the separator and <Summary>."""
        inserted = [*closer, *self.separator, self.tag[SUMMARY_OPEN]]
        self.backend.append(state.stream, inserted)
        self._insert(state.rollout, inserted)
        state.rollout.blocks += 1
        state.parent, state.children, state.decoding, state.decision_stream = None, [], [], None
        state.phase = "summary"

    def _after_summary(self, state: _State, results: list[Decoded]) -> None:
        (decoded,) = results
        self._record(state.rollout, decoded)
        state.phase = "main"


class PlainEngine(_Engine):
    """One plain decode per completion on `backend`, no grammar and no structure, until one of `eos_ids` or
    `max_completion_length` tokens: how a model trained without the engine is sampled (`rollout_mode: plain`), in a
    `ContinuousBatch` like the fork-join engine's."""

    def __init__(self, backend: Backend, max_completion_length: int, eos_ids):
        self.backend, self.max_completion_length, self.eos_ids = backend, max_completion_length, frozenset(eos_ids)

    def _segments(self, state: _State) -> list[Segment]:
        room = state.cap - len(state.rollout.completion_ids)
        return [Segment(state.stream, max_new=room, end_ids=self.eos_ids, sampling=state.sampling)]

    def _advance(self, state: _State, results: list[Decoded]) -> None:
        (decoded,) = results
        self._record(state.rollout, decoded)
        state.phase, state.rollout.finish = "done", "eos" if decoded.finish == "eos" else "length"


class ContinuousBatch:
    """Completions of one engine decoded together, each joining and leaving between any two steps (continuous
    batching): `add` starts completions, `step` advances all of them by one backend step and returns those that
    ended in it, `cancel` stops one and frees what the backend holds for it. Under the "rounds" schedule a
    completion's next phase waits until every running segment has ended."""

    def __init__(self, engine: ForkJoinEngine | PlainEngine):
        self.engine = engine
        self._owners: dict[Segment, _State] = {}  # each running segment's completion
        self._held: list[_State] = []  # rounds: completions whose next segments wait for the round to end
        self._live: dict[int, _State] = {}  # id(rollout) -> its completion, until it ends or is cancelled

    def __bool__(self) -> bool:
        return bool(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def add(
        self,
        prompts: list[list[int]],
        seeds: list[int] | None = None,
        cap: int | None = None,
        sampling: Sampling | None = None,
    ) -> list[Rollout]:
        """Start one completion per prompt; return their rollouts, which fill as they are decoded. `seeds` as in
        `generate`; `cap`: their length cap, at most the settings' `max_completion_length` (the
        default); `sampling`: how they are drawn, in place of the backend's."""
        limit = self.engine.max_completion_length
        if cap is not None and not 1 <= cap <= limit:
            raise ValueError(f"a completion's cap must be between 1 and max_completion_length ({limit}), got {cap}")
        streams = self.engine.backend.start(prompts, seeds)
        states = [_State(Rollout(list(p)), s, cap or limit, sampling) for p, s in zip(prompts, streams)]
        for state in states:
            self._live[id(state.rollout)] = state
        try:
            self.engine._launch(states, self._owners)
        except BaseException:  # a backend that refuses them (an empty prompt): nothing of them stays behind
            for state in states:
                self._end(state)
            raise
        return [state.rollout for state in states]

    def step(self) -> list[Rollout]:
        """One backend step; the rollouts that ended in it."""
        engine, ready, ended = self.engine, [], []  # ready: completions whose segments all ended in this step
        for segment, decoded in engine.backend.step():
            state = self._owners.pop(segment, None)
            if state is None:
                continue  # its completion was cancelled
            state.results[segment] = decoded
            if len(state.results) < len(state.waiting):
                continue  # the block's other paths are still being decoded
            engine._advance(state, [state.results[s] for s in state.waiting])
            if state.phase == "done":
                self._end(state)
                ended.append(state.rollout)
            else:
                (self._held if engine.schedule == "rounds" else ready).append(state)
        engine._launch(ready, self._owners)
        if not self._owners:
            engine._launch(self._held, self._owners)
            self._held = []
        return ended

    def running(self, rollout: Rollout) -> bool:
        """Whether `rollout`'s completion is still being decoded."""
        return id(rollout) in self._live

    def cancel(self, rollout: Rollout) -> None:
        """Stop `rollout`'s completion where it is (it keeps what it has) and free what the backend holds for it;
        nothing for one that has ended."""
        state = self._live.get(id(rollout))
        if state is not None:
            self._end(state)

    def cancel_all(self) -> None:
        for state in list(self._live.values()):
            self._end(state)

    def _end(self, state: _State) -> None:
        del self._live[id(state.rollout)]
        for segment in state.waiting:
            self._owners.pop(segment, None)
        self._held = [held for held in self._held if held is not state]
        self.engine._finish(state)


def plain_decode(
    backend: Backend,
    prompts: list[list[int]],
    max_new: int,
    eos_ids,
    seeds: list[int] | None = None,
    window: int | None = None,
) -> Iterator[tuple[int, Rollout]]:
    """One plain decode per prompt, no engine and no grammar (models without the tags, sequential baselines, a
    teacher), yielded as (prompt index, rollout) as each one ends. At most `window` are decoded at once (all by
    default): the next prompt starts as soon as one ends. `seeds` as in `ForkJoinEngine.generate`."""
    ends = frozenset(eos_ids)
    waiting = deque(enumerate(backend.start(prompts, seeds)))
    running: dict[Segment, int] = {}  # a finished one is let go at once: its row with it

    def submit(count: int) -> None:
        started = []
        for _ in range(min(count, len(waiting))):
            i, stream = waiting.popleft()
            started.append(Segment(stream, max_new=max_new, end_ids=ends))
            running[started[-1]] = i
        backend.submit(started)

    try:
        submit(len(waiting) if window is None else window)
        while running:
            for segment, decoded in backend.step():
                i = running.pop(segment)
                backend.release(segment.stream)
                submit(1)
                yield (
                    i,
                    Rollout(list(prompts[i]), decoded.tokens, finish="eos" if decoded.finish == "eos" else "length"),
                )
    finally:  # after an error, or a caller that stops early: the backend keeps nothing of this call
        for segment in running:
            backend.release(segment.stream)
