"""Rewards for Parallel-R1: every variant of the paper, as TRL reward functions chosen by name.

- `variants`: the rewards (docs/paper.md, the rewards), `Reward`, the wrapper that gives a rule TRL's signature, and
  `REWARDS`, where each reward registers itself; every one is importable from here by its name.
- `schedules`: `alternating` and `switch`, which pick a reward by the step in `trainer_state`.
- `registry`: `get_reward_funcs(specs)`, from the names and schedule calls recipes write.
- `completion`, `diversity`: what the rules read (answer correct, blocks, well-formed, self-BLEU, efficiency).

Rewards read the completion with its tags (TRL decodes with `skip_special_tokens=True`, and the tags are
added as non-special tokens, so they survive) and take the reference from the dataset's `answer` column.

Advantage split (off by default). An auxiliary reward can be given its own group normalisation by listing
it as a separate reward function and setting TRL's `GRPOConfig.multi_objective_aggregation` to
`"normalize_then_sum"`: TRL then centres and scales each reward within its group before the weighted sum,
so the auxiliary term moves the advantage by the same amount whether the answers in the group are all
correct or mixed. With the default `"sum_then_normalize"` the rewards are summed first, and
`[accuracy, parallel_bonus]` with weights `[1, 1]` is exactly `accuracy_plus_parallel`; there the bonus is
divided by the group's total spread, which correct/wrong answers dominate. `tests/test_reward_split.py`
checks both through TRL's own code.
"""

from .registry import SCHEDULES, get_reward_funcs
from .schedules import Schedule, alternating, paper_step, switch
from .variants import REWARDS, Reward

globals().update(REWARDS)  # each reward under its name: `from parallel_r1.rewards import accuracy`

__all__ = [
    "REWARDS",
    "SCHEDULES",
    "Reward",
    "Schedule",
    "alternating",
    "get_reward_funcs",
    "paper_step",
    "switch",
    *REWARDS,
]
