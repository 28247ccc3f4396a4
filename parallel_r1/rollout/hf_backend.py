"""A transformers backend: every stream decoded on its own schedule, over key/value rows shared by reference.

Each completion owns one row of a `kv_pool.KVPool`. A stream reads that row through its own set of visible slots
(`HFStream.sees`); its tokens wait in a queue until a forward reads them into new slots. `step` runs one forward
over every queued token (all streams, all completions, up to `max_step_tokens`), then samples the next token of
each stream whose tokens are all read. A segment that ends leaves at once and the next one the engine submits
joins the next forward: no stream waits for another, except a block's summary for the block's last path.

- fork: the children see what the parent sees (the parent's unread tokens are queued first, once for all);
  a path added to a block later is a child of the same parent, in the same block.
- join, isolated: the summary sees the parent's slots and every path's own slots, as each path computed them;
  positions go on after the longest path. Sampling the summary then *is* sampling under the isolated structure
  (`parallel_r1.structure`).
- join, causal: the first path's slots are kept and the other paths are read again after it.
- probe: the width decision's `</Path>` is read in a slot of its own, seen by nothing else.

`kv_reuse` chooses how much is kept, so that one implementation serves as the engine, as the paper's strategy
and as the reference:
- "full": all of the above (the engine);
- "per_request": every segment reads its stream's whole context again, in a row of its own, as a serving engine
  without prefix sharing would (the paper's strategy: each path and each summary re-reads its context);
- "none": every token is sampled after reading the whole context again (the naive reference).
Contexts read again from scratch use the isolated mask of `structure`, so all three sample the same distribution.

A token's randomness is its stream's: exponential noise that is a function of the stream's key and the token's
index (`backend.exponential_noise`), dividing the warped probabilities. So a completion is the same whatever else
shares its forwards.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from transformers import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

from ..structure import isolated_mask
from .backend import (
    Decoded,
    Sampling,
    Segment,
    completion_seeds,
    exponential_noise,
    join_key,
    path_keys,
    probe_key,
    stream_seed,
)
from .kv_pool import ATTENTION, KVPool, Row, plan_forward

OUTSIDE = (-1, -1)  # (block, path) of a token that is in no path


@dataclass(eq=False)
class HFStream:
    """A context: its tokens with their positions and path membership, its random key and draws, and what of it
    has slots in its completion's row (`placed` leading ids; `sees`: the row's slots it reads)."""

    ids: list = field(default_factory=list)
    positions: list = field(default_factory=list)
    block_of: list = field(default_factory=list)
    path_of: list = field(default_factory=list)
    next_pos: int = 0
    group: tuple = OUTSIDE  # (block, path) given to tokens appended now
    forks: int = 0
    key: tuple = ()
    draws: int = 0
    family: object = None  # the same object for every stream of one completion
    row: Row | None = None
    sees: torch.Tensor | None = None  # bool, one entry per slot of the pool
    placed: int = 0
    unread: int = 0  # placed tokens the next forwards have yet to read

    def derive(self, key: tuple, **changes) -> HFStream:
        """A stream with this one's tokens (lists of its own), slots and visible set (a copy), and a new key."""
        lists = {name: list(getattr(self, name)) for name in ("ids", "positions", "block_of", "path_of")}
        sees = None if self.sees is None else self.sees.clone()
        return replace(self, **{**lists, "key": key, "sees": sees, "unread": 0, **changes})

    def extend(self, ids: list[int]) -> None:
        n = len(ids)
        self.ids += ids
        self.positions += range(self.next_pos, self.next_pos + n)
        self.block_of += [self.group[0]] * n
        self.path_of += [self.group[1]] * n
        self.next_pos += n


@dataclass
class _Read:
    """Tokens of `stream` waiting to be read: ids[start:start + count] into slots first..first + count - 1 of
    `row`. `fresh`: the isolated mask of a context read again from scratch (its tokens see only this read's
    slots)."""

    stream: HFStream
    row: Row
    start: int
    count: int
    first: int
    fresh: torch.Tensor | None = None
    done: int = 0  # tokens already read (a read larger than a forward's budget takes several)


class TransformersBackend:
    """Decoding on a transformers model with the fork-join cache (`kv_pool`). `max_step_tokens` bounds the tokens
    one forward reads (a long prompt or context is read over several forwards)."""

    def __init__(
        self,
        model,
        sampling: Sampling | None = None,
        kv_reuse: Literal["full", "per_request", "none"] = "full",
        max_step_tokens: int = 8192,
    ):
        if kv_reuse not in ("full", "per_request", "none"):
            raise ValueError(f"kv_reuse must be 'full', 'per_request' or 'none', got {kv_reuse!r}")
        text_config = model.config.get_text_config()
        layer_types = set(getattr(text_config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ValueError(f"the transformers rollout backend needs full-attention layers only, got {layer_types}")
        if getattr(text_config, "attn_logit_softcapping", None):
            raise ValueError(
                "the transformers rollout backend does not soft-cap attention logits (attn_logit_softcapping)"
            )
        if max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be at least 1, got {max_step_tokens}")
        sampling = sampling or Sampling()
        self.model, self.sampling, self.kv_reuse = model, sampling, kv_reuse
        self.max_step_tokens = max_step_tokens
        self.device = next(model.parameters()).device
        self.generator = torch.Generator()  # draws each call's completion seeds
        if sampling.seed is not None:
            self.generator.manual_seed(sampling.seed)
        self._pool_ref = None  # weak: the pool lives as long as a stream refers to one of its rows
        self._reads: list[_Read] = []
        self._active: dict[Segment, Decoded] = {}
        self.forwards = 0  # model forward calls, for benchmarks
        self.copied_bytes = 0  # key/value bytes the pools copied (growth and compaction), for benchmarks

    def _copied(self, count: int) -> None:
        self.copied_bytes += count

    # ------------------------------------------------------------------ streams

    def start(self, prompts: list[list[int]], seeds: list[int] | None = None) -> list[HFStream]:
        seeds = completion_seeds(self.generator, len(prompts)) if seeds is None else seeds
        streams = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            stream = HFStream(key=(seed,), family=object())
            stream.extend(list(prompt))
            streams.append(stream)
        return streams

    def append(self, stream: HFStream, ids: list[int]) -> None:
        stream.extend(list(ids))

    def fork(self, stream: HFStream, k: int, isolated: bool, first: int = 0) -> list[HFStream]:
        keys = path_keys(stream, k, first)
        self._share(stream)
        groups = [(stream.forks - 1, first + path) if isolated else OUTSIDE for path in range(k)]
        return [stream.derive(key, group=group) for key, group in zip(keys, groups)]

    def join(self, parent: HFStream, children: list[HFStream], isolated: bool) -> HFStream:
        base = len(parent.ids)
        key = join_key(parent, len(children))
        for child in children:
            self._share(child)
        if not isolated:
            merged = children[0].derive(key, group=OUTSIDE, forks=parent.forks)
            for child in children[1:]:
                merged.extend(child.ids[base:])
            return merged
        merged = parent.derive(key, next_pos=max(c.next_pos for c in children), group=OUTSIDE)
        for child in children:
            for name in ("ids", "positions", "block_of", "path_of"):
                getattr(merged, name).extend(getattr(child, name)[base:])
        if self.kv_reuse == "full":  # the summary reads every path's own slots
            merged.placed = len(merged.ids)
            size = merged.row.pool.capacity[1]
            for child in children:
                merged.sees = _padded(merged.sees, size) | _padded(child.sees, size)
        return merged

    def probe(self, stream: HFStream, token: int) -> HFStream:
        self._share(stream)
        probe = stream.derive(probe_key(stream), group=OUTSIDE)
        probe.ids.append(token)
        probe.positions.append(stream.next_pos - 1)
        probe.block_of.append(OUTSIDE[0])
        probe.path_of.append(OUTSIDE[1])
        return probe

    def release(self, stream: HFStream) -> None:
        """The completion of `stream` is over (or abandoned): drop its queued reads and its segments (its row is free
        once no stream of it is referred to)."""
        self._reads = [read for read in self._reads if read.stream.family is not stream.family]
        for segment in [s for s in self._active if s.stream.family is stream.family]:
            del self._active[segment]

    # ------------------------------------------------------------------ placing tokens in rows

    def _pool(self, tokens: int) -> KVPool:
        """The live pool, or a new one with twice `tokens` slots (the pool doubles as it needs)."""
        pool = self._pool_ref and self._pool_ref()
        if pool is None:
            slots = 256
            while slots < 2 * tokens:
                slots *= 2
            pool = KVPool(self.model, 1, slots, on_copy=self._copied)
            self._pool_ref = weakref.ref(pool)
        return pool

    def _new_row(self, tokens: int) -> Row:
        return self._pool(tokens).new_row()

    def _share(self, stream: HFStream) -> None:
        """Before other streams are derived from `stream`: with full reuse they see what it sees, its unread
        tokens included, so those get their slots now. Otherwise every segment reads its context again."""
        if self.kv_reuse == "full":
            self._place(stream)

    def _place(self, stream: HFStream) -> None:
        """Give `stream`'s unplaced tokens slots in its row (a new row for a new completion) and queue them."""
        if stream.placed == len(stream.ids):
            return
        if stream.row is None:
            stream.row = self._new_row(len(stream.ids))
        count = len(stream.ids) - stream.placed
        first = stream.row.pool.reserve(stream.row, count)
        stream.sees = _padded(stream.sees, stream.row.pool.capacity[1])
        stream.sees[first : first + count] = True
        self._queue(_Read(stream, stream.row, stream.placed, count, first))
        stream.placed = len(stream.ids)

    def _read_again(self, stream: HFStream) -> None:
        """Queue `stream`'s whole context to be read from scratch into a row of its own, under the isolated mask."""
        count = len(stream.ids)
        stream.row = self._new_row(count)
        first = stream.row.pool.reserve(stream.row, count)
        stream.sees = torch.zeros(stream.row.pool.capacity[1], dtype=torch.bool)
        stream.sees[first : first + count] = True
        valid = torch.ones(1, count, dtype=torch.bool)
        fresh = isolated_mask(valid, torch.tensor([stream.block_of]), torch.tensor([stream.path_of]))[0, 0]
        self._queue(_Read(stream, stream.row, 0, count, first, fresh=fresh))
        stream.placed = count

    def _queue(self, read: _Read) -> None:
        self._reads.append(read)
        read.stream.unread += read.count

    # ------------------------------------------------------------------ decoding

    def submit(self, segments: list[Segment]) -> None:
        new = [s.stream for s in segments if self.kv_reuse != "full" or s.stream.row is None]
        if new:  # the rows of a batch's new completions (or, re-reading, of every segment) in one growth
            pool = self._pool(max(len(stream.ids) for stream in new))  # held here until rows refer to it
            pool.make_room(len(new))
        for segment in segments:
            stream = segment.stream
            if self.kv_reuse == "full":
                self._place(stream)
            else:
                self._read_again(stream)
            if stream.unread == 0:
                raise RuntimeError("a segment was submitted on a stream with nothing left to read")
            self._active[segment] = Decoded(finish="running")

    @torch.no_grad()
    def step(self) -> list[tuple[Segment, Decoded]]:
        if not self._reads:
            if self._active:
                raise RuntimeError("segments wait for tokens that no read will bring")
            return []
        self._reads[0].row.pool.compact()
        logits = self._forward(self._take_reads(), {segment.stream for segment in self._active})
        ready = [(segment, out) for segment, out in self._active.items() if segment.stream in logits]
        if not ready:  # a long read goes on in the next forward
            return []
        tokens, logprobs = self._choose(torch.stack([logits[s.stream] for s, _ in ready]), [s for s, _ in ready])
        finished = []
        for (segment, out), token, logprob in zip(ready, tokens, logprobs):
            segment.stream.extend(_emit(segment, out, token, logprob))
            if out.finish != "running":  # what it wrote last is read by whoever continues the stream
                finished.append((segment, out))
                del self._active[segment]
                if self.kv_reuse != "full":  # its next segment reads the context again: the row can go
                    segment.stream.row = segment.stream.sees = None
            elif self.kv_reuse == "none":
                self._read_again(segment.stream)
            else:  # within a segment, the stream goes on in its row
                self._place(segment.stream)
        return finished

    def _take_reads(self) -> list[tuple[_Read, int, int]]:
        """(read, first token, count) of what the next forward reads: the queue in order, up to the budget."""
        taken, budget = [], self.max_step_tokens
        while self._reads and budget > 0:
            read = self._reads[0]
            count = min(budget, read.count - read.done)
            taken.append((read, read.done, count))
            read.done += count
            budget -= count
            if read.done == read.count:
                self._reads.pop(0)
        return taken

    def _forward(self, taken: list, sampling_streams: set) -> dict:
        """Read the taken tokens; return the next-token logits of each sampling stream that has nothing left to
        read."""
        ids, positions, rows, slots, owners = [], [], [], [], []
        for read, offset, count in taken:
            stream, start = read.stream, read.start + offset
            ids += stream.ids[start : start + count]
            positions += stream.positions[start : start + count]
            rows += [read.row] * count
            slots += range(read.first + offset, read.first + offset + count)
            owners += [read] * count
            stream.unread -= count
        length = max(row.used for row in rows)
        visible = self._visible(taken, slots, owners, length)
        plan = plan_forward(rows[0].pool, rows, slots, visible)
        last = {}
        for t, read in enumerate(owners):
            if read.stream in sampling_streams and read.stream.unread == 0:
                last[read.stream] = t
        keep = torch.tensor(sorted(last.values()), dtype=torch.long, device=self.device)
        with _attention(self.model, ATTENTION):
            out = self.model(
                input_ids=torch.tensor([ids], device=self.device),
                position_ids=torch.tensor([positions], device=self.device),
                use_cache=False,
                logits_to_keep=keep,
                fork_join=plan,
            )
        self.forwards += 1
        order = {t: i for i, t in enumerate(sorted(last.values()))}
        return {stream: out.logits[0, order[t]] for stream, t in last.items()}

    @staticmethod
    def _visible(taken: list, slots: list[int], owners: list, length: int) -> torch.Tensor:
        """[T, length] bool: what each token sees. A token of a read in its stream's row: what its stream sees, up
        to its own slot. A token of a context read from scratch: its row of the isolated mask, over that read."""
        streams = list({id(read.stream): read.stream for read in owners}.values())
        index = {id(stream): i for i, stream in enumerate(streams)}
        sees = torch.stack([_padded(stream.sees, length)[:length] for stream in streams])
        rows = torch.tensor([index[id(read.stream)] for read in owners])
        slot = torch.tensor(slots)
        visible = sees[rows] & (torch.arange(length)[None, :] <= slot[:, None])
        t = 0
        for read, offset, count in taken:
            if read.fresh is not None:
                visible[t : t + count] = False
                visible[t : t + count, read.first : read.first + read.count] = read.fresh[offset : offset + count]
            t += count
        return visible

    def _choose(self, logits: torch.Tensor, segments: list[Segment]):
        """The next token of each row and its log-prob: greedy (the raw logits' argmax) or the exponential race with
        its stream's noise over the probabilities warped as its segment is drawn (`Sampling.of`: temperature, then
        top-k and top-p), rows of different samplings side by side."""
        logits = logits.float().clone()
        for row, segment in enumerate(segments):
            if segment.only is not None:
                kept = list(segment.only)
                allowed = logits[row, kept]
                logits[row] = float("-inf")
                logits[row, kept] = allowed
            elif segment.banned:
                logits[row, list(segment.banned)] = float("-inf")
        drawn = [self.sampling.of(segment) for segment in segments]
        tokens, scores = logits.argmax(-1), logits.clone()
        warps: dict[tuple, list[int]] = {}  # (temperature, top-k, top-p) -> the rows drawn so
        for row, how in enumerate(drawn):
            if how.temperature > 0:
                warps.setdefault((how.temperature, how.top_k, how.top_p), []).append(row)
        for (temperature, top_k, top_p), rows in warps.items():
            scores[rows] = _warpers(top_k, top_p)(None, logits[rows] / temperature)
            probs = torch.softmax(scores[rows], -1)
            tokens[rows] = (probs / _noise(probs, [segments[row] for row in rows])).argmax(-1)
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens.tolist(), logprobs.tolist()


@functools.lru_cache(maxsize=64)  # a server's clients may send any top-p: the cache stays small
def _warpers(top_k: int, top_p: float) -> LogitsProcessorList:
    """transformers' top-k and top-p warpers (after the temperature), each only when it cuts something."""
    warpers = []
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return LogitsProcessorList(warpers)


def _noise(probs: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
    """Each row's next exponential noise, from its stream's key and draws (the exponential race: the token is
    argmax(probs / noise)); a row with an allow-list draws noise for the allowed ids alone, so a width decision races
    two tokens, not the whole vocabulary."""
    noise = torch.full_like(probs, float("inf"))
    for row, segment in enumerate(segments):
        stream = segment.stream
        seed = stream_seed(stream.key, stream.draws)
        stream.draws += 1
        ids = sorted(segment.only) if segment.only is not None else slice(None)
        noise[row, ids] = exponential_noise(seed, probs.shape[-1] if segment.only is None else len(ids), probs.device)
    return noise


def _padded(sees: torch.Tensor | None, size: int) -> torch.Tensor:
    if sees is None:
        return torch.zeros(size, dtype=torch.bool)
    if sees.numel() >= size:
        return sees
    return torch.cat([sees, torch.zeros(size - sees.numel(), dtype=torch.bool)])


class _attention:
    """The model's attention implementation set to `name` for a forward, then restored."""

    def __init__(self, model, name: str):
        self.configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
        self.name = name

    def __enter__(self):
        self.saved = [config._attn_implementation for config in self.configs]
        for config in self.configs:
            config._attn_implementation = self.name

    def __exit__(self, *exc):
        for config, saved in zip(self.configs, self.saved):
            config._attn_implementation = saved


def _emit(segment: Segment, out: Decoded, token: int, logprob: float) -> list[int]:
    """Apply a segment's rules to the token sampled for it; return what goes into the stream (the token, and the
    closer when the budget, or a full room, ends the segment). `out.finish` is "running" while the segment goes
    on."""
    _add(out, token, logprob, True)
    full = segment.room is not None and segment.room.update(segment.place, len(out.tokens))
    if token in segment.end_ids:
        out.finish = "eos"
    elif token in segment.stop_ids:
        out.finish = "stop"
    elif len(out.tokens) == segment.max_new or full:
        out.finish = "length"
        if segment.closer is not None:
            _add(out, segment.closer, 0.0, False)
            return [token, segment.closer]
    else:
        out.finish = "running"
    return [token]


def _add(out: Decoded, token: int, logprob: float, sampled: bool) -> None:
    out.tokens.append(token)
    out.logprobs.append(logprob)
    out.sampled.append(sampled)
