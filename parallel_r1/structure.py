"""Positions and attention of the isolated ("Unseen") variant, as a function of the token ids.

The rule (REFERENCE §4), for the completion part of a sequence:
- A path never sees a sibling path of its own block. Everything else is causal: a path sees the
  prompt, the main text before its block, earlier blocks and its own earlier tokens; whatever comes
  after a block's paths (`</Parallel>`, the summary, the rest of the completion) sees all of them.
- Every path of a block restarts its positions at pos(`<Parallel>`) + 1 (a path's whitespace lead, if
  any, is part of the path). The first token after the paths gets pos(`<Parallel>`) + longest path + 1,
  where a path's length counts its lead and its tags. The prompt and the main text count up by one.

The tree comes from `format.parse`, which reads ids with the same state machine as the rollout
engine, so a cut completion gets the structure it was sampled with (an unclosed last path is
still a path). The prompt is never parsed: its tags (the instruction names them) are plain text.

The mask is a boolean [B, 1, L, L] tensor (True = may attend), which transformers passes through
unchanged to SDPA. It costs L*L bytes per row, a quarter of a float32 mask; at long L (several
thousand tokens) a flex-attention `BlockMask` built from the same `path_of`/`block_of` arrays would
skip the masked tiles and keep fused kernels, which is where it would pay. Padding rows and columns
are masked, except that every token sees itself, so no row of the softmax is empty (no NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .format import Block, TagVocab, Text, parse

SUPPORTED_ATTENTION = ("sdpa",)


@dataclass(frozen=True)
class Layout:
    """Per completion token: position offset from the completion start, and which path it is in."""

    offsets: list  # int per token
    block_of: list  # block index per token, -1 outside paths
    path_of: list  # path index within its block per token, -1 outside paths


def completion_layout(completion_ids, vocab: TagVocab) -> Layout:
    """The isolated layout of one completion (no padding)."""
    offsets, block_of, path_of = [], [], []

    def run(n: int, start: int, block: int = -1, path: int = -1) -> int:
        offsets.extend(range(start, start + n))
        block_of.extend([block] * n)
        path_of.extend([path] * n)
        return start + n

    pos, b = 0, -1
    for node in parse(completion_ids, vocab).nodes:
        if isinstance(node, Text):
            pos = run(len(node.content), pos)
            continue
        assert isinstance(node, Block)
        b, opener = b + 1, pos
        pos = run(node.opener_end - node.start, pos)  # <Parallel>
        for p, path in enumerate(node.paths):
            run(path.length, opener + 1, b, p)
        pos = opener + 1 + max((path.length for path in node.paths), default=0)
        pos = run(node.end - node.paths_end, pos)
    return Layout(offsets, block_of, path_of)


def isolated_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_start: torch.Tensor | int,
    vocab: TagVocab,
) -> dict:
    """`position_ids` [B, L] and a boolean `attention_mask` [B, 1, L, L] for the isolated variant.

    `input_ids`/`attention_mask` are [B, L] with any padding (left, right or both); the completion of
    row i is the non-padding tokens from column `completion_start[i]` on (an int means every row).
    """
    batch, length = input_ids.shape
    device = input_ids.device
    valid = attention_mask.bool()
    if isinstance(completion_start, int):
        completion_start = torch.full((batch,), completion_start, dtype=torch.long)
    position_ids = (valid.long().cumsum(-1) - 1).clamp(min=0)
    block_of = torch.full((batch, length), -1, dtype=torch.long)
    path_of = torch.full((batch, length), -1, dtype=torch.long)
    for row in range(batch):
        start = int(completion_start[row])
        columns = start + torch.nonzero(valid[row, start:].cpu(), as_tuple=True)[0]
        if len(columns) == 0:
            continue
        layout = completion_layout(input_ids[row, columns].tolist(), vocab)
        first = position_ids[row, columns[0]].item()
        position_ids[row, columns] = first + torch.tensor(layout.offsets, dtype=torch.long, device=device)
        block_of[row, columns] = torch.tensor(layout.block_of, dtype=torch.long)
        path_of[row, columns] = torch.tensor(layout.path_of, dtype=torch.long)
    return {
        "position_ids": position_ids.to(device),
        "attention_mask": isolated_mask(valid, block_of.to(device), path_of.to(device)),
    }


def isolated_mask(valid: torch.Tensor, block_of: torch.Tensor, path_of: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, L, L]: causal, minus sibling paths, minus padding keys; the diagonal always on."""
    length = valid.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    in_path = path_of >= 0
    siblings = (
        (block_of[:, :, None] == block_of[:, None, :])
        & in_path[:, :, None]
        & in_path[:, None, :]
        & (path_of[:, :, None] != path_of[:, None, :])
    )
    mask = causal & ~siblings & valid[:, None, :]
    mask |= torch.eye(length, dtype=torch.bool, device=valid.device)
    return mask[:, None]


class IsolatedForward:
    """`model`, called on the isolated structure of the ids it is given (the completion of row i starts at
    column `completion_start[i]`, or at `completion_start` for every row). The trainers pass it where TRL
    calls the model; the caller's batch keeps its 2-D attention mask, which TRL also reads elsewhere."""

    def __init__(self, model, vocab: TagVocab, completion_start: torch.Tensor | int):
        self.model, self.vocab, self.completion_start = model, vocab, completion_start

    def __call__(self, input_ids, attention_mask, **kwargs):
        structure = isolated_inputs(input_ids, attention_mask, self.completion_start, self.vocab)
        return self.model(**{**kwargs, "input_ids": input_ids, **structure})  # the structure wins over given positions


def check_attention_implementation(model) -> None:
    """The isolated mask is a boolean tensor: SDPA reads it as such (eager attention would add it)."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"attention='isolated' needs attn_implementation in {SUPPORTED_ATTENTION}, but the model uses "
            f"{implementation!r}. Load it with attn_implementation='sdpa'."
        )
