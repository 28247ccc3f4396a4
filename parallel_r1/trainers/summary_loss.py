"""Two SFT loss rules that teach a block's summary to vote (`ParallelSFTConfig.summary_loss_weight` and
`disagreeing_paths_in_loss`). Both find the spans they act on with the tag parser, from each row's completion start.

- **Summary weight.** Each token of a summary (after `<Summary>`, `</Summary>` included) counts `weight` times in
  the loss. The vote is a few tokens after a block of many, so at weight 1 it is a small share of the gradient.
  `WeightedSummaries` scales those tokens' log-probabilities as TRL's fused LM head returns them, so TRL's own loss
  (minus their sum, over the count of tokens in the loss, unweighted) becomes the weighted one: no extra forward, no
  full logits. The loss logged, in training and evaluation, is the weighted one; TRL's entropy and token accuracy
  are untouched.
- **Disagreeing paths.** In a complete block (closed, every path closed) whose paths end on different numbers, the
  paths' bodies and their `</Path>` leave the loss; the tags that open them, the summary and the text around the
  block stay. Which path slipped cannot be told from the ids, and SFT would imitate the slip; the summary still
  learns to vote over it. A path's result is the last number it writes (`answers.path_result`, the split vote of
  `answers.paths_disagree`), so the rule is for traces whose paths end on their result, as the demo's do; a path
  that writes no number disagrees with one that does.
"""

from __future__ import annotations

import torch

from ..answers import paths_disagree
from ..tags.language import TagVocab, parse, parser_states

IGNORE = -100  # TRL's label for tokens out of the loss


def completion_starts(labels: torch.Tensor) -> torch.Tensor:
    """Where each row's completion starts: its first label in the loss (a row with none: its length).

    SFTTrainer folds its completion mask into the labels (-100 on the prompt) and drops it, so the
    labels are where a collated batch still says where the completion starts.
    """
    in_loss = labels != IGNORE
    return torch.where(in_loss.any(-1), in_loss.int().argmax(-1), labels.shape[-1])


def without_disagreeing_paths(labels: torch.Tensor, input_ids: torch.Tensor, vocab: TagVocab, decode) -> torch.Tensor:
    """A copy of `labels` where the paths of every complete block whose paths end on different numbers are out of
    the loss. Each row is read from its completion's start, so a prompt that names the tags is not parsed; `decode`
    turns a path's body ids into text (the tokenizer's)."""
    labels = labels.clone()
    for row, start in enumerate(completion_starts(labels).tolist()):
        for block in parse(input_ids[row, start:].tolist(), vocab).blocks:
            if paths_disagree(block, lambda body: decode(list(body))):
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


def summary_tokens(input_ids: torch.Tensor, completion_start: torch.Tensor, vocab: TagVocab) -> torch.Tensor:
    """Where each row holds a summary's tokens: after a `<Summary>`, up to its `</Summary>` included (to the end of
    the row when it is left open), as the tag parser reads the row from its completion start."""
    marked = torch.zeros_like(input_ids, dtype=torch.bool)
    for row, start in enumerate(completion_start.tolist()):
        states = parser_states(input_ids[row, start:].tolist(), vocab)
        marked[row, start:] = torch.tensor([state == "summary" for state in states], dtype=torch.bool)
    return marked


class WeightedSummaries:
    """`forward` (the model, or the structured call the trainer makes of it) with the log-probability of each token
    of `in_summary` (`summary_tokens` of the rows it is called on) scaled by `weight` in the answer of a fused-head
    call (SFTTrainer's loss: `fused_lm_head=True`). Any other call is passed through."""

    def __init__(self, forward, in_summary: torch.Tensor, weight: float):
        self.forward, self.in_summary, self.weight = forward, in_summary, weight

    def __call__(self, *args, **kwargs):
        outputs = self.forward(*args, **kwargs)
        if kwargs.get("fused_lm_head"):
            scored = self.in_summary[:, 1:].to(outputs.log_probs.device)  # the fused head scores the next label
            outputs.log_probs = torch.where(scored, outputs.log_probs * self.weight, outputs.log_probs)
        return outputs
