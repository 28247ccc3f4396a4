"""The advantage split, through TRL's own scoring code (`GRPOTrainer._generate_and_score_completions`).

Fixed completions are fed in with a `rollout_func`, so the advantages are TRL's, computed from our rewards.
Three groups of four: every answer correct, mixed, every answer wrong; in each, completions 0 and 2 have a
well-formed block and 1 and 3 do not. The "parallel gap" of a group is advantage(0) - advantage(1): two
completions with the same correctness that differ only by the block.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from parallel_r1.rewards import accuracy, accuracy_plus_parallel, accuracy_times_parallel, parallel_bonus
from parallel_r1.tags.language import canonical_block

ROW = {"prompt": "What is 6 + 12?", "answer": "18"}


def text(correct: bool, block: bool) -> str:
    body = canonical_block(["six plus twelve", "twelve plus six"], "18") if block else "Six plus twelve."
    return f"{body} Final Answer: {18 if correct else 17}"


GROUPS = {  # (correct, block) of each completion
    "all_correct": [(True, True), (True, False), (True, True), (True, False)],
    "mixed": [(True, True), (True, False), (False, True), (False, False)],
    "all_wrong": [(False, True), (False, False), (False, True), (False, False)],
}
COMPLETIONS = [text(*shape) for group in GROUPS.values() for shape in group]


@pytest.fixture
def advantages(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    """TRL's advantages for COMPLETIONS, by group, for some reward functions and an aggregation."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")

    def rollout(prompts, trainer):
        ids = [tiny_tokenizer.encode(c) for c in COMPLETIONS]
        prompt_ids = [tiny_tokenizer.encode(p) for p in prompts]
        return {"prompt_ids": prompt_ids, "completion_ids": ids, "logprobs": [[0.0] * len(i) for i in ids]}

    def run(reward_funcs, aggregation) -> dict[str, torch.Tensor]:
        args = GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=len(COMPLETIONS),
            num_generations=4,
            multi_objective_aggregation=aggregation,
            use_cpu=True,
            report_to=[],
        )
        trainer = GRPOTrainer(
            model=tiny_model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=Dataset.from_list([ROW]),
            processing_class=tiny_tokenizer,
            rollout_func=rollout,
        )
        output = trainer._generate_and_score_completions([ROW] * len(COMPLETIONS))
        return dict(zip(GROUPS, output["advantages"].view(len(GROUPS), 4)))

    return run


def gap(group: torch.Tensor) -> float:
    return (group[0] - group[1]).item()


def test_split_keeps_the_bonus_at_one_scale_in_every_group(advantages):
    summed = advantages([accuracy, parallel_bonus], "sum_then_normalize")
    split = advantages([accuracy, parallel_bonus], "normalize_then_sum")
    official = advantages([accuracy_plus_parallel], "sum_then_normalize")

    # Summed first, the two functions are the official `accuracy + 0.5 [block]` reward.
    for name in GROUPS:
        torch.testing.assert_close(summed[name], official[name])
    # Summed first, the bonus survives a group where every answer is correct, but where answers differ
    # the group's spread is mostly correctness, and the bonus's share of the advantage shrinks.
    assert gap(summed["all_correct"]) > 1.0
    assert 0 < gap(summed["mixed"]) < gap(summed["all_correct"]) / 2
    # Normalised apart, the bonus moves the advantage by the same amount in every group.
    assert gap(split["all_correct"]) > 1.0
    assert gap(split["mixed"]) == pytest.approx(gap(split["all_correct"]), rel=1e-3)
    assert gap(split["all_wrong"]) == pytest.approx(gap(split["all_correct"]), rel=1e-3)


def test_a_gated_reward_loses_the_block_signal_when_every_answer_is_wrong(advantages):
    gated = advantages([accuracy_times_parallel], "sum_then_normalize")  # the GSM8K-stage reward
    assert gap(gated["all_correct"]) > 1.0
    torch.testing.assert_close(gated["all_wrong"], torch.zeros(4))
