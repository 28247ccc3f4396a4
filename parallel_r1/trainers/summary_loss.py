"""Two SFT loss rules that teach a block's summary to vote (`ParallelSFTConfig.summary_loss_weight` and
`disagreeing_paths_in_loss`). Both read the token ids only.

- **Summary weight.** Each token of a summary (after `<Summary>`, `</Summary>` included) counts `weight` times in
  the loss. The vote is a few tokens after a block of many, so at weight 1 it is a small share of the gradient.
  `WeightedSummaries` scales those tokens' log-probabilities as TRL's fused LM head returns them, so TRL's own loss
  (minus their sum, over the count of tokens in the loss) becomes the weighted one: no extra forward, no full
  logits, and TRL's metrics (entropy, token accuracy) untouched.
- **Disagreeing paths.** In a block whose paths end on different numbers, the paths' bodies and their `</Path>` leave
  the loss; the tags that open them, the summary and the text around the block stay. Which path slipped cannot be
  told from the ids, and SFT would imitate the slip; the summary still learns to vote over it. A path's result is
  the last number it writes (none when it writes no number). A block whose paths agree trains as before.
"""

from __future__ import annotations

import re

import torch

from ..tags.language import SUMMARY_CLOSE, SUMMARY_OPEN, TagVocab, parse

IGNORE = -100  # TRL's label for tokens out of the loss
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def path_result(text: str) -> str | None:
    """The last number a path writes (`-?digits[.digits]`), or None."""
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def without_disagreeing_paths(labels: torch.Tensor, input_ids: torch.Tensor, vocab: TagVocab, decode) -> torch.Tensor:
    """A copy of `labels` where the paths of every block whose paths end on different numbers are out of the loss.

    Each row is read from its completion's start (its first label in the loss), so a prompt that names the tags is
    not parsed; `decode` turns a path's body ids into text (the tokenizer's)."""
    labels = labels.clone()
    in_loss = labels != IGNORE
    for row in range(labels.shape[0]):
        if not in_loss[row].any():
            continue
        start = int(in_loss[row].int().argmax())
        for block in parse(input_ids[row, start:].tolist(), vocab).blocks:
            results = {path_result(decode(list(path.body))) for path in block.paths}
            if len(results) > 1:
                for path in block.paths:
                    labels[row, start + path.open_at + 1 : start + path.end] = IGNORE
    return labels


class DisagreeingPathsOutOfLoss:
    """A data collator that applies `without_disagreeing_paths` to the labels of the batches `collator` makes, so
    that what counts the tokens in the loss (TRL's `num_items_in_batch`, its logged metrics) counts the same ones."""

    def __init__(self, collator, vocab: TagVocab, decode):
        self.collator, self.vocab, self.decode = collator, vocab, decode

    def __call__(self, examples):
        batch = self.collator(examples)
        batch["labels"] = without_disagreeing_paths(batch["labels"], batch["input_ids"], self.vocab, self.decode)
        return batch


def summary_tokens(labels: torch.Tensor, vocab: TagVocab) -> torch.Tensor:
    """Where the labels hold a summary's tokens: after a `<Summary>`, up to its `</Summary>` included (to the end of
    the row when it is left open). Read from the labels, which keep every tag of a completion."""
    opened = labels == vocab.ids[SUMMARY_OPEN]
    closed = labels == vocab.ids[SUMMARY_CLOSE]
    return (opened.cumsum(-1) > closed.cumsum(-1) - closed.long()) & ~opened


class WeightedSummaries:
    """`forward` (the model, or the structured call the trainer makes of it) with the log-probability of each summary
    token scaled by `weight` in the answer of a fused-head call (SFTTrainer's loss: `fused_lm_head=True` with
    `labels`). Any other call is passed through."""

    def __init__(self, forward, vocab: TagVocab, weight: float):
        self.forward, self.vocab, self.weight = forward, vocab, weight

    def __call__(self, *args, **kwargs):
        outputs = self.forward(*args, **kwargs)
        labels = kwargs.get("labels")
        if kwargs.get("fused_lm_head") and labels is not None:
            in_summary = summary_tokens(labels, self.vocab)[:, 1:]  # the fused head scores the next label
            outputs.log_probs = torch.where(in_summary, outputs.log_probs * self.weight, outputs.log_probs)
        return outputs
