"""Positions and attention of the structured variants, isolated ("Unseen") and tree, as functions of the token ids.

The rule (docs/paper.md, Seen and Unseen), for the completion part of a sequence:
- A path never sees a sibling path of its own block. Everything else is causal: a path sees the
  prompt, the main text before its block, earlier blocks and its own earlier tokens; whatever comes
  after a block's paths (`</Parallel>`, the summary, the rest of the completion) sees all of them.
- Every path of a block restarts its positions at pos(`<Parallel>`) + 1 (a path's whitespace lead, if
  any, is part of the path). The first token after the paths gets pos(`<Parallel>`) + longest path + 1,
  where a path's length counts its lead and its tags. The prompt and the main text count up by one.
- A width decision (`language.decision_points`: the first token but whitespace after the k-th `</Path>` of a block,
  min_paths <= k < max_paths, which the model writes: `<Path>` or `</Parallel>`) reads the context and every path so
  far, as the summary does. In line it could not: the `</Path>` before it sees its own path only (and whitespace
  after it, which a trace may have and a rollout never has, belongs to the next path or to none). So it is predicted by a
  *probe*: one more query token, `</Path>`, at pos(`<Parallel>`) + the longest of the paths so far (where the
  longest path's `</Path>` is, just before where `</Parallel>` goes), seeing everything before the decision and
  itself; nothing attends to it. A path the model opened is an isolated path like the others (positions from
  pos(`<Parallel>`) + 1, blind to its siblings). With `min_paths == max_paths` there is no decision and no probe.

The tree comes from `language.parse`, which reads ids with the same state machine as the rollout
engine, so a cut completion gets the structure it was sampled with (an unclosed last path is
still a path). The prompt is never parsed: its tags (the instruction names them) are plain text.

The mask is built as a boolean [B, 1, L, L] tensor (True = may attend); a forward with gradients hands the model
an additive one in the dtype attention runs in (0 or the dtype's lowest value), which transformers passes through
unchanged to SDPA. SDPA turns a boolean mask into an additive one inside every layer and keeps that copy for the
backward, one per layer; built once, it is shared (benchmarks/results/structures.md). A flex-attention `BlockMask` from the same
`path_of`/`block_of` arrays would skip the masked tiles; on CPU it has no backward (same file). Padding rows and
columns are masked, except that every token sees itself, so no row of the softmax is empty (no NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from .tags.grammar import masked_logps
from .tags.language import PATH_CLOSE, Block, TagVocab, Text, decision_points, parse

SUPPORTED_ATTENTION = ("sdpa",)
PROBE = PATH_CLOSE  # the token a width decision's probe reads (the sampler's `Backend.probe` reads the same)


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


def probes(completion_ids, vocab: TagVocab, widths) -> list[tuple[int, int]]:
    """(decision index, probe offset) of each width decision of one completion (`language.decision_points` of
    `widths`): the probe predicts the token at that index, at that offset from the completion's first position
    (isolated layout)."""
    points = decision_points(completion_ids, vocab, widths)
    if not points:
        return []
    offsets, out = completion_layout(completion_ids, vocab).offsets, []
    blocks = parse(completion_ids, vocab).blocks
    for point in points:
        block = next(b for b in blocks if b.start < point < b.end)
        before = [p.length for p in block.paths if p.end <= point]  # the paths the decision follows
        out.append((point, offsets[block.start] + max(before)))
    return out


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
    calls the model; the caller's batch keeps its 2-D attention mask, which TRL also reads elsewhere.

    When the rows hold width decisions (`widths`, the run's settings: `min_paths < max_paths`) each decision's
    probe is appended to its row and predicts it, as `TreeForward`'s copies do (`PickedForward`); the answer has
    the shape of the rows given."""

    def __init__(self, model, vocab: TagVocab, completion_start: torch.Tensor | int, widths):
        self.model, self.vocab, self.completion_start, self.widths = model, vocab, completion_start, widths

    def __call__(self, input_ids, attention_mask, **kwargs):
        structure = isolated_inputs(input_ids, attention_mask, self.completion_start, self.vocab)
        found = self._probes(input_ids, attention_mask)
        if not any(found):
            structure["attention_mask"] = additive(structure["attention_mask"], self.model)
            return self.model(**{**kwargs, "input_ids": input_ids, **structure})  # the structure wins
        layout = self._extended(input_ids, attention_mask, structure, found)
        return PickedForward(self.model, layout)(input_ids, **kwargs)

    def _probes(self, input_ids, attention_mask) -> list:
        """Per row: (column predicting the decision, probe position) of each decision."""
        if self.widths.min_paths >= self.widths.max_paths:
            return [[] for _ in range(input_ids.size(0))]
        starts = self.completion_start
        if isinstance(starts, int):
            starts = [starts] * input_ids.size(0)
        found = []
        for row in range(input_ids.size(0)):
            valid = torch.nonzero(attention_mask[row].bool(), as_tuple=True)[0].tolist()
            columns = [c for c in valid if c >= int(starts[row])]
            completion = input_ids[row, columns].tolist()
            first = sum(1 for c in valid if c < int(starts[row]))  # the completion's first position
            points = probes(completion, self.vocab, self.widths)
            found.append([(columns[d - 1], first + offset) for d, offset in points])
        return found

    def _extended(self, input_ids, attention_mask, structure: dict, found: list) -> dict:
        """The rows with their probes after them (`PickedForward`'s layout)."""
        batch, length = input_ids.shape
        width = length + max(len(row) for row in found)
        device = input_ids.device
        ids = torch.zeros((batch, width), dtype=torch.long, device=device)
        ids[:, :length] = input_ids
        positions = torch.zeros((batch, width), dtype=torch.long, device=device)
        positions[:, :length] = structure["position_ids"]
        mask = torch.zeros((batch, width, width), dtype=torch.bool, device=device)
        mask[:, :length, :length] = structure["attention_mask"][:, 0]
        source = torch.arange(length, device=device).repeat(batch, 1)
        valid = attention_mask.bool()
        for row, probes_of_row in enumerate(found):
            for j, (column, position) in enumerate(probes_of_row):
                at = length + j
                ids[row, at], positions[row, at] = self.vocab.ids[PROBE], position
                mask[row, at, : column + 1] = valid[row, : column + 1]  # outside every path: all that came before
                source[row, column] = at
        mask |= torch.eye(width, dtype=torch.bool, device=device)
        return {"input_ids": ids, "position_ids": positions, "attention_mask": mask[:, None], "source": source}


class PickedForward:
    """`model` on extended rows (the rows as written and query tokens after them: tree copies, isolated probes),
    answering as the model would on the rows as written: `.logits` for their last `logits_to_keep` columns, column q's
    logits being those of the extended index `source[:, q]`.

    `layout` holds `input_ids`, `position_ids` and a boolean `attention_mask` [B, 1, W, W] over the extended rows,
    and `source` [B, L]. The backbone runs on the extended rows. A forward pre-hook on the LM head hands it only the
    rows of hidden states that the kept columns need, so the head, and whatever the model does to its logits after
    it (Gemma's softcapping, Cohere's or Granite's scaling), run inside the model's own forward, under any wrapper
    that gathers the head's weights there (DDP, DeepSpeed ZeRO-3, FSDP, PEFT)."""

    def __init__(self, model, layout: dict):
        self.model, self.layout = model, layout

    def __call__(
        self, input_ids, attention_mask=None, logits_to_keep: int = 0, labels=None, fused_lm_head=False, **kwargs
    ):
        """`.logits` of the kept columns; with `fused_lm_head` (SFTTrainer's call), TRL's fused-head fields instead:
        per position, the log-prob and entropy of the next label, whether it is the top token, and the label mask."""
        if fused_lm_head:
            return _fused(self, input_ids, labels, **kwargs)
        keep = logits_to_keep or input_ids.size(1)
        index = self.layout["source"][:, input_ids.size(1) - keep :]

        def pick(head, args):  # the head's input: every extended row -> the rows that predict the kept columns
            hidden = args[0]
            return (hidden.gather(1, index[..., None].expand(-1, -1, hidden.size(-1))), *args[1:])

        head = getattr(self.model, "module", self.model).get_output_embeddings()  # through DDP / DeepSpeed wrappers
        handle = head.register_forward_pre_hook(pick)
        try:
            kwargs.update(use_cache=False, logits_to_keep=0)
            out = self.model(
                input_ids=self.layout["input_ids"],
                attention_mask=additive(self.layout["attention_mask"], self.model),
                position_ids=self.layout["position_ids"],
                **kwargs,
            )
        finally:
            handle.remove()
        return SimpleNamespace(logits=out.logits, aux_loss=getattr(out, "aux_loss", None))


def _fused(forward, input_ids, labels, **kwargs):
    """TRL's fused-head fields from `forward`'s logits (float32, chunked)."""
    out = forward(input_ids, **kwargs)
    logits, targets = out.logits[:, :-1], labels[:, 1:]
    label_mask = targets != -100
    nothing = torch.zeros((*targets.shape, 1), dtype=torch.bool)
    logps, entropy = masked_logps(logits, targets, nothing, (0,), temperature=1.0)
    is_top1 = (logits.argmax(-1) == targets) & label_mask
    return SimpleNamespace(
        log_probs=logps * label_mask, entropy=entropy * label_mask, is_top1=is_top1, label_mask=label_mask,
        aux_loss=out.aux_loss,
    )  # fmt: skip


def additive(mask: torch.Tensor, model) -> torch.Tensor:
    """For a forward with gradients, a boolean mask as the additive mask SDPA would make of it in every layer, made
    once in the dtype attention runs in (autocast's, else the model's); without gradients, the boolean mask (SDPA
    frees each layer's copy at once, and the boolean one is the smaller)."""
    if not torch.is_grad_enabled():
        return mask
    device = mask.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = getattr(model, "module", model).dtype  # through DDP / DeepSpeed wrappers
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def check_attention_implementation(model) -> None:
    """The structured masks are 4-D tensors that transformers hands to SDPA unchanged; eager attention would add
    the rollout backend's boolean ones as 0/1."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"attention='isolated' and 'tree' need attn_implementation in {SUPPORTED_ATTENTION}, but the model uses "
            f"{implementation!r}. Load it with attn_implementation='sdpa'."
        )


# --------------------------------------------------------------------------- the tree variant
#
# What a serving engine samples in fork mode (vLLM, or the transformers backend's causal join): a path's tokens see
# the context through `<Parallel>` and their own path, at positions going on from `<Parallel>` (as in the isolated
# variant); `</Parallel>`, the summary and everything after see the paths as written, one after the other, causally,
# at sequential positions. Its training forward holds the row as written, read causally (the context the join saw),
# plus a copy of each path but the first of every block, laid out as the isolated path it was sampled as: the copy
# sees the row through `<Parallel>` and itself, at positions from pos(`<Parallel>`) + 1. A path token is scored from
# its copy (the first path is its own copy: in line it sees exactly that); every other token from the row. A width
# decision is scored in line: there it reads the context and the paths so far, as the engine's causal join does, and
# a path the model opened gets a copy like any other.


@dataclass(frozen=True)
class TreeRow:
    """One row of the tree layout, as lists over its extended length (the row as written, then the copies)."""

    ids: list
    positions: list
    copy: list  # per extended token: which copy it belongs to, -1 for the row as written
    sees_through: list  # per extended token: a copy sees the row up to this index (its block's <Parallel>)
    source: list  # per token q of the row as written: the extended index whose logits predict token q + 1


def tree_row(ids, completion_start: int, vocab: TagVocab, widths) -> TreeRow:
    """The tree layout of one unpadded row (prompt + completion, the completion from `completion_start`); its width
    decisions are those of `widths` (the run's settings, `language.decision_points`)."""
    n = len(ids)
    ext_ids, positions, copy, sees_through = list(ids), list(range(n)), [-1] * n, [-1] * n
    source = list(range(n))
    copies = 0
    completion = list(ids[completion_start:])
    decisions = set(decision_points(completion, vocab, widths))
    for block in parse(completion, vocab).blocks:
        opener = completion_start + block.start
        for path in block.paths[1:]:
            first = completion_start + path.start
            for offset in range(path.length):
                if path.start + offset not in decisions:  # a decision (`<Path>`, after any lead) stays in line
                    source[first + offset - 1] = opener if offset == 0 else len(ext_ids) - 1
                ext_ids.append(ids[first + offset])
                positions.append(opener + 1 + offset)
                copy.append(copies)
                sees_through.append(opener)
            copies += 1
    return TreeRow(ext_ids, positions, copy, sees_through, source)


def tree_mask(rows: list[TreeRow], width: int, device) -> torch.Tensor:
    """Boolean [B, 1, W, W]: the row as written is causal; a copy token sees the row through its block's
    `<Parallel>` and its own copy up to itself; padding keys are hidden, the diagonal is always on."""
    mask = torch.zeros((len(rows), width, width), dtype=torch.bool)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    for r, row in enumerate(rows):
        n = len(row.source)
        mask[r, :n, :n] = causal[:n, :n]
        copy = torch.tensor(row.copy)
        same = (copy[:, None] == copy[None, :]) & (copy[:, None] >= 0)
        extended = len(row.ids)
        mask[r, n:extended, :extended] = (same & causal[:extended, :extended])[n:]
        for i in range(n, extended):
            mask[r, i, : row.sees_through[i] + 1] = True
    mask |= torch.eye(width, dtype=torch.bool)
    return mask[:, None].to(device)


class TreeForward:
    """`model` on the tree layout of the ids it is given (`PickedForward` over `tree_row`s), answering as the model
    would on those ids: each column's logits are those that predict the next token of the original row under the
    tree policy (for a path token: from its isolated copy)."""

    def __init__(self, model, vocab: TagVocab, completion_start: torch.Tensor | int, widths):
        self.model, self.vocab, self.completion_start, self.widths = model, vocab, completion_start, widths

    def extra_tokens(self, input_ids, attention_mask) -> int:
        """Tokens the copies add to these rows (the layout's cost)."""
        return sum(len(r.ids) - len(r.source) for r in self._rows(input_ids, attention_mask)[0])

    def _rows(self, input_ids, attention_mask):
        batch = input_ids.size(0)
        starts = self.completion_start
        if isinstance(starts, int):
            starts = [starts] * batch
        rows, columns = [], []
        for r in range(batch):
            valid = torch.nonzero(attention_mask[r].bool(), as_tuple=True)[0].tolist()
            start = int(starts[r])
            in_prompt = sum(1 for c in valid if c < start)
            ids = input_ids[r, valid].tolist()
            rows.append(tree_row(ids, in_prompt, self.vocab, self.widths))
            columns.append(valid)
        return rows, columns

    def __call__(self, input_ids, attention_mask, **kwargs):
        device = input_ids.device
        rows, columns = self._rows(input_ids, attention_mask)
        width = max(len(r.ids) for r in rows)
        source = torch.zeros(input_ids.shape, dtype=torch.long, device=device)
        for r, (row, valid) in enumerate(zip(rows, columns)):
            source[r, valid] = torch.tensor(row.source, dtype=torch.long, device=device)
        layout = {
            "input_ids": torch.tensor([r.ids + [0] * (width - len(r.ids)) for r in rows], device=device),
            "position_ids": torch.tensor(
                [r.positions + [0] * (width - len(r.positions)) for r in rows], device=device
            ),
            "attention_mask": tree_mask(rows, width, device),
            "source": source,
        }
        return PickedForward(self.model, layout)(input_ids, **kwargs)
