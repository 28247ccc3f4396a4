"""Put the six tags into a tokenizer and a model as single tokens.

Rules:
- The tags are added as *non-special* added tokens. TRL decodes completions with
  `skip_special_tokens=True`; special tokens would vanish before the reward functions see them,
  added non-special tokens survive decoding and still encode to one id each.
- The embedding matrix is resized only when the new ids do not fit in its spare rows (Qwen3 has
  151,669 tokenizer entries in 151,936 rows, so the tags fit without a resize).
- New rows start at the mean of the rows that were in use before, in the input embedding and,
  when the head is not tied to it, in the output embedding too. A resize uses transformers' own
  mean resizing; spare rows that already exist are overwritten with the mean, because their
  values were never trained.
- Do this before the model is sharded (ZeRO-3 / FSDP): the rows are edited in place.
"""

from __future__ import annotations

import logging

import torch

from .language import TAGS, TagVocab, is_blank

logger = logging.getLogger(__name__)


def tag_ids(tokenizer) -> dict[str, int]:
    """The id of each tag; raises ValueError naming the tags that are not single tokens."""
    ids, bad = {}, []
    for tag in TAGS:
        encoded = tokenizer.encode(tag, add_special_tokens=False)
        if len(encoded) != 1:
            bad.append(f"{tag} -> {encoded}")
        else:
            ids[tag] = encoded[0]
    if bad:
        raise ValueError(
            "These tags are not single tokens in the tokenizer: "
            + ", ".join(bad)
            + ". Add them with parallel_r1.tags.tokens.add_parallel_tokens (or scripts/add_special_tokens.py)."
        )
    return ids


def tag_vocab(tokenizer) -> TagVocab:
    """The tags' ids in `tokenizer` and the ids whose text is blank (raises like `tag_ids` if a tag is missing)."""
    ids = tag_ids(tokenizer)
    tags = set(ids.values())
    blank = frozenset(
        i
        for tok, i in tokenizer.get_vocab().items()
        if i not in tags and is_blank(tokenizer.convert_tokens_to_string([tok]))
    )
    return TagVocab(ids=ids, blank_ids=blank)


def missing_tags(tokenizer) -> list[str]:
    """The tags that are not single tokens of `tokenizer`."""
    return [tag for tag in TAGS if len(tokenizer.encode(tag, add_special_tokens=False)) != 1]


def has_parallel_tokens(tokenizer) -> bool:
    return not missing_tags(tokenizer)


def add_parallel_tokens(tokenizer, model=None) -> list[str]:
    """Add the missing tags to `tokenizer` (and give them embedding rows in `model`).

    Returns the tags that were added (empty if the tokenizer already had them all).
    """
    missing = missing_tags(tokenizer)
    if not missing:
        return []
    old_len = len(tokenizer)
    tokenizer.add_tokens(missing, special_tokens=False)
    new_ids = tokenizer.convert_tokens_to_ids(missing)
    tag_ids(tokenizer)  # every tag is now exactly one token, or this raises
    if model is not None:
        _make_rows(model, old_len, new_ids, len(tokenizer))
    logger.info("Added %d tags to the tokenizer: %s", len(missing), missing)
    return missing


def _make_rows(model, old_len: int, new_ids: list[int], new_len: int) -> None:
    rows = model.get_input_embeddings().weight.shape[0]
    if new_len > rows:
        # transformers initialises the new rows around the mean of the existing ones (and re-ties the head)
        model.resize_token_embeddings(new_len, mean_resizing=True)
        return
    in_rows = old_len if old_len <= rows else rows
    with torch.no_grad():
        for embedding in _distinct_embeddings(model):
            weight = embedding.weight
            weight[new_ids] = weight[:in_rows].mean(dim=0, keepdim=True).to(weight.dtype)


def _distinct_embeddings(model):
    """The input embedding and, if it is a separate matrix, the output embedding."""
    inp = model.get_input_embeddings()
    out = model.get_output_embeddings()
    if out is None or out.weight.data_ptr() == inp.weight.data_ptr():
        return [inp]
    return [inp, out]


def eos_ids(tokenizer, generation_config=None) -> frozenset:
    """The ids that end a completion: the tokenizer's EOS and those of the model's generation config (one id or a
    list), when it has one."""
    eos = getattr(generation_config, "eos_token_id", None)
    listed = eos if isinstance(eos, (list, tuple)) else [eos]
    return frozenset({tokenizer.eos_token_id, *listed} - {None})
