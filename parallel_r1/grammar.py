"""Which tags may be sampled next: one rule, read from the completion's ids, for the sampler and the trainer.

The rule depends only on where the completion is (the parser state of `format`, from its ids) and on how
many blocks it has opened (`max_blocks`):

    main text         `<Parallel>` while fewer than `max_blocks` blocks were opened, no other tag; EOS allowed
    inside a path     `</Path>` only; EOS banned
    inside a summary  `</Summary>` only; EOS banned
    between the paths of a block, and from `</Parallel>` to `<Summary>`
                      the runtime writes these tokens (`<Path>`, `</Parallel>`, the separator, `<Summary>`):
                      nothing is sampled there, so nothing is banned

So a path or a summary ends with its closer, sampled or inserted when its budget runs out (budgets cut, they
never ban), and an EOS can only end the main text. A banned token's logit is -inf: the sampler draws from the
model's distribution renormalised over what is allowed, and the training forward (`GrammarForward`)
renormalises the same way at every position, recomputed from the ids, so the two distributions are the same
distribution.

Only the six tags and the EOS ids are ever banned (`Grammar.controlled`): the rule is a small table over
a few ids, cheap to apply as logits masks (transformers), per-request bans (vLLM) or per-token masks
(training).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace

import torch

from .format import PARALLEL_OPEN, PATH_CLOSE, SUMMARY_CLOSE, TagVocab, parser_states


@dataclass(frozen=True)
class Grammar:
    vocab: TagVocab
    eos_ids: frozenset
    max_blocks: int

    @cached_property
    def controlled(self) -> tuple:
        """The ids a ban can touch: the six tags and the EOS ids, in a fixed order."""
        return tuple(sorted(set(self.vocab.ids.values()) | set(self.eos_ids)))

    def allowed(self, phase: str, blocks: int) -> frozenset:
        """The controlled ids that may be sampled in `phase` after `blocks` blocks were opened."""
        tag = self.vocab.ids
        if phase == "main":
            return frozenset(self.eos_ids) | ({tag[PARALLEL_OPEN]} if blocks < self.max_blocks else set())
        if phase == "path":
            return frozenset({tag[PATH_CLOSE]})
        if phase == "summary":
            return frozenset({tag[SUMMARY_CLOSE]})
        return frozenset(self.controlled)  # written by the runtime: no ban

    def banned(self, phase: str, blocks: int) -> frozenset:
        return frozenset(self.controlled) - self.allowed(phase, blocks)

    def phases(self, completion_ids) -> list:
        """(phase, blocks opened) before each token of a completion."""
        opener = self.vocab.ids[PARALLEL_OPEN]
        out, blocks = [], 0
        for token, state in zip(completion_ids, parser_states(completion_ids, self.vocab)):
            out.append((state, blocks))
            if state == "main" and token == opener:
                blocks += 1
        return out

    def violations(self, completion_ids) -> list:
        """Positions whose token the rule bans (always empty for a completion the engine sampled)."""
        return [
            i
            for i, (token, (phase, blocks)) in enumerate(zip(completion_ids, self.phases(completion_ids)))
            if token in self.banned(phase, blocks)
        ]

    def ban_matrix(self, completion_ids) -> torch.Tensor:
        """Bool [len(ids), len(controlled)]: True where that controlled id is banned before that token."""
        index = {token: j for j, token in enumerate(self.controlled)}
        rows = torch.zeros((len(completion_ids), len(self.controlled)), dtype=torch.bool)
        table = {}
        for i, key in enumerate(self.phases(completion_ids)):
            if key not in table:
                table[key] = [index[t] for t in self.banned(*key)]
            rows[i, table[key]] = True
        return rows


def masked_logps(logits: torch.Tensor, targets: torch.Tensor, bans: torch.Tensor, controlled, temperature: float):
    """Log-probs of `targets` and entropies under softmax(logits / temperature) with the banned ids removed.

    logits [B, N, V], targets [B, N], bans [B, N, C] over the `controlled` ids. Banned logits get the lowest
    float32, which gives them probability 0 (as -inf does in the sampler) without NaN in the entropy.
    """
    scores = logits.float() / temperature
    columns = torch.as_tensor(controlled, device=scores.device)
    low = torch.finfo(scores.dtype).min
    picked = scores.index_select(-1, columns)
    scores = scores.index_copy(-1, columns, picked.masked_fill(bans.to(scores.device), low))
    logps = torch.log_softmax(scores, dim=-1)
    entropy = -(logps.exp() * logps).sum(-1)
    return logps.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1), entropy


class GrammarForward:
    """`model`, called as TRL's log-prob forward calls it, scoring the completion under the grammar.

    TRL calls `model(input_ids=, attention_mask=, labels=, fused_lm_head=True)` and reads `.log_probs` and
    `.entropy` (one value per position, the last `logits_to_keep` being the completion). This runs the model's
    own forward on the same inputs for the completion's logits, removes at each completion position what the
    grammar banned there (recomputed from the ids), and returns the same fields. The completion of every row
    starts at column `completion_start`; its padding (attention mask 0) is scored 0, as TRL does.
    Unlike TRL's fused head it materialises the completion's logits (rows x completion x vocabulary).
    """

    def __init__(self, model, grammar: Grammar, completion_start: int, temperature: float):
        self.model, self.grammar = model, grammar
        self.completion_start, self.temperature = completion_start, temperature

    def __call__(self, input_ids, attention_mask, labels=None, fused_lm_head=True, **kwargs):
        width = input_ids.size(1) - self.completion_start
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1, **kwargs)
        completion = input_ids[:, self.completion_start :]
        valid = attention_mask[:, self.completion_start :].bool()
        bans = torch.zeros((*completion.shape, len(self.grammar.controlled)), dtype=torch.bool)
        for row in range(completion.size(0)):
            columns = torch.nonzero(valid[row].cpu(), as_tuple=True)[0]
            bans[row, columns] = self.grammar.ban_matrix(completion[row, columns].tolist())
        logps, entropy = masked_logps(out.logits[:, :-1], completion, bans, self.grammar.controlled, self.temperature)
        return SimpleNamespace(log_probs=logps * valid, entropy=entropy * valid, aux_loss=None)
