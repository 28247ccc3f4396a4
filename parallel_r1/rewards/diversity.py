"""Self-BLEU between the paths of a block: how much the paths repeat each other, from 0 (nothing shared) to 1.

Sentence BLEU comes from sacrebleu (its defaults: 13a tokenizer, exponential smoothing). For a block, each
pair of paths (i < j) is scored with path i as the hypothesis and path j as the reference, and the pairs are
averaged; a completion scores the mean over its blocks. Only closed blocks and closed paths count. The
official conventions carry over: a block with fewer than two paths, and a completion without a block, score
1.0 (no parallel thinking is "fully alike").

Bounded time: each path is cut to its first `MAX_PATH_CHARS` characters, and only the first `MAX_PATHS`
paths of the first `MAX_BLOCKS` blocks are read (at most 4 x 6 pairs of 2,000 characters, ~2 ms a pair).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

import sacrebleu

from ..tags.language import Parsed

MAX_PATH_CHARS = 2000
MAX_PATHS = 4
MAX_BLOCKS = 4


def block_self_bleu(paths: list[str]) -> float:
    """Mean pairwise sentence BLEU (0..1) of the paths of one block; 1.0 for fewer than two paths."""
    paths = [p[:MAX_PATH_CHARS] for p in paths[:MAX_PATHS]]
    if len(paths) < 2:
        return 1.0
    scores = [sacrebleu.sentence_bleu(hyp, [ref]).score / 100 for hyp, ref in combinations(paths, 2)]
    return min(sum(scores) / len(scores), 1.0)


def self_bleu(parsed: Parsed, decode: Callable | None = None) -> float:
    """Mean block self-BLEU over the closed blocks; 1.0 when there is none. An id parse needs `decode`."""
    if parsed.is_ids and decode is None:
        raise ValueError("self_bleu of an id parse needs decode (the tokenizer's ids -> text)")
    text = decode if parsed.is_ids else str
    blocks = [b for b in parsed.blocks if b.closed][:MAX_BLOCKS]
    if not blocks:
        return 1.0
    return sum(block_self_bleu([text(p.body) for p in b.paths if p.closed]) for b in blocks) / len(blocks)
