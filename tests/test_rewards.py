"""Every reward variant against docs/paper.md, the rewards, on hand-written completions; the registry; never raising."""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import TrainerState
from trl.trainer.utils import get_callable_name

from parallel_r1 import rewards
from parallel_r1.rewards import REWARDS, Reward, get_reward_funcs, variants
from parallel_r1.rewards.diversity import MAX_PATH_CHARS, block_self_bleu
from parallel_r1.tags.language import TAGS, canonical_block
from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.tiny_grpo import tiny_grpo_config

GOLD = "18"
SAME = "add the two numbers together"  # two equal paths: self-BLEU 1
OTHER = ("count the apples first", "subtract pears later on")  # no shared word: self-BLEU 0


def completion(shape: str, correct: bool) -> str:
    answer = "Final Answer: " + (GOLD if correct else "17")
    blocks = {
        "none": "Six and twelve make eighteen. ",
        "block": "Two ways. " + canonical_block([SAME, SAME], "both give 18") + " ",
        "diverse": "Two ways. " + canonical_block(list(OTHER), "both give 18") + " ",
        "two_blocks": canonical_block([SAME, SAME], "a") + canonical_block([SAME, SAME], "b"),
        "wide": canonical_block([SAME] * 4, "a") + canonical_block([SAME] * 3, "b"),  # 2 + 1 paths beyond two
        "one_path": "<Parallel><Path>add</Path></Parallel>\n<Summary>18</Summary> ",  # malformed: too few paths
        "no_summary": "<Parallel><Path>a</Path><Path>b</Path></Parallel> ",  # malformed: no summary
    }
    return blocks[shape] + answer


def score(name: str, shape: str, correct: bool) -> float:
    return REWARDS[name](prompts=["q"], completions=[completion(shape, correct)], answer=[GOLD])[0]


# (correct, shape) -> value, for every variant; b is 1 for "block", 0 for "diverse", 1 without a closed block
C, W = True, False
TABLE = {
    "accuracy": {(C, s): 1.0 for s in ("none", "block", "one_path")} | {(W, s): -1.0 for s in ("none", "block")},
    "tiered": {(C, "none"): 1.0, (C, "block"): 1.2, (C, "one_path"): -1.0, (C, "no_summary"): -1.0,
               (W, "none"): -1.0, (W, "block"): -1.0, (W, "one_path"): -1.0},
    "tiered_emphasis": {(C, "none"): 1.0, (C, "block"): 2.0, (C, "one_path"): -1.0, (W, "block"): -1.0},
    "tiered_diversity": {(C, "none"): 1.0, (C, "block"): 1.0, (C, "diverse"): 1.2, (C, "one_path"): -1.0,
                         (W, "diverse"): -1.0},
    "accuracy_times_parallel": {(C, "none"): 0.0, (C, "block"): 1.0, (C, "one_path"): 0.0, (C, "no_summary"): 0.0,
                                (W, "block"): 0.0, (W, "none"): 0.0},
    "accuracy_plus_parallel": {(C, "none"): 1.0, (C, "block"): 1.5, (C, "one_path"): 1.0,
                               (W, "none"): -1.0, (W, "block"): -0.5, (W, "one_path"): -1.0},
    "accuracy_plus_sqrt_blocks": {(C, "none"): 1.0, (C, "block"): 2.0, (C, "two_blocks"): 1.0 + math.sqrt(2),
                                  (C, "one_path"): 2.0, (W, "none"): -1.0, (W, "block"): 0.0},
    "accuracy_diversity": {(C, "none"): 0.7, (C, "block"): 0.7, (C, "diverse"): 1.0, (C, "one_path"): 0.7,
                           (W, "none"): -1.3, (W, "diverse"): -1.0},
    "accuracy_parallel_diversity": {(C, "none"): 0.7, (C, "block"): 1.7, (C, "diverse"): 2.0, (C, "one_path"): 1.7,
                                    (W, "none"): -1.3, (W, "diverse"): 0.0},
    "parallel_bonus": {(C, "none"): 0.0, (C, "block"): 0.5, (W, "block"): 0.5, (C, "one_path"): 0.0},
    "well_formed": {(C, "none"): 1.0, (C, "block"): 1.0, (W, "two_blocks"): 1.0, (C, "one_path"): 0.0,
                    (C, "no_summary"): 0.0},
    "parallel": {(C, "none"): 0.0, (C, "block"): 1.0, (W, "block"): 1.0, (C, "one_path"): 0.0},
    "path_cost": {(C, "none"): 0.0, (C, "block"): 0.0, (W, "two_blocks"): 0.0, (C, "wide"): -0.3, (W, "wide"): -0.3},
}  # fmt: skip
CASES = [(name, correct, shape, value) for name, table in TABLE.items() for (correct, shape), value in table.items()]


@pytest.mark.parametrize("name, correct, shape, expected", CASES)
def test_variant_table(name, correct, shape, expected):
    assert score(name, shape, correct) == pytest.approx(expected, abs=1e-9)


def test_every_registered_reward_is_tested_or_has_its_own_test():
    assert set(REWARDS) == set(TABLE) | {"efficiency_bonus"}


def test_path_cost_charges_the_paths_past_the_runs_min_paths(tmp_path):
    """Built for a run (its config, whole), `path_cost` charges 0.1 for each path past the run's `min_paths`: the
    paths every block gets are free."""
    run = tiny_grpo_config(tmp_path, min_paths=3, max_paths=4)
    (cost,) = get_reward_funcs(["path_cost"], args=run)
    three = canonical_block([SAME] * 3, "a") + " Final Answer: 18"
    assert cost(completions=[three, completion("wide", True)]) == pytest.approx([0.0, -0.1])  # blocks of 4 and 3


def test_self_bleu_of_the_test_paths():
    assert block_self_bleu([SAME, SAME]) == 1.0
    assert block_self_bleu(list(OTHER)) == 0.0
    assert block_self_bleu([SAME]) == 1.0
    long = "word " * (MAX_PATH_CHARS // 5)
    assert block_self_bleu([long + "tail one", long + "tail two"]) == 1.0  # compared within the bound only


# --------------------------------------------------------------------------- efficiency


def test_efficiency_in_characters():
    text = completion("block", True)
    path = f"<Path>{SAME}</Path>"  # two equal paths: the critical path skips one of them
    assert REWARDS["efficiency_bonus"](completions=[text])[0] == pytest.approx(len(path) / len(text))
    for shape in ("none", "one_path", "no_summary"):
        assert REWARDS["efficiency_bonus"](completions=[completion(shape, True)])[0] == 0.0


def test_efficiency_in_tokens(tiny_tokenizer):
    vocab = tag_vocab(tiny_tokenizer)
    (reward,) = get_reward_funcs(["efficiency_bonus"], tokenizer=tiny_tokenizer)
    tag = vocab.ids
    short, long = tiny_tokenizer.encode("one way"), tiny_tokenizer.encode("another longer way round")
    ids = (
        tiny_tokenizer.encode("Think. ")
        + [tag["<Parallel>"], tag["<Path>"], *short, tag["</Path>"], tag["<Path>"], *long, tag["</Path>"]]
        + [tag["</Parallel>"], tag["<Summary>"], *tiny_tokenizer.encode("ok"), tag["</Summary>"]]
        + tiny_tokenizer.encode(" Final Answer: 18")
    )
    text = tiny_tokenizer.decode(ids)
    assert reward(completions=[text], completion_ids=[ids])[0] == pytest.approx((len(short) + 2) / len(ids))
    (in_chars,) = get_reward_funcs(["efficiency_bonus"])
    assert in_chars(completions=[text], completion_ids=[ids])[0] != reward(completions=[text], completion_ids=[ids])[0]


# --------------------------------------------------------------------------- TRL's inputs


def test_chat_completions_score_like_text():
    texts = [completion(shape, ok) for shape in ("none", "block", "one_path") for ok in (True, False)]
    chats = [[{"role": "assistant", "content": t}] for t in texts]
    for name, reward in REWARDS.items():
        kwargs = {"answer": [GOLD] * len(texts), "trainer_state": None, "log_metric": print, "log_extra": print}
        assert reward(prompts=["q"] * 6, completions=chats, **kwargs) == reward(completions=texts, **kwargs), name


def test_bad_calls_name_the_problem():
    with pytest.raises(ValueError, match="'answer'"):
        REWARDS["accuracy"](prompts=["q"], completions=["Final Answer: 1"], solution=["1"])
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        REWARDS["tiered"](completions=["a", "b"], answer=["1"])
    assert REWARDS["accuracy"](prompts=[], completions=[], answer=[]) == []
    assert REWARDS["parallel"](completions=[completion("block", True)]) == [1.0]  # needs no answer


@pytest.mark.parametrize(
    "name, cut, empty",
    [
        ("accuracy", -1.0, -1.0),
        ("tiered", -1.0, -1.0),
        ("accuracy_times_parallel", 0.0, 0.0),
        ("well_formed", 0.0, 1.0),
    ],
)
def test_truncated_and_empty_outputs(name, cut, empty):
    truncated = completion("block", True)[:40]  # stops inside the first path: no answer, unclosed block
    assert REWARDS[name](completions=[truncated, ""], answer=[GOLD, GOLD]) == [cut, empty]


# --------------------------------------------------------------------------- registry


def test_every_reward_registers_itself_and_is_importable_by_its_name():
    """Each `Reward` defined in `variants` is in `REWARDS`, and is `parallel_r1.rewards.<name>`, listed in `__all__`."""
    defined = {name for name, value in vars(variants).items() if isinstance(value, Reward)}
    assert defined == set(REWARDS)
    assert all(getattr(rewards, name, None) is REWARDS[name] for name in REWARDS)
    assert set(REWARDS) <= set(rewards.__all__)


def test_registry_names_are_trl_names():
    funcs = get_reward_funcs(list(REWARDS))
    assert [get_callable_name(f) for f in funcs] == list(REWARDS)
    custom = lambda completions, **kwargs: [0.0] * len(completions)  # noqa: E731
    assert get_reward_funcs([custom]) == [custom]


def test_rewards_and_schedules_survive_pickling(tiny_tokenizer, tmp_path):
    """TRL's async GRPO sends reward functions to a child process."""
    specs = [*REWARDS, "switch(alternating(accuracy, tiered, window=10, a_steps=8), accuracy, at_step=200)"]
    run = tiny_grpo_config(tmp_path, num_iterations=2, min_paths=3, max_paths=4)
    funcs = get_reward_funcs(specs, tokenizer=tiny_tokenizer, args=run)
    copies = pickle.loads(pickle.dumps(funcs))
    assert [get_callable_name(f) for f in copies] == [get_callable_name(f) for f in funcs]
    texts = [completion(shape, ok) for shape in ("none", "block", "diverse") for ok in (True, False)]
    state = TrainerState()
    state.global_step = 16  # step 9 of the schedule: tiered
    kwargs = {"completions": texts, "answer": [GOLD] * len(texts), "trainer_state": state}
    for original, copy in zip(funcs, copies):
        assert copy(**kwargs) == original(**kwargs)
    assert copies[-1].steps_per_batch == 2 and copies[0].vocab == tag_vocab(tiny_tokenizer)
    assert all(copy.min_paths == 3 for copy in copies[:-1])


@pytest.mark.parametrize(
    "spec, message",
    [
        ("accuracyy", "unknown reward 'accuracyy'.*known rewards: accuracy, tiered"),
        ("__import__('os').system('true')", "expected a reward name or a call"),
        ("accuracy + tiered", "expected a reward name or a call"),
        ("eval('accuracy')", "expected a reward name or a call"),
        ("alternating(accuracy)", "takes two rewards"),
        ("alternating(accuracy, tiered, window=x)", "name=integer"),
        ("alternating(accuracy, tiered, window=0)", "window must be an integer >= 1"),
        ("alternating(accuracy, tiered, window=10, a_steps=11)", "a_steps must be an integer 0..10"),
        ("alternating(accuracy, tiered, window=2.5)", "window must be an integer"),
        ("alternating(accuracy, tiered, size=3)", "bad options for alternating"),
        ("switch(accuracy, tiered)", "bad options for switch"),
        ("switch(accuracy, tiered, at_step=-1)", "at_step must be an integer >= 0"),
        ("switch(accuracy, nope, at_step=3)", "unknown reward 'nope'"),
        ("alternating(accuracy, tiered", "does not parse"),
        (5, "must be a name or a schedule call"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        get_reward_funcs([spec])


# --------------------------------------------------------------------------- never raises, stays in range

PIECES = st.sampled_from(
    [*TAGS, "\n", " ", "Final Answer: 18", "Final Answer: 17", "\\boxed{18}", "\\boxed{", "}", "9^{9^{9}}",
     "\\frac{1}{0}", "$", "path text", "add the two numbers", "é", "\x00"]
)  # fmt: skip
COMPLETIONS = st.one_of(st.text(max_size=200), st.lists(PIECES, max_size=30).map("".join))


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(COMPLETIONS, min_size=1, max_size=4),
    gold=st.sampled_from(["18", "#### 1,800", "\\frac12", "", "x"]),
)
def test_arbitrary_completions_get_values_in_range(texts, gold):
    for name, reward in REWARDS.items():
        values = reward(prompts=["q"] * len(texts), completions=texts, answer=[gold] * len(texts))
        assert len(values) == len(texts)
        for value in values:
            assert isinstance(value, float) and reward.low <= value <= reward.high, (name, value)
            assert name != "efficiency_bonus" or value < 1.0


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_arbitrary_token_ids_give_an_efficiency_in_range(tiny_tokenizer, data):
    (reward,) = get_reward_funcs(["efficiency_bonus"], tokenizer=tiny_tokenizer)
    ids = data.draw(st.lists(st.integers(0, len(tiny_tokenizer) - 1), max_size=60))
    text = tiny_tokenizer.decode(ids)
    (value,) = reward(completions=[text], completion_ids=[ids])
    assert 0.0 <= value < 1.0


def test_giant_output_gets_a_value():
    giant = ("<Parallel><Path>" + "word " * 20_000 + "</Path>") * 3 + "\\boxed{" * 5_000 + "Final Answer: 18"
    for name, reward in REWARDS.items():
        (value,) = reward(completions=[giant], answer=[GOLD])
        assert reward.low <= value <= reward.high, name
