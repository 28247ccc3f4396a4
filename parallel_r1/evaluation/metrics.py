"""The numbers of an evaluation, computed from its completion records alone.

A record is one completion of one problem (see `records.score`): whether its final answer is correct, the
answer it gives, and its shape. For a benchmark of P problems with n samples each, c_i of problem i correct:

- mean@n: the mean over problems of c_i / n (the expected accuracy of one sample).
- pass@k, for every k <= n: the mean over problems of the unbiased estimator 1 - C(n - c_i, k) / C(n, k)
  (Chen et al. 2021, as lighteval computes it): the chance that at least one of k samples drawn without
  replacement from the n is correct. Exact, not a bootstrap.
- cons@n: majority vote. Each problem's answers (None excluded) are grouped by their `answers.normalize`
  spelling (so `1/2` and `\\frac12` are two different votes); the most frequent wins, a tie going to the answer
  given first; the problem counts as solved when that answer was judged correct. A problem without any answer
  is not solved.
- cons@k from n >= k samples (`consensus_at_k`): the mean, over every k-subset of a problem's n samples (each kept
  in sample order), of the subset's cons@k; the expected cons@k of k independent samples, with no resampling noise.
- Latency of an answer (`latency_summary`): the tokens decoded one after another to reach it. One completion counts
  its critical path D (T for a plain one); k samples decoded concurrently and voted count the longest of their D.
  Reported as the mean and the 90th percentile (nearest rank) over the answers.
- Standard errors: the sample standard deviation over problems of the per-problem value, divided by sqrt(P)
  (0 for one problem).
- The difference of two models on the same problems (`paired_difference`): the mean over problems of the
  difference of their per-problem accuracies c_i / n, and its standard error over problems. Pairing removes what
  the problems' difficulty adds to each model's own error, so it is the error to weigh a gap between two rows by.
- Shape, over all completions of the benchmark (`policy.shape_metrics`, which the training logs use too): parallel
  ratio (share with at least one block and well-formed, `language.Parsed.has_parallel`), format validity (share
  well-formed), blocks per completion, paths per block (mean, min and max over the blocks, 0 without a block), the
  share of blocks whose paths open alike (`language.opens_alike`), the paths' self-BLEU, mean relative position of
  `<Parallel>` (over all blocks, 0 = start, 1 = end), mean total tokens T, mean critical-path tokens D (of the
  paths decoded at once the longest counted, a path the model opened later counted in full: `language.stats`),
  and D/T (sum of D over sum of T).

Accuracies and ratios are fractions (0..1); tables print them as percentages.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict

from ..answers import normalize
from ..policy import shape_metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c are correct (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / j for j in range(n - c + 1, n + 1))


def majority_correct(answers: list, correct: list) -> bool:
    """cons@n for one problem: is the most frequent answer (first given wins a tie) a correct one?"""
    first = {}
    votes = Counter()
    for position, (answer, ok) in enumerate(zip(answers, correct)):
        if answer is None:
            continue
        key = normalize(answer)
        first.setdefault(key, (position, ok))
        votes[key] += 1
    if not votes:
        return False
    winner = max(votes, key=lambda key: (votes[key], -first[key][0]))
    return bool(first[winner][1])


def subset_votes(samples: list, k: int) -> tuple[list, list]:
    """For the records of one problem (in sample order): every k-subset's cons@k (1.0 or 0.0) and its latency (the
    longest `tokens_critical` in it), in `itertools.combinations` order."""
    if not 1 <= k <= len(samples):
        raise ValueError(f"cons@k needs 1 <= k <= n, got k={k} with n={len(samples)} samples")
    answers, correct = [r["answer"] for r in samples], [bool(r["correct"]) for r in samples]
    critical = [r["tokens_critical"] for r in samples]
    votes, latency = [], []
    for subset in itertools.combinations(range(len(samples)), k):
        votes.append(float(majority_correct([answers[i] for i in subset], [correct[i] for i in subset])))
        latency.append(max(critical[i] for i in subset))
    return votes, latency


def consensus_at_k(records: list, k: int) -> dict:
    """cons@k of one benchmark's records, estimated exactly from all k-subsets of each problem's samples: the mean
    and its standard error over problems, the per-problem values (problem_index -> value, to pair), and the latency
    of the subsets' answers (mean and 90th percentile of the longest critical path in a subset)."""
    per_problem, latency = {}, []
    for index, samples in sorted(_by_problem(records).items()):
        votes, longest = subset_votes(samples, k)
        per_problem[index] = _mean(votes)
        latency.extend(longest)
    values = list(per_problem.values())
    return {"accuracy": _mean(values), "stderr": standard_error(values), "per_problem": per_problem,
            **latency_summary(latency)}  # fmt: skip


def latency_summary(critical: list) -> dict:
    """Mean and 90th percentile (nearest rank) of critical-path lengths."""
    if not critical:
        raise ValueError("no answers to time")
    ordered = sorted(critical)
    return {"latency_mean": _mean(ordered), "latency_p90": ordered[math.ceil(0.9 * len(ordered)) - 1]}


def _by_problem(records: list) -> dict:
    """problem_index -> its records in sample order."""
    problems = defaultdict(list)
    for record in records:
        problems[record["problem_index"]].append(record)
    return {index: sorted(samples, key=lambda r: r["sample"]) for index, samples in problems.items()}


def standard_error(values: list) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance / len(values))


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def per_problem_accuracy(records: list) -> dict:
    """(benchmark, problem_index) -> the share of its samples that are correct."""
    problems = defaultdict(list)
    for record in records:
        problems[record["benchmark"], record["problem_index"]].append(bool(record["correct"]))
    return {index: sum(c) / len(c) for index, c in problems.items()}


def paired_difference(records: list, baseline: list) -> tuple[float, float]:
    """(mean accuracy of `records` minus that of `baseline`, its standard error), paired by problem: both must hold
    the same problems (of one benchmark or several, each problem weighing the same)."""
    return difference(per_problem_accuracy(records), per_problem_accuracy(baseline))


def difference(ours: dict, theirs: dict) -> tuple[float, float]:
    """(mean of ours minus theirs, its standard error) over the problems of two per-problem value dicts."""
    if ours.keys() != theirs.keys():
        raise ValueError(
            f"a paired difference needs the same problems on both sides: {len(ours.keys() - theirs.keys())} "
            f"only in the first, {len(theirs.keys() - ours.keys())} only in the baseline"
        )
    gaps = [ours[index] - theirs[index] for index in sorted(ours)]
    return _mean(gaps), standard_error(gaps)


def benchmark_metrics(records: list) -> dict:
    """Every number of one benchmark from its records (all problems must have the same number of samples)."""
    if not records:
        raise ValueError("no completions to score")
    problems = _by_problem(records)
    sizes = {len(samples) for samples in problems.values()}
    if len(sizes) != 1:
        raise ValueError(f"every problem needs the same number of samples, got {sorted(sizes)}")
    (n,) = sizes
    ordered = [samples for _, samples in sorted(problems.items())]
    correct = [[bool(r["correct"]) for r in samples] for samples in ordered]
    accuracy = [sum(c) / n for c in correct]
    out = {
        "problems": len(ordered),
        "samples": n,
        f"mean@{n}": _mean(accuracy),
        f"mean@{n}_stderr": standard_error(accuracy),
    }
    for k in range(1, n + 1):
        solved = [pass_at_k(n, sum(c), k) for c in correct]
        out[f"pass@{k}"], out[f"pass@{k}_stderr"] = _mean(solved), standard_error(solved)
    votes = [float(majority_correct([r["answer"] for r in s], c)) for s, c in zip(ordered, correct)]
    out[f"cons@{n}"], out[f"cons@{n}_stderr"] = _mean(votes), standard_error(votes)
    out.update(shape_metrics(records))
    return out


def summarize(records: list) -> dict:
    """Per benchmark (in order of first appearance), and averages over benchmarks (each weighing the same) of
    the mean accuracy (the paper's "average of means"), the parallel ratio and D/T."""
    by_benchmark: dict = {}
    for record in records:
        by_benchmark.setdefault(record["benchmark"], []).append(record)
    results = {name: benchmark_metrics(rows) for name, rows in by_benchmark.items()}
    average = {
        "mean": _mean(value[f"mean@{value['samples']}"] for value in results.values()),
        "parallel_ratio": _mean(value["parallel_ratio"] for value in results.values()),
        "critical_over_total": _mean(value["critical_over_total"] for value in results.values()),
    }
    return {"benchmarks": results, "average": average}
