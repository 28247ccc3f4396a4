"""A transformers backend: batched decoding with a KV cache that forks and joins.

Each stream keeps its own key/value tensors (one slot per context token, RoPE already applied at
the token's position). A decode call stacks the streams of all segments into one batch cache
(left-padded, padding masked), feeds their unread tokens, and samples one token per stream per
step; a stream leaves the batch when its segment ends, taking its slots with it.

- fork: the children share the parent's tensors (no copy, no re-prefill); a path added to a block later is a
  child of the same parent, in the same block.
- join, isolated: the summary's context is the parent's slots followed by every path's own slots,
  exactly as each path computed them; positions go on after the longest path. Sampling the summary
  then *is* sampling under the isolated structure (`parallel_r1.structure`).
- join, causal: the first path's slots are kept and the other paths are re-read after it.

`kv_reuse` chooses how much is kept between calls, so that one implementation serves as the
engine, as the paper's strategy and as the reference:
- "full": all of the above (the engine);
- "per_request": every decode call re-reads each stream's whole context first, as a serving
  engine without prefix sharing would (the paper's strategy: re-prefill each path, re-prefill the
  paths for the summary);
- "none": every token is sampled from a fresh forward over the whole context (the naive reference).
Contexts re-read from scratch use the isolated mask of `structure`, so all three sample the same
distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from transformers import DynamicCache, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from ..structure import isolated_mask
from .backend import Decoded, Sampling, Segment

OUTSIDE = (-1, -1)  # (block, path) of a token that is in no path


@dataclass
class HFStream:
    """A context: its tokens with their positions and path membership, and the slots read so far."""

    ids: list = field(default_factory=list)
    positions: list = field(default_factory=list)
    block_of: list = field(default_factory=list)
    path_of: list = field(default_factory=list)
    next_pos: int = 0
    group: tuple = OUTSIDE  # (block, path) given to tokens appended now
    forks: int = 0
    kv: torch.Tensor | None = None  # [layers, 2, kv_heads, fed, head_dim]
    logits: torch.Tensor | None = None  # next-token logits after the last read token

    @property
    def fed(self) -> int:
        return 0 if self.kv is None else self.kv.shape[-2]

    def copy(self, **changes) -> HFStream:
        """A stream with its own token lists (the KV tensors are shared: they are never written in place)."""
        lists = {name: list(getattr(self, name)) for name in ("ids", "positions", "block_of", "path_of")}
        return replace(self, **{**lists, **changes})

    def extend(self, ids: list[int]) -> None:
        n = len(ids)
        self.ids += ids
        self.positions += range(self.next_pos, self.next_pos + n)
        self.block_of += [self.group[0]] * n
        self.path_of += [self.group[1]] * n
        self.next_pos += n


class TransformersBackend:
    def __init__(
        self,
        model,
        sampling: Sampling | None = None,
        kv_reuse: Literal["full", "per_request", "none"] = "full",
        pad_token_id: int = 0,
    ):
        if kv_reuse not in ("full", "per_request", "none"):
            raise ValueError(f"kv_reuse must be 'full', 'per_request' or 'none', got {kv_reuse!r}")
        layer_types = set(getattr(model.config.get_text_config(), "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ValueError(f"the transformers rollout backend needs full-attention layers only, got {layer_types}")
        sampling = sampling or Sampling()
        self.model, self.sampling, self.kv_reuse, self.pad = model, sampling, kv_reuse, pad_token_id
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(self.device)
        if sampling.seed is not None:
            self.generator.manual_seed(sampling.seed)
        warpers = [TemperatureLogitsWarper(sampling.temperature)] if sampling.temperature > 0 else []
        if sampling.top_k > 0:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        self.warpers = LogitsProcessorList(warpers)

    # ------------------------------------------------------------------ streams

    def start(self, prompts: list[list[int]]) -> list[HFStream]:
        streams = []
        for prompt in prompts:
            stream = HFStream()
            stream.extend(list(prompt))
            streams.append(stream)
        return streams

    def append(self, stream: HFStream, ids: list[int]) -> None:
        stream.extend(list(ids))

    def fork(self, stream: HFStream, k: int, isolated: bool, first: int = 0) -> list[HFStream]:
        if first == 0:  # a new block
            stream.forks += 1
        block = stream.forks - 1
        return [stream.copy(group=(block, first + path) if isolated else OUTSIDE) for path in range(k)]

    def join(self, parent: HFStream, children: list[HFStream], isolated: bool) -> HFStream:
        base = len(parent.ids)
        if not isolated:
            merged = children[0].copy(group=OUTSIDE, forks=parent.forks, logits=None)
            for child in children[1:]:
                merged.extend(child.ids[base:])
            return merged
        merged = parent.copy(next_pos=max(c.next_pos for c in children), group=OUTSIDE, kv=None, logits=None)
        for child in children:
            for name in ("ids", "positions", "block_of", "path_of"):
                getattr(merged, name).extend(getattr(child, name)[base:])
        read = [child.kv for child in children]
        if all(kv is not None and kv.shape[-2] == len(child.ids) for kv, child in zip(read, children)):
            merged.kv = torch.cat([read[0][..., :base, :]] + [kv[..., base:, :] for kv in read], dim=-2)
        return merged

    def probe(self, stream: HFStream, token: int) -> HFStream:
        probe = stream.copy(group=OUTSIDE)
        probe.ids.append(token)
        probe.positions.append(stream.next_pos - 1)
        probe.block_of.append(OUTSIDE[0])
        probe.path_of.append(OUTSIDE[1])
        return probe

    # ------------------------------------------------------------------ decoding

    @torch.no_grad()
    def decode(self, segments: list[Segment]) -> list[Decoded]:
        results = [Decoded() for _ in segments]
        if not segments:
            return results
        if self.kv_reuse != "full":  # nothing is kept from earlier calls
            for segment in segments:
                segment.stream.kv, segment.stream.logits = None, None
        active = list(range(len(segments)))
        batch = _Batch(self, [segment.stream for segment in segments])
        while active:
            tokens, logprobs = self._choose(batch.logits, [segments[i] for i in active])
            read, over = [], []
            for row, i in enumerate(active):
                token, needs_reading, done = _emit(segments[i], results[i], tokens[row], logprobs[row])
                if token is not None:
                    segments[i].stream.extend([token])
                read.append(needs_reading)
                over.append(done)
            # a segment that ended on a token nobody will read (EOS, or the budget) leaves now
            batch.keep(read)
            active = [i for i, r in zip(active, read) if r]
            over = [o for o, r in zip(over, read) if r]
            if not active:
                break
            if self.kv_reuse == "none":
                batch = _Batch(self, [segments[i].stream for i in active])
            else:
                batch.read_last_tokens()
            batch.keep([not o for o in over])
            active = [i for i, o in zip(active, over) if not o]
        return results

    def _choose(self, logits: torch.Tensor, segments: list[Segment]):
        """Sample (or pick greedily) one token per row; return the tokens and their log-probs."""
        logits = logits.float().clone()
        for row, segment in enumerate(segments):
            if segment.only is not None:
                kept = list(segment.only)
                allowed = logits[row, kept]
                logits[row] = float("-inf")
                logits[row, kept] = allowed
            elif segment.banned:
                logits[row, list(segment.banned)] = float("-inf")
        if self.sampling.temperature == 0:
            tokens, scores = logits.argmax(-1), logits
        else:
            scores = self.warpers(None, logits)
            tokens = torch.multinomial(torch.softmax(scores, -1), 1, generator=self.generator).squeeze(-1)
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens.tolist(), logprobs.tolist()


def _emit(segment: Segment, out: Decoded, token: int, logprob: float) -> tuple:
    """Apply a segment's rules to the token sampled for it.

    Returns (token added to the stream or None, must it be read into the cache?, is the segment over?).
    """
    if out.sampled.count(True) >= segment.max_new:
        out.finish = "length"
        if segment.closer is None:
            return None, False, True
        _add(out, segment.closer, 0.0, False)
        return segment.closer, True, True
    _add(out, token, logprob, True)
    if token in segment.end_ids:
        out.finish = "end"
        return token, False, True
    if token in segment.stop_ids:
        out.finish = "stop"
        return token, True, True
    return token, True, False


def _add(out: Decoded, token: int, logprob: float, sampled: bool) -> None:
    out.tokens.append(token)
    out.logprobs.append(logprob)
    out.sampled.append(sampled)


class _Batch:
    """Streams decoded together: one batch cache, left-padded, and the next-token logits of each row."""

    def __init__(self, backend: TransformersBackend, streams: list[HFStream]):
        self.backend, self.streams = backend, list(streams)
        if all(stream.kv is not None for stream in self.streams):
            self._open_cached()
        else:
            self._open_fresh()

    def _forward(self, input_ids, position_ids, attention_mask) -> torch.Tensor:
        out = self.backend.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]

    def _open_fresh(self) -> None:
        """Read every context from scratch, under the isolated mask of its paths."""
        device, width = self.backend.device, max(len(s.ids) for s in self.streams)
        rows = len(self.streams)
        ids = torch.full((rows, width), self.backend.pad, dtype=torch.long)
        positions = torch.zeros((rows, width), dtype=torch.long)
        block_of = torch.full((rows, width), -1, dtype=torch.long)
        path_of = torch.full((rows, width), -1, dtype=torch.long)
        self.valid = torch.zeros((rows, width), dtype=torch.bool)
        for r, s in enumerate(self.streams):
            n = len(s.ids)
            ids[r, width - n :] = torch.tensor(s.ids)
            positions[r, width - n :] = torch.tensor(s.positions)
            block_of[r, width - n :] = torch.tensor(s.block_of)
            path_of[r, width - n :] = torch.tensor(s.path_of)
            self.valid[r, width - n :] = True
        self.valid = self.valid.to(device)
        mask = isolated_mask(self.valid, block_of.to(device), path_of.to(device))
        self.cache = DynamicCache()
        self.logits = self._forward(ids.to(device), positions.to(device), mask)

    def _open_cached(self) -> None:
        """Stack the streams' slots into one cache and read what each has not read yet."""
        device, rows = self.backend.device, len(self.streams)
        slots = max(s.fed for s in self.streams)
        unread = max(len(s.ids) - s.fed for s in self.streams)
        sample = self.streams[0].kv
        kv = sample.new_zeros((sample.shape[0], 2, rows, sample.shape[2], slots, sample.shape[4]))
        valid = torch.zeros((rows, slots + unread), dtype=torch.bool)
        ids = torch.full((rows, unread), self.backend.pad, dtype=torch.long)
        positions = torch.zeros((rows, unread), dtype=torch.long)
        for r, s in enumerate(self.streams):
            kv[:, :, r, :, slots - s.fed :] = s.kv
            valid[r, slots - s.fed : slots] = True
            new = len(s.ids) - s.fed
            if new:
                ids[r, unread - new :] = torch.tensor(s.ids[s.fed :])
                positions[r, unread - new :] = torch.tensor(s.positions[s.fed :])
                valid[r, slots + unread - new :] = True
        self.cache = DynamicCache(ddp_cache_data=[(layer[0], layer[1]) for layer in kv])
        self.valid = valid.to(device)
        if unread == 0:
            self.logits = torch.stack([s.logits for s in self.streams])
            return
        self.logits = self._forward(ids.to(device), positions.to(device), self.valid.long())
        for r, s in enumerate(self.streams):
            if len(s.ids) == s.fed:  # nothing new: its logits were kept from its last read
                self.logits[r] = s.logits

    def read_last_tokens(self) -> None:
        """Every stream has exactly one unread token (the one just emitted): read them all."""
        device = self.backend.device
        ids = torch.tensor([[s.ids[-1]] for s in self.streams], device=device)
        positions = torch.tensor([[s.positions[-1]] for s in self.streams], device=device)
        self.valid = torch.cat([self.valid, torch.ones((len(self.streams), 1), dtype=torch.bool, device=device)], 1)
        self.logits = self._forward(ids, positions, self.valid.long())

    def keep(self, flags: list[bool]) -> None:
        """Keep the rows flagged True; the others leave, taking their slots and logits (engine mode)."""
        if all(flags):
            return
        for r, (s, stay) in enumerate(zip(self.streams, flags)):
            if stay:
                continue
            if self.backend.kv_reuse == "full":
                slots = self.valid[r]
                s.kv = torch.stack(
                    [torch.stack([layer.keys[r][:, slots], layer.values[r][:, slots]]) for layer in self.cache.layers]
                )
                s.logits = self.logits[r].clone() if s.fed == len(s.ids) else None
        index = [r for r, stay in enumerate(flags) if stay]
        self.streams = [self.streams[r] for r in index]
        if index:
            index_tensor = torch.tensor(index, device=self.backend.device)
            self.cache.batch_select_indices(index_tensor)
            self.valid, self.logits = self.valid[index_tensor], self.logits[index_tensor]
