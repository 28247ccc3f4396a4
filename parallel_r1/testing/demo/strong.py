"""Parallel-R1 against the strongest plain recipe and against self-consistency (`make demo-strong`), at a latency.

The arms, all from the same base, on the same held-out problems and evaluation (mean@n at temperature 1):

- (a) `plain`: a plain SFT for as many steps as the parallel arm's two SFT stages, then plain GRPO with three times
  the completions a step;
- (b) self-consistency of (a)'s final model: cons@3 (as many attempts as a block holds) and cons@k with k the
  samples whose tokens match Parallel-R1's mean completion (`metrics.consensus_at_k`, from the same n samples);
- (c) `parallel`: Parallel-R1 whose cold start and SFT continue from the plain SFT's first stage (or, with
  `scripts/demo.py --strong --strong_start blocks`, from an SFT as long on the same solutions written as blocks).

Latency is the tokens on an answer's critical path (`metrics.latency_summary`): D for a completion with a block
whose paths are decoded at once, T for a plain one, the longest of the k for cons@k decoded concurrently.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

from ...durable import read_lines
from ...evaluation.metrics import consensus_at_k, difference, latency_summary, per_problem_accuracy, standard_error

BLOCK_PATHS = 3  # the attempts a block holds, and so the samples of the first self-consistency row


def answers(folder: str | Path) -> list:
    """An evaluation folder's completion records."""
    return list(read_lines(Path(folder) / "completions.jsonl"))


def single(records: list) -> dict:
    """One sample an answer: accuracy (mean@n) with its error, per-problem values, latency and mean tokens."""
    per_problem = {index: value for (_, index), value in per_problem_accuracy(records).items()}
    values = list(per_problem.values())
    return {
        "accuracy": sum(values) / len(values),
        "stderr": standard_error(values),
        "per_problem": per_problem,
        "tokens": sum(r["tokens_total"] for r in records) / len(records),
        **latency_summary([r["tokens_critical"] for r in records]),
    }


def matching_samples(parallel_tokens: float, plain_tokens: float) -> int:
    """The samples of a plain model whose tokens come nearest a parallel completion's (at least 1)."""
    return max(1, round(parallel_tokens / plain_tokens))


def arms(plain: str | Path, parallel: str | Path) -> dict:
    """label -> the numbers of each arm (`single`, or a cons@k row with its k), from the two final evaluations."""
    records = answers(plain)
    a, c = single(records), single(answers(parallel))
    n = min(Counter(r["problem_index"] for r in records).values())
    k = matching_samples(c["tokens"], a["tokens"])
    if k > n:
        warnings.warn(
            f"Parallel-R1's tokens match {k} plain samples, but (a) was evaluated with {n}: cons@{n} shown",
            stacklevel=2,
        )
    rows = {"(a) plain": a}
    for samples in dict.fromkeys((BLOCK_PATHS, min(k, n))):  # once when k is 3
        vote = consensus_at_k(records, samples)
        rows[f"(b) cons@{samples} of (a)"] = {**vote, "tokens": samples * a["tokens"], "samples": samples}
    rows["(c) Parallel-R1"] = c
    return with_gaps(rows)


def with_gaps(rows: dict) -> dict:
    """Each row with its paired differences from (a) and from cons@3 (`minus_plain`, `minus_cons3`: mean and
    error, fractions; None against itself)."""
    a, vote = rows["(a) plain"], rows[f"(b) cons@{BLOCK_PATHS} of (a)"]
    return {
        label: {
            **row,
            **{
                name: None if row is baseline else difference(row["per_problem"], baseline["per_problem"])
                for name, baseline in (("minus_plain", a), ("minus_cons3", vote))
            },
        }
        for label, row in rows.items()
    }


def arms_table(rows: dict) -> str:
    """One row per arm (`with_gaps`): accuracy, its paired difference from (a) and from cons@3, latency and tokens."""
    lines = [
        f"| Arm | Accuracy % | minus (a) (points) | minus cons@{BLOCK_PATHS} (points) | Critical path, mean (tokens) "
        "| Critical path, p90 (tokens) | Tokens an answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, row in rows.items():
        cells = [f"{100 * row['accuracy']:.1f} ± {100 * row['stderr']:.1f}"]
        cells += ["-" if row[gap] is None else points(row[gap]) for gap in ("minus_plain", "minus_cons3")]
        cells += [f"{row['latency_mean']:.1f}", f"{row['latency_p90']:.0f}", f"{row['tokens']:.1f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def points(gap: tuple) -> str:
    """A paired difference (fractions) in points, with its error and its size in standard errors."""
    mean, error = gap
    size = f" ({mean / error:+.1f} SE)" if error else ""
    return f"{100 * mean:+.1f} ± {100 * error:.1f}{size}"


def stages_table(evaluations: dict) -> str:
    """label -> evaluation folder: each model's accuracy, for the stages on the way to the arms."""
    lines = ["| Model | Accuracy % | Mean tokens |", "|---|---|---|"]
    for label, folder in evaluations.items():
        row = single(answers(folder))
        lines.append(f"| {label} | {100 * row['accuracy']:.1f} ± {100 * row['stderr']:.1f} | {row['tokens']:.1f} |")
    return "\n".join(lines)


def write(plain: str | Path, parallel: str | Path, output: str | Path) -> dict:
    """The arms' table as markdown and their numbers as JSON (without the per-problem values) in `output`."""
    rows = arms(plain, parallel)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "arms.md").write_text(arms_table(rows) + "\n")
    kept = {label: {k: v for k, v in row.items() if k != "per_problem"} for label, row in rows.items()}
    (output / "arms.json").write_text(json.dumps(kept, indent=1) + "\n")
    return rows


def table_rows(path: str | Path) -> dict:
    """A markdown table of ours (first cell the row's label) as label -> {header: cell}."""
    lines = Path(path).read_text().strip().splitlines()
    headers = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return {row[0]: dict(zip(headers, row)) for row in rows}


def seeds_table(runs: dict) -> str:
    """label -> a `--strong` run's folder: one row per run with every arm's accuracy, Parallel-R1's paired gaps,
    its paths and summary (votes.md), and each arm's critical path."""
    lines = [
        "| Run | (a) plain % | cons@3 of (a) % | cons@k of (a) % | Parallel-R1 % | Parallel-R1 minus (a) (points) "
        "| Parallel-R1 minus cons@3 (points) | One path right %, parallel SFT / Parallel-R1 "
        "| Summary states the majority % | Critical path mean (p90), tokens: (a) / cons@3 / cons@k / Parallel-R1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, folder in runs.items():
        results = Path(folder) / "results" / "strong"
        arms = json.loads((results / "arms.json").read_text())
        votes = table_rows(results / "votes.md")
        plain, vote, parallel = arms["(a) plain"], arms[f"(b) cons@{BLOCK_PATHS} of (a)"], arms["(c) Parallel-R1"]
        matched = [row for name, row in arms.items() if name.startswith("(b)")][-1]  # cons@3 again when k is 3
        accuracy = lambda row: f"{100 * row['accuracy']:.1f} ± {100 * row['stderr']:.1f}"  # noqa: E731
        latency = lambda row: f"{row['latency_mean']:.0f} ({row['latency_p90']:.0f})"  # noqa: E731
        paths = " / ".join(votes[model]["Path right %"] for model in ("parallel SFT", "(c) Parallel-R1"))
        lines.append(
            f"| {label} | {accuracy(plain)} | {accuracy(vote)} | {accuracy(matched)} (k={matched['samples']}) "
            f"| {accuracy(parallel)} | {points(parallel['minus_plain'])} | {points(parallel['minus_cons3'])} "
            f"| {paths} | {votes['(c) Parallel-R1']['Summary states the majority %']} "
            f"| {' / '.join(latency(row) for row in (plain, vote, matched, parallel))} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="One table of several `scripts/demo.py --strong` runs (seeds).")
    parser.add_argument("runs", nargs="+", help="LABEL=FOLDER: a run's label (its seed) and its --output_dir")
    args = parser.parse_args(argv)
    runs = dict(run.split("=", 1) for run in args.runs)
    print(seeds_table(runs))


if __name__ == "__main__":
    main()
