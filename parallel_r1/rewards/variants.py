"""Every Parallel-R1 reward (docs/paper.md, the rewards), as TRL reward functions.

c: the answer is correct; P: blocks opened; F: well-formed; b: self-BLEU of the paths (0..1, see `diversity`);
g: efficiency (see `completion`). Each reward is a rule on one `Completion`, wrapped by `Reward` into TRL's
batch signature, and states its range; `@reward` registers it in `REWARDS` by the rule's name, where it is defined.
Math rewards use the ±1 scale, the GSM8K stage 0/1, as the official code.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import import_module

from ..tags.language import MIN_PATHS, TagVocab
from .completion import Completion, completion_text

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reward:
    """A TRL reward function: `rule` applied to each completion, one float (within `low`..`high`) per row.

    TRL calls it as `f(prompts=, completions=, completion_ids=, <dataset columns>, trainer_state=, ...)`; the
    reference answer comes from the `answer` column. A bad completion gets a value, never an exception; if the
    rule itself fails (a bug), the row gets None, which TRL treats as "not scored", and the error is logged.
    """

    name: str
    rule: Callable[[Completion], float]
    low: float
    high: float  # math.inf when unbounded
    needs_answer: bool = True
    vocab: TagVocab | None = None  # the tokenizer's tags: completions are read from their ids
    decode: Callable | None = None  # the tokenizer's ids -> text, for the paths' text
    min_paths: int = MIN_PATHS  # the run's: the paths every block gets (the least a block holds, outside a run)

    @property
    def __name__(self) -> str:  # TRL names the reward's metrics after it
        return self.name

    def bound(self, vocab: TagVocab | None, decode: Callable | None, min_paths: int) -> Reward:
        """This reward for one run: its tokenizer's tags and decoding, its `min_paths`."""
        return replace(self, vocab=vocab, decode=decode, min_paths=min_paths)

    def __reduce__(self):  # pickled by name (TRL's async GRPO sends rewards to a child process)
        return _registered, (self.rule.__module__, self.name, self.vocab, self.decode, self.min_paths)

    def __call__(self, prompts=None, completions=(), completion_ids=None, answer=None, **kwargs) -> list:
        n = len(completions)
        if self.needs_answer and answer is None:
            raise ValueError(f"reward '{self.name}' needs the dataset column 'answer'; it got {sorted(kwargs)}")
        answers = [None] * n if answer is None else list(answer)
        ids = [None] * n if completion_ids is None else list(completion_ids)
        if len(answers) != n or len(ids) != n:
            raise ValueError(
                f"reward '{self.name}': {n} completions but {len(answers)} answers and {len(ids)} id lists"
            )
        return [
            self.score(Completion(completion_text(c), a, i, self.vocab, self.decode, min_paths=self.min_paths))
            for c, a, i in zip(completions, answers, ids)
        ]

    def score(self, completion: Completion) -> float | None:
        try:
            return float(self.rule(completion))
        except Exception:
            logger.exception("reward %s failed on %r", self.name, completion.text[:200])
            return None


REWARDS: dict[str, Reward] = {}  # every reward, by name (`reward` adds each one)


def _registered(module: str, name: str, vocab: TagVocab | None, decode: Callable | None, min_paths: int) -> Reward:
    import_module(module)  # registers the rewards defined there (a user's own module too)
    return REWARDS[name].bound(vocab, decode, min_paths)


def reward(low: float, high: float, needs_answer: bool = True):
    """Make a `Reward` named after the rule function and register it in `REWARDS`; a name taken is refused."""

    def register(rule: Callable[[Completion], float]) -> Reward:
        if rule.__name__ in REWARDS:
            raise ValueError(f"a reward named {rule.__name__!r} is registered already: give the rule another name")
        REWARDS[rule.__name__] = Reward(rule.__name__, rule, low, high, needs_answer)
        return REWARDS[rule.__name__]

    return register


def _sign(c: Completion) -> float:
    return 1.0 if c.correct else -1.0


def _tiered(c: Completion, top: float) -> float:
    if c.correct and c.parallel:
        return top
    return 1.0 if c.correct and c.blocks == 0 else -1.0


# --------------------------------------------------------------------------- main rewards


@reward(-1.0, 1.0)
def accuracy(c: Completion) -> float:
    """+1 if c, else -1 (S1; the "alternating" schedule's common reward)."""
    return _sign(c)


@reward(-1.0, 1.2)
def tiered(c: Completion) -> float:
    """1.2 if c and P >= 1 and F; 1.0 if c and P = 0; else -1 (a correct answer with a malformed block: -1)."""
    return _tiered(c, 1.2)


@reward(-1.0, 2.0)
def tiered_emphasis(c: Completion) -> float:
    """`tiered` with 2.0 for a correct parallel answer."""
    return _tiered(c, 2.0)


@reward(-1.0, 1.2)
def tiered_diversity(c: Completion) -> float:
    """`tiered` with 1.2 - 0.2 b for a correct parallel answer."""
    return _tiered(c, 1.2 - 0.2 * c.self_bleu)


@reward(0.0, 1.0)
def accuracy_times_parallel(c: Completion) -> float:
    """1 if c and P >= 1 and F, else 0 (the GSM8K stage of the Seen recipe)."""
    return 1.0 if c.correct and c.parallel else 0.0


@reward(-1.0, 1.5)
def accuracy_plus_parallel(c: Completion) -> float:
    """±1 + 0.5 [P >= 1 and F]."""
    return _sign(c) + (0.5 if c.parallel else 0.0)


@reward(-1.0, math.inf)
def accuracy_plus_sqrt_blocks(c: Completion) -> float:
    """±1 + sqrt(P), P counting every block opened, well-formed or not (as the official code)."""
    return _sign(c) + math.sqrt(c.blocks)


@reward(-1.3, 1.0)
def accuracy_diversity(c: Completion) -> float:
    """±1 - 0.3 b (b = 1 without a block, so a sequential answer gets ±1 - 0.3)."""
    return _sign(c) - 0.3 * c.self_bleu


@reward(-1.3, 2.0)
def accuracy_parallel_diversity(c: Completion) -> float:
    """±1 + [P >= 1] - 0.3 b (the block need not be well-formed, as the official code)."""
    return _sign(c) + (1.0 if c.blocks >= 1 else 0.0) - 0.3 * c.self_bleu


# --------------------------------------------------------------------------- auxiliary and logging rewards


@reward(-math.inf, 0.0, needs_answer=False)
def path_cost(c: Completion) -> float:
    """-0.1 for each path of a block beyond the run's min_paths (those the model chose to add): a price on width, for
    runs where the model chooses it (min_paths < max_paths); summed with `accuracy`, an added path pays when it turns
    a wrong answer right 1 time in 20."""
    return -0.1 * sum(max(len(block.paths) - c.min_paths, 0) for block in c.parsed.blocks)


@reward(0.0, 0.5, needs_answer=False)
def parallel_bonus(c: Completion) -> float:
    """0.5 [P >= 1 and F]: with `accuracy`, summed, it is `accuracy_plus_parallel`; see the advantage split."""
    return 0.5 if c.parallel else 0.0


@reward(0.0, 1.0, needs_answer=False)
def efficiency_bonus(c: Completion) -> float:
    """g = max((T - V) / T, 0) for a parallel completion (P >= 1 and F), else 0; always below 1."""
    return c.efficiency


@reward(0.0, 1.0, needs_answer=False)
def well_formed(c: Completion) -> float:
    """1 if F (a completion without blocks is well-formed), else 0. For logging (weight 0)."""
    return 1.0 if c.well_formed else 0.0


@reward(0.0, 1.0, needs_answer=False)
def parallel(c: Completion) -> float:
    """1 if P >= 1 and F, else 0: its mean is the parallel ratio. For logging (weight 0)."""
    return 1.0 if c.parallel else 0.0
