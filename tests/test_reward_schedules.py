"""Schedules: which reward is used at each step, from the trainer state alone (so also after a resume)."""

from __future__ import annotations

import pytest
from transformers import TrainerState

from parallel_r1.rewards import REWARDS, alternating, get_reward_funcs, paper_step, switch
from parallel_r1.testing.tiny_grpo import tiny_grpo_config

# One completion that every reward of these schedules scores differently: correct, with a well-formed block.
PARALLEL = "<Parallel><Path>a</Path><Path>b</Path></Parallel>\n<Summary>c</Summary>Final Answer: 18"
VALUE = {"accuracy": 1.0, "tiered": 1.2, "tiered_emphasis": 2.0}
S2 = "alternating(accuracy, tiered, window=10, a_steps=8)"


def state_at(step: int, steps_per_batch: int = 1) -> TrainerState:
    """The trainer state when the rewards of the paper's step `step` are computed."""
    state = TrainerState()
    state.global_step = (step - 1) * steps_per_batch
    return state


def call(reward, state: TrainerState, metrics: list | None = None) -> float:
    log_metric = (lambda name, value: metrics.append((name, value))) if metrics is not None else None
    (value,) = reward(prompts=["q"], completions=[PARALLEL], answer=["18"], trainer_state=state, log_metric=log_metric)
    return value


def test_paper_step():
    assert [paper_step(state_at(s)) for s in (1, 2, 30)] == [1, 2, 30]
    assert [paper_step(state_at(s, 2), steps_per_batch=2) for s in (1, 2, 30)] == [1, 2, 30]


def test_s2_over_steps_1_to_30():
    (schedule,) = get_reward_funcs([S2])
    tiered_steps = {9, 10, 19, 20, 29, 30}  # (s - 1) mod 10 >= 8
    expected = ["tiered" if s in tiered_steps else "accuracy" for s in range(1, 31)]
    assert [schedule.active(s) for s in range(1, 31)] == expected
    metrics = []
    assert [call(schedule, state_at(s), metrics) for s in range(1, 31)] == [VALUE[n] for n in expected]
    assert metrics == [(f"schedule/{schedule.__name__}/uses_b", float(n == "tiered")) for n in expected]
    assert schedule.__name__ == "alternating(accuracy,tiered,window=10,a_steps=8)"


def test_other_windows():
    acc, tiered = REWARDS["accuracy"], REWARDS["tiered"]
    assert [alternating(acc, tiered, window=4, a_steps=1).active(s) for s in range(1, 9)] == (
        ["accuracy", "tiered", "tiered", "tiered"] * 2
    )
    assert {alternating(acc, tiered, window=5, a_steps=0).active(s) for s in range(1, 30)} == {"tiered"}
    assert {alternating(acc, tiered, window=5, a_steps=5).active(s) for s in range(1, 30)} == {"accuracy"}


def test_switch_after_a_nested_schedule():
    (scaffold,) = get_reward_funcs([f"switch({S2}, tiered_emphasis, at_step=20)"])
    expected = [
        ("tiered" if (s - 1) % 10 >= 8 else "accuracy") if s <= 20 else "tiered_emphasis" for s in range(1, 31)
    ]
    assert [scaffold.active(s) for s in range(1, 31)] == expected
    assert [call(scaffold, state_at(s)) for s in range(1, 31)] == [VALUE[n] for n in expected]
    metrics = []
    call(scaffold, state_at(9), metrics)  # both levels log: the switch uses a, the alternation uses b
    assert metrics == [(f"schedule/{scaffold.__name__}/uses_b", 0.0), (f"schedule/{scaffold.a.__name__}/uses_b", 1.0)]


def test_resume_from_a_checkpoint_gives_the_same_rewards(tmp_path):
    """A run interrupted after step 14 and resumed from its saved trainer state continues the schedule."""
    spec = f"switch({S2}, accuracy, at_step=22)"
    (uninterrupted,) = get_reward_funcs([spec])
    state = TrainerState()
    straight = []
    for _ in range(30):
        straight.append(call(uninterrupted, state))
        state.global_step += 1

    (first,) = get_reward_funcs([spec])
    state = TrainerState()
    resumed = []
    for _ in range(14):
        resumed.append(call(first, state))
        state.global_step += 1
    state.save_to_json(tmp_path / "trainer_state.json")

    (second,) = get_reward_funcs([spec])  # a new process: nothing carried over but the checkpoint
    state = TrainerState.load_from_json(tmp_path / "trainer_state.json")
    while state.global_step < 30:
        resumed.append(call(second, state))
        state.global_step += 1
    assert resumed == straight
    assert straight.count(1.2) == 4  # steps 9, 10, 19, 20 before the switch


def test_several_optimizer_steps_per_batch(tmp_path):
    """With 2 optimizer steps per generated batch (the run's config), rewards are computed at global steps 0, 2, ..."""
    run = tiny_grpo_config(tmp_path, num_iterations=2)
    assert run.optimizer_steps_per_generation == 2
    (schedule,) = get_reward_funcs([S2], args=run)
    values = [call(schedule, state_at(s, steps_per_batch=2)) for s in range(1, 21)]
    assert values == [1.2 if s in (9, 10, 19, 20) else 1.0 for s in range(1, 21)]


def test_missing_trainer_state_is_an_error_naming_it():
    (schedule,) = get_reward_funcs([S2])
    with pytest.raises(ValueError, match="needs trainer_state"):
        schedule(prompts=["q"], completions=[PARALLEL], answer=["18"])


def test_schedule_of_non_rewards_is_an_error():
    with pytest.raises(ValueError, match="must be a reward function"):
        switch("accuracy", REWARDS["tiered"], at_step=3)
