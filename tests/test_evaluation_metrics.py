"""Evaluation metrics against their definitions: pass@k by enumeration, mean@k, cons@k, standard errors, shape."""

import math
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_r1.evaluation.metrics import (
    benchmark_metrics,
    consensus_at_k,
    latency_summary,
    majority_correct,
    paired_difference,
    pass_at_k,
    standard_error,
    summarize,
)
from parallel_r1.evaluation.report import difference_table, markdown_table


def brute_force_pass_at_k(outcomes: list, k: int) -> float:
    """The share of k-subsets of the samples that hold at least one correct sample."""
    subsets = list(combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(case):
    n, c, k = case
    outcomes = [True] * c + [False] * (n - c)
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(16, 0, 16) == 0.0 and pass_at_k(16, 16, 1) == 1.0
    assert pass_at_k(16, 1, 16) == 1.0  # k = n: solved if any sample is
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    for bad in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ValueError, match="pass@k"):
            pass_at_k(*bad)


def test_majority_vote():
    assert majority_correct(["4", "5", "4.", None], [True, False, True, False])  # "4." normalises to "4"
    assert not majority_correct(["5", "5", "4"], [False, False, True])
    assert majority_correct(["4", "5"], [True, False])  # a tie goes to the answer given first
    assert not majority_correct(["5", "4"], [False, True])
    assert not majority_correct([None, None], [False, False])


def voted(problem: int, answers: list, reference: str, critical: list) -> list:
    """Records of one problem: its samples' answers (in sample order), judged against `reference`."""
    return [
        {"problem_index": problem, "sample": i, "answer": a, "correct": a == reference, "tokens_critical": c}
        for i, (a, c) in enumerate(zip(answers, critical))
    ]


def test_cons_at_k_is_the_mean_vote_of_every_k_subset_and_times_the_longest_sample():
    rows = voted(0, ["7", "8", "7", "9"], "7", [10, 20, 30, 40])  # subsets: 7 8 7, 7 8 9 (tie: first), 7 7 9, 8 7 9
    three = consensus_at_k(rows, 3)
    assert three["accuracy"] == pytest.approx(0.75) and three["per_problem"] == {0: 0.75}
    assert three["latency_mean"] == pytest.approx((30 + 40 + 40 + 40) / 4) and three["latency_p90"] == 40
    both = consensus_at_k(rows + voted(1, ["2", "2", "3", None], "3", [5, 5, 5, 5]), 3)
    assert both["per_problem"] == {0: 0.75, 1: 0.0} and both["stderr"] == pytest.approx(standard_error([0.75, 0.0]))
    with pytest.raises(ValueError, match="cons@k needs 1 <= k <= n"):
        consensus_at_k(rows, 5)
    assert latency_summary(list(range(1, 11))) == {"latency_mean": 5.5, "latency_p90": 9}  # nearest rank


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["1", "2", "3", None]), min_size=4, max_size=6), min_size=1, max_size=4))
def test_cons_at_k_reads_as_mean_at_1_at_k_1_and_as_cons_at_n_at_k_n(problems):
    n = min(len(answers) for answers in problems)
    rows = [
        record(i, j, a == "2", a, critical=1) for i, answers in enumerate(problems) for j, a in enumerate(answers[:n])
    ]
    metrics = benchmark_metrics(rows)
    assert consensus_at_k(rows, 1)["accuracy"] == pytest.approx(metrics[f"mean@{n}"])
    assert consensus_at_k(rows, n)["accuracy"] == pytest.approx(metrics[f"cons@{n}"])
    assert consensus_at_k(rows, n)["latency_mean"] == 1


def test_standard_error():
    assert standard_error([1.0]) == 0.0
    assert standard_error([0.0, 1.0]) == pytest.approx(math.sqrt(0.5 / 2))


def record(problem, sample, correct, answer="1", blocks=(), total=10, critical=10, well_formed=True, benchmark="b"):
    return {
        "benchmark": benchmark,
        "problem_index": problem,
        "sample": sample,
        "correct": correct,
        "answer": answer,
        "well_formed": well_formed,
        "has_parallel": bool(blocks) and well_formed,
        "blocks": len(blocks),
        "paths_per_block": [paths for paths, _ in blocks],
        "block_positions": [position for _, position in blocks],
        "tokens_total": total,
        "tokens_critical": critical,
    }


def test_benchmark_metrics_on_fixed_records():
    rows = [
        record(0, 0, True, "7", blocks=[(2, 0.25)], total=20, critical=14),
        record(0, 1, False, "8"),
        record(0, 2, True, "7", blocks=[(2, 0.5), (3, 0.75)], total=40, critical=20),
        record(0, 3, False, None, well_formed=False, blocks=[(1, 0.0)]),
        record(1, 0, False, "2"),
        record(1, 1, False, "2"),
        record(1, 2, False, "3"),
        record(1, 3, False, None),
    ]
    m = benchmark_metrics(rows)
    assert (m["problems"], m["samples"]) == (2, 4)
    assert m["mean@4"] == pytest.approx((2 / 4 + 0) / 2)
    assert m["mean@4_stderr"] == pytest.approx(standard_error([0.5, 0.0]))
    assert m["pass@1"] == pytest.approx(m["mean@4"])  # pass@1 is the mean accuracy
    assert m["pass@4"] == pytest.approx(0.5) and m["pass@2"] == pytest.approx((1 - 1 / 6) / 2)
    assert m["cons@4"] == pytest.approx(0.5)
    assert m["parallel_ratio"] == pytest.approx(2 / 8) and m["format_valid"] == pytest.approx(7 / 8)
    assert m["blocks_per_completion"] == pytest.approx(4 / 8) and m["paths_per_block"] == pytest.approx(8 / 4)
    assert (m["paths_per_block_min"], m["paths_per_block_max"]) == (1, 3)
    assert m["openings_alike"] == 0.0  # records without the count (before it existed) read as none
    assert m["block_position"] == pytest.approx((0.25 + 0.5 + 0.75 + 0.0) / 4)
    total, critical = 20 + 40 + 6 * 10, 14 + 20 + 6 * 10
    assert m["tokens_total"] == pytest.approx(total / 8) and m["critical_over_total"] == pytest.approx(
        critical / total
    )


def test_uneven_samples_and_empty_input_are_refused():
    with pytest.raises(ValueError, match="same number of samples"):
        benchmark_metrics([record(0, 0, True), record(0, 1, True), record(1, 0, True)])
    with pytest.raises(ValueError, match="no completions"):
        benchmark_metrics([])


def test_summary_and_table():
    rows = [record(i, s, s == 0, benchmark="aime24") for i in range(2) for s in range(4)]
    rows += [record(i, 0, i == 0, benchmark="math500", blocks=[(2, 0.5)]) for i in range(4)]
    summary = summarize(rows)
    assert list(summary["benchmarks"]) == ["aime24", "math500"]
    assert summary["average"]["mean"] == pytest.approx((0.25 + 0.25) / 2)
    assert summary["average"]["parallel_ratio"] == pytest.approx((0 + 1) / 2)
    table = markdown_table([{"label": "tiny", **summary}])
    assert "| tiny | 50.0 | 25.0 ± 0.0 / 100.0 ± 0.0 | 25.0 ± 25.0 | 25.0 |" in table  # mean@4 / pass@4, mean@1
    assert "aime24 (mean@4 / pass@4)" in table and "math500 (mean@1)" in table
    local = markdown_table(
        [{"label": "tiny", **summarize([{**r, "benchmark": "/data/x/test.jsonl"} for r in rows[:8]])}]
    )
    assert "| test.jsonl (mean@4 / pass@4) |" in local and "| tiny | test.jsonl |" in local  # a file by its name


def test_parallel_ratio_and_critical_path_of_hand_written_completions(tiny_tokenizer):
    """Scored from their token ids as the harness scores them: one parallel completion, one plain, one malformed."""
    from parallel_r1.evaluation.records import score
    from parallel_r1.policy import ParallelPolicy
    from parallel_r1.rollout import Rollout, RolloutArguments

    policy = ParallelPolicy(tiny_tokenizer, RolloutArguments())
    tag = policy.vocab.ids
    encode = lambda text: tiny_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    short, long, summary = encode(" two"), encode(" three and four"), encode(" ok")
    parallel = encode("Think.") + [tag["<Parallel>"], tag["<Path>"], *short, tag["</Path>"], tag["<Path>"], *long]
    parallel += [tag["</Path>"], tag["</Parallel>"], *encode("\n"), tag["<Summary>"], *summary, tag["</Summary>"]]
    parallel += encode(" Final Answer: 7")
    plain = encode("Just add. Final Answer: 7")
    broken = encode("Hmm") + [tag["<Parallel>"], tag["<Path>"], *short, tag["</Path>"]]
    problem = {"benchmark": "b", "problem_index": 0, "problem_id": "0", "prompt": "p", "reference": "7"}
    rollouts = [Rollout([], ids, finish="eos") for ids in (parallel, plain, broken)]
    rows = [score(problem, s, rollout, policy) for s, rollout in enumerate(rollouts)]
    assert [r["has_parallel"] for r in rows] == [True, False, False]
    assert [r["well_formed"] for r in rows] == [True, True, False] and [r["correct"] for r in rows] == [
        True,
        True,
        False,
    ]
    m = benchmark_metrics(rows)
    assert m["parallel_ratio"] == pytest.approx(1 / 3) and m["format_valid"] == pytest.approx(2 / 3)
    saved = len(short) + 2  # the shorter path, its tags included, is off the critical path
    total = len(parallel) + len(plain) + len(broken)
    assert rows[0]["tokens_critical"] == len(parallel) - saved
    assert rows[2]["tokens_critical"] == len(broken)  # one path: nothing runs beside it
    assert m["critical_over_total"] == pytest.approx((total - saved) / total)
    assert m["block_position"] == pytest.approx(
        (len(encode("Think.")) / len(parallel) + len(encode("Hmm")) / len(broken)) / 2
    )


def test_paired_difference_weighs_the_gap_by_its_own_spread_over_problems():
    # Problem 0 is easy for both models, problem 1 hard for both; the first model is one sample in two better on
    # each. The gap is the same on every problem, so its paired error is 0, where the unpaired one is not.
    ours = [record(0, 0, True), record(0, 1, True), record(1, 0, True), record(1, 1, False)]
    theirs = [record(0, 0, True), record(0, 1, False), record(1, 0, False), record(1, 1, False)]
    assert paired_difference(ours, theirs) == (pytest.approx(0.5), 0.0)
    assert paired_difference(theirs, ours)[0] == pytest.approx(-0.5)
    ours[3]["correct"] = True  # now the gaps are 0.5 and 1.0
    assert paired_difference(ours, theirs) == (pytest.approx(0.75), pytest.approx(standard_error([0.5, 1.0])))


def test_paired_difference_needs_the_same_problems():
    with pytest.raises(ValueError, match="1 only in the first, 0 only in the baseline"):
        paired_difference([record(0, 0, True), record(1, 0, True)], [record(0, 0, True)])
    with pytest.raises(ValueError, match="same problems"):  # the same index in another benchmark is another problem
        paired_difference([record(0, 0, True, benchmark="a")], [record(0, 0, True, benchmark="b")])


def test_difference_table_against_a_baseline_per_benchmark():
    def model(label, right):  # `right`: (benchmark, problem) -> how many of its 2 samples are correct
        rows = [record(p, s, s < n, benchmark=b) for (b, p), n in right.items() for s in range(2)]
        return {"label": label, **summarize(rows)}, rows

    plain = model("plain", {("x", 0): 1, ("x", 1): 0, ("y", 0): 2})
    ours = model("ours", {("x", 0): 2, ("x", 1): 2, ("y", 0): 2})
    table = difference_table([plain, ours], baseline="plain")
    gap_x = standard_error([0.5, 1.0])
    assert f"| ours | +75.0 ± {100 * gap_x:.1f} ({0.75 / gap_x:+.1f} SE) | +0.0 |" in table  # y: no spread, no error
    assert "| plain |" not in table and "x: mean minus plain's (points)" in table
    with pytest.raises(ValueError, match="the baseline 'grpo' is not among the evaluations"):
        difference_table([plain, ours], baseline="grpo")
