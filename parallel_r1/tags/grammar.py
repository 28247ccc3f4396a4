"""Which tags may be sampled next: one rule, read from the completion's ids, for the sampler and the trainer.

The rule depends only on where the completion is (the parser state of `language`, from its ids), on how
many blocks it has opened (`max_blocks`) and on the widths a block may have (`min_paths`, `max_paths`):

    main text         `<Parallel>` while fewer than `max_blocks` blocks were opened, no other tag; EOS allowed
    inside a path     `</Path>` only; EOS banned
    inside a summary  `</Summary>` only; EOS banned
    a width decision  (`language.decision_points`: the first token but whitespace after the k-th `</Path>` of a
                      block, min_paths <= k < max_paths; in a rollout, right after it) exactly `<Path>` or
                      `</Parallel>`, nothing else of the whole vocabulary
    elsewhere between the paths of a block, and from `</Parallel>` to `<Summary>`
                      the runtime writes these tokens (`<Path>` below min_paths, `</Parallel>` at max_paths, the
                      separator, `<Summary>`): nothing is sampled there, so nothing is banned

So a path or a summary ends with its closer, sampled or inserted when its budget runs out (budgets cut, they
never ban), and an EOS can only end the main text. A banned token's logit is -inf: the sampler draws from the
model's distribution renormalised over what is allowed, and the training forward (`GrammarForward`)
renormalises the same way at every position, recomputed from the ids, so the two distributions are the same
distribution.

Outside a decision only the six tags and the EOS ids are ever banned (`Grammar.controlled`): the rule is a small
table over a few ids, cheap to apply as logits masks (transformers), per-request bans (vLLM) or per-token masks
(training). A decision allows two ids (`Grammar.decision_ids`) and bans the rest: an allow-list (vLLM's
`allowed_token_ids`, the `only` mask of `masked_logps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint

from .language import (
    DECISION_TAGS,
    PARALLEL_OPEN,
    PATH_CLOSE,
    SUMMARY_CLOSE,
    ParserState,
    TagVocab,
    decision_points,
    parser_states,
)

Phase = Literal[ParserState, "decide"]  # where a completion is before a token: a parser state, or a width decision
SampledPhase = Literal["main", "path", "decide", "summary"]  # the phases where the model samples (the rest: inserted)


@dataclass(frozen=True)
class Grammar:
    vocab: TagVocab
    eos_ids: frozenset
    max_blocks: int
    min_paths: int
    max_paths: int  # equal to min_paths: the width is fixed, no decision

    @cached_property
    def controlled(self) -> tuple:
        """The ids a ban can touch: the six tags and the EOS ids, in a fixed order."""
        return tuple(sorted(set(self.vocab.ids.values()) | set(self.eos_ids)))

    @cached_property
    def decision_ids(self) -> frozenset:
        """The two ids a width decision may take: `<Path>` and `</Parallel>`."""
        return frozenset(self.vocab.ids[tag] for tag in DECISION_TAGS)

    def allowed(self, phase: Phase, blocks: int) -> frozenset:
        """The controlled ids that may be sampled in `phase` after `blocks` blocks were opened."""
        tag = self.vocab.ids
        if phase == "main":
            return frozenset(self.eos_ids) | ({tag[PARALLEL_OPEN]} if blocks < self.max_blocks else set())
        if phase == "path":
            return frozenset({tag[PATH_CLOSE]})
        if phase == "summary":
            return frozenset({tag[SUMMARY_CLOSE]})
        if phase == "decide":  # and no id outside `controlled` either (`only`)
            return self.decision_ids
        return frozenset(self.controlled)  # written by the runtime: no ban

    def banned(self, phase: Phase, blocks: int) -> frozenset:
        return frozenset(self.controlled) - self.allowed(phase, blocks)

    def only(self, phase: Phase) -> frozenset | None:
        """The ids that alone may be sampled in `phase` (an allow-list over the whole vocabulary), or None."""
        return self.decision_ids if phase == "decide" else None

    def phases(self, completion_ids) -> list[tuple[Phase, int]]:
        """(phase, blocks opened) before each token of a completion; a width decision's phase is "decide"."""
        opener = self.vocab.ids[PARALLEL_OPEN]
        decisions = set(decision_points(completion_ids, self.vocab, self))
        out, blocks = [], 0
        for i, (token, state) in enumerate(zip(completion_ids, parser_states(completion_ids, self.vocab))):
            out.append(("decide" if i in decisions else state, blocks))
            if state == "main" and token == opener:
                blocks += 1
        return out

    def violations(self, completion_ids) -> list:
        """Positions whose token the rule bans (always empty for a completion the engine sampled)."""
        return [
            i
            for i, (token, (phase, blocks)) in enumerate(zip(completion_ids, self.phases(completion_ids)))
            if token in self.banned(phase, blocks) or (self.only(phase) is not None and token not in self.only(phase))
        ]

    def masks(self, completion_ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From one reading of the ids: bool [len(ids), len(controlled)], True where that controlled id is banned
        before that token; bool [len(ids)], True where only `decision_ids` may be sampled (a width decision); and
        bool [len(ids)], True where a summary samples the token (the phase a `summary_temperature` applies to)."""
        keys, rows = {}, []
        phases = self.phases(completion_ids)
        for key in phases:
            rows.append(keys.setdefault(key, len(keys)))
        controlled = torch.tensor(self.controlled)
        table = torch.zeros((max(len(keys), 1), len(self.controlled)), dtype=torch.bool)
        for key, k in keys.items():
            table[k] = torch.isin(controlled, torch.tensor(sorted(self.banned(*key)), dtype=torch.long))
        only = torch.tensor([self.only(phase) is not None for phase, _ in phases], dtype=torch.bool)
        summary = torch.tensor([phase == "summary" for phase, _ in phases], dtype=torch.bool)
        return table[torch.tensor(rows, dtype=torch.long)], only, summary


CHUNK = 1024  # positions whose full-vocabulary scores are live at once in `masked_logps`


def masked_logps(
    logits: torch.Tensor,
    targets: torch.Tensor,
    bans: torch.Tensor,
    controlled,
    temperature: float | torch.Tensor,
    only: torch.Tensor | None = None,
    only_ids=(),
):
    """Log-probs of `targets` and entropies under softmax(logits / temperature) with the banned ids removed.

    logits [B, N, V], targets [B, N], bans [B, N, C] over the `controlled` ids, `temperature` one value or one a
    position [B, N]; where `only` [B, N] is True, every id but `only_ids` is banned. Banned logits get the lowest
    float32, which gives them probability 0 (as -inf does in the sampler) without NaN in the entropy. The
    float32 work runs `CHUNK` positions at a time and, when gradients are on, is recomputed in the backward
    pass (activation checkpointing), so its memory stays that of one chunk.
    """
    batch, length, vocab = logits.shape
    columns = torch.as_tensor(controlled, device=logits.device)
    kept = torch.as_tensor(sorted(only_ids), dtype=torch.long, device=logits.device)
    if only is None:
        only = torch.zeros((batch, length), dtype=torch.bool)
    flat = (
        logits.reshape(-1, vocab),
        targets.reshape(-1),
        bans.reshape(-1, len(controlled)).to(logits.device),
        only.reshape(-1).to(logits.device),
        torch.as_tensor(temperature, dtype=torch.float32).expand(batch, length).reshape(-1).to(logits.device),
    )
    pieces = []
    for start in range(0, flat[0].size(0), CHUNK):
        chunk = [part[start : start + CHUNK] for part in flat]
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_masked_chunk, *chunk, columns, kept, use_reentrant=False))
        else:
            pieces.append(_masked_chunk(*chunk, columns, kept))
    if not pieces:
        empty = logits.new_zeros((batch, length), dtype=torch.float32)
        return empty, empty
    logps, entropy = (torch.cat(part).reshape(batch, length) for part in zip(*pieces))
    return logps, entropy


def _masked_chunk(logits, targets, bans, only, temperature, columns, kept):
    scores = logits.float() / temperature[:, None]
    low = torch.finfo(scores.dtype).min
    scores = scores.index_copy(-1, columns, scores.index_select(-1, columns).masked_fill(bans, low))
    if only.any():  # an allow-list: every other id of the vocabulary is banned
        allowed = scores.index_select(-1, kept)
        scores = scores.masked_fill(only[:, None], low).index_copy(-1, kept, allowed)
    logps = torch.log_softmax(scores, dim=-1)
    entropy = -(logps.exp() * logps).sum(-1)
    return logps.gather(-1, targets.clamp(min=0)[:, None]).squeeze(-1), entropy


class GrammarForward:
    """`model`, called as TRL's log-prob forward calls it, scoring the completion under the grammar.

    TRL calls `model(input_ids=, attention_mask=, labels=, fused_lm_head=True)` and reads `.log_probs` and
    `.entropy` (one value per position, the last `logits_to_keep` being the completion). This runs the model's
    own forward on the same inputs for the completion's logits, removes at each completion position what the
    grammar banned there (recomputed from the ids), divides a summary's logits by `summary_temperature` (when
    set) and the others' by `temperature`, as the sampler drew them, and returns the same fields. The completion
    of every row starts at column `completion_start`; its padding (attention mask 0) is scored 0, as TRL does.
    Unlike TRL's fused head it materialises the completion's logits (rows x completion x vocabulary, in the
    model's dtype), and the head runs in that dtype (`cast_lm_head_to_fp32` does not apply); the softmax is
    float32, a chunk at a time (`masked_logps`).
    """

    def __init__(self, model, grammar: Grammar, completion_start: int, temperature: float, summary_temperature=None):
        self.model, self.grammar = model, grammar
        self.completion_start, self.temperature = completion_start, temperature
        self.summary_temperature = temperature if summary_temperature is None else summary_temperature

    def __call__(self, input_ids, attention_mask, labels=None, fused_lm_head=True, **kwargs):
        width = input_ids.size(1) - self.completion_start
        kwargs.update(use_cache=False, logits_to_keep=width + 1)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        completion = input_ids[:, self.completion_start :]
        valid = attention_mask[:, self.completion_start :].bool()
        bans = torch.zeros((*completion.shape, len(self.grammar.controlled)), dtype=torch.bool)
        only = torch.zeros(completion.shape, dtype=torch.bool)
        summary = torch.zeros(completion.shape, dtype=torch.bool)
        for row, (ids, keep) in enumerate(zip(completion.tolist(), valid.tolist())):
            real = [i for i, k in zip(ids, keep) if k]
            columns = torch.tensor(keep, dtype=torch.bool)
            bans[row, columns], only[row, columns], summary[row, columns] = self.grammar.masks(real)
        temperature = torch.where(summary, self.summary_temperature, self.temperature)
        logps, entropy = masked_logps(
            out.logits[:, :-1], completion, bans, self.grammar.controlled, temperature, only,
            self.grammar.decision_ids,
        )  # fmt: skip
        aux_loss = getattr(out, "aux_loss", None)  # mixture-of-experts models, as TRL reads it
        return SimpleNamespace(log_probs=logps * valid, entropy=entropy * valid, aux_loss=aux_loss)
