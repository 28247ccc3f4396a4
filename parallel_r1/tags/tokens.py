"""Put the six tags into a tokenizer and a model as single tokens.

Rules:
- The tags are added as *non-special* added tokens. TRL decodes completions with
  `skip_special_tokens=True`; special tokens would vanish before the reward functions see them,
  added non-special tokens survive decoding and still encode to one id each.
- The embedding matrix is resized only when the new ids do not fit in its spare rows (Qwen3 has
  151,669 tokenizer entries in 151,936 rows, so the tags fit without a resize). Spare rows that
  already exist are overwritten: their values were never trained.
- Each tag's row starts from its own spelling (`tag_init: spelling`, the default): the mean of the
  rows of the pieces the tokenizer split the tag's text into before the tag was a token (`<Path>` is
  `<`, `Path`, `>` in a BPE vocabulary). This holds in the input embedding and, when the head is not
  tied to it, in the output embedding, on both paths. Why: the six rows differ (`<Path>` and
  `</Path>` by their first piece), and each starts near what the model read when the tag was text,
  which is how the prompt and the cold-start traces showed it. In the head, a tag's logit starts as
  the mean of its pieces' logits, so the tag is likely where its spelling is. `tag_init: mean` gives
  every tag the mean of the rows in use, one row for all six (what this module did before: a model
  then cannot tell the tags apart, and with a tied head cannot say one rather than another).
  `benchmarks/bench_tag_rows.py` measures both after SFT on a real model.
- The model's config records the rule its tag rows started from (`INIT_KEY`); model cards show it.
- Do this before the model is sharded (ZeRO-3 / FSDP): the rows are edited in place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from ..docstrings import document_parameters
from .language import TAGS, TagVocab, is_blank

logger = logging.getLogger(__name__)

TagInit = Literal["spelling", "mean"]
TAG_INITS: tuple[str, ...] = get_args(TagInit)
TAG_INIT_RULES = {  # what each starting rule gives, for the help and the model card
    "spelling": "each tag's row is the mean of the rows of the pieces its text was split into before it was a token "
    "(six distinct rows)",
    "mean": "every tag's row is the mean of the rows in use (one row for all six)",
}
INIT_KEY = "parallel_r1_tag_init"  # in a model's config: the rule its tag rows started from


@document_parameters
@dataclass(kw_only=True)
class TagRowArguments:
    """How the rows of the tags start when they are added to a model (`add_parallel_tokens`)."""

    tag_init: TagInit = field(
        default="spelling",
        metadata={
            "help": "How the rows of the tags added to the model start. "
            + "; ".join(f"'{name}': {rule}" for name, rule in TAG_INIT_RULES.items())
            + "."
        },
    )


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


def add_parallel_tokens(tokenizer, model=None, init: str = "spelling") -> list[str]:
    """Add the missing tags to `tokenizer` (and give them embedding rows in `model`, started by the rule `init`
    names: `TagRowArguments`, module docstring).

    Returns the tags that were added (empty if the tokenizer already had them all).
    """
    if init not in TAG_INITS:
        raise ValueError(f"tag_init must be one of {TAG_INITS}, got {init!r}")
    missing = missing_tags(tokenizer)
    if not missing:
        return []
    spellings = [tokenizer.encode(tag, add_special_tokens=False) for tag in missing]  # pieces while still text
    old_len = len(tokenizer)
    tokenizer.add_tokens(missing, special_tokens=False)
    new_ids = tokenizer.convert_tokens_to_ids(missing)
    tag_ids(tokenizer)  # every tag is now exactly one token, or this raises
    if model is not None:
        in_use = min(old_len, model.get_input_embeddings().weight.shape[0])
        _make_rows(model, in_use, new_ids, len(tokenizer), spellings if init == "spelling" else None)
        setattr(model.config, INIT_KEY, init)
        logger.info("Tag rows started from the rule %r", init)
    logger.info("Added %d tags to the tokenizer: %s", len(missing), missing)
    return missing


def _make_rows(model, in_use: int, new_ids: list[int], new_len: int, spellings: list | None) -> None:
    """Rows `new_ids` of each distinct embedding: the mean of the rows of each tag's `spellings`, or with None the
    mean of the first `in_use` rows. The embedding grows to `new_len` rows first if it is smaller (every row it
    gains is a tag's)."""
    if new_len > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(new_len, mean_resizing=False)  # re-ties a tied head; the rows are set below
    with torch.no_grad():
        for embedding in _distinct_embeddings(model):
            weight = embedding.weight
            if spellings is None:
                starts = weight[:in_use].float().mean(dim=0).expand(len(new_ids), -1)
            else:
                starts = torch.stack([weight[pieces].float().mean(dim=0) for pieces in spellings])
            weight[new_ids] = starts.to(weight.dtype)


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
