"""One completion as the rewards see it: its ids and text, its reference, and facts computed on demand.

The structure is read from the token ids whenever TRL passes them (`completion_ids`) and the tokenizer has
the tags: those are the ids that are trained, and a tag spelled with ordinary tokens is plain text there,
however it decodes. The text (TRL's decoding of the same ids) is read only for the final answer, and for the
structure when no ids are given (external text, a tokenizer without the tags).

- `correct`: the final answer matches the reference (`answers.is_correct`, bounded in time).
- `blocks` (P): the blocks the completion opens, well-formed or not; `well_formed` (F): `language.parse` finds
  no error; `parallel`: P >= 1 and F (the paper's parallel-ratio event).
- `self_bleu`: how alike the paths are (`diversity.self_bleu`, on the paths' decoded text).
- `min_paths`: the run's, the paths every block gets (`Reward.min_paths`).
- `efficiency`: g = max((T - V) / T, 0) of a parallel completion, T its total length and V its critical path
  (`language.stats`), 0 for any other. Units: tokens for an id parse, characters for a text parse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from ..answers import is_correct
from ..tags.language import Parsed, TagVocab, parse, stats
from .diversity import self_bleu


def completion_text(completion) -> str:
    """The text of a TRL completion: a string, or chat messages (the assistant contents, joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        return ""
    return "".join(
        message["content"]
        for message in completion
        if isinstance(message, dict)
        and message.get("role", "assistant") == "assistant"
        and isinstance(message.get("content"), str)
    )


@dataclass
class Completion:
    text: str
    reference: object = None
    ids: list | tuple | None = None
    vocab: TagVocab | None = None
    decode: Callable | None = None  # ids -> text, to read the paths of an id parse
    min_paths: int = field(kw_only=True)

    @cached_property
    def correct(self) -> bool:
        return is_correct(self.text, self.reference)

    @cached_property
    def parsed(self) -> Parsed:
        if self.ids is not None and self.vocab is not None:
            return parse(self.ids, self.vocab)
        return parse(self.text)

    @property
    def blocks(self) -> int:
        return len(self.parsed.blocks)

    @property
    def well_formed(self) -> bool:
        return self.parsed.well_formed

    @property
    def parallel(self) -> bool:
        return self.parsed.has_parallel

    @cached_property
    def self_bleu(self) -> float:
        return self_bleu(self.parsed, self.decode)

    @cached_property
    def efficiency(self) -> float:
        if not self.parallel:
            return 0.0
        shape = stats(self.parsed)
        return max((shape.total - shape.critical) / shape.total, 0.0) if shape.total else 0.0
