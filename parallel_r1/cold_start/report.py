"""The report of a cold-start run: what each filter rejected, the rates to compare with the paper, the shape and
length of the kept traces; as a dict (report.json), markdown (report.md) and a figure (report.png)."""

from __future__ import annotations

import math
import statistics
from collections import Counter

from tabulate import tabulate

from .config import ColdStartConfig
from .filters import RULES, Verdict

# docs/paper.md, the cold start: GSM8K problems for which the teacher wrote a valid trace (the paper's
# format check: well-formed, ending with a Final Answer line)
PAPER_VALID_RATE = 0.837
FILTER_KEYS = (
    "drop_reasoning",
    "require_finished",
    "require_well_formed",
    "require_final_answer",
    "require_correct",
    "require_block",
    "max_length",
    "normalize_whitespace",
    "rewrite_final_answer",
    "drop_exact_duplicates",
    "near_duplicate_threshold",
    "max_traces_per_question",
)


def build_report(verdicts: list[Verdict], config: ColdStartConfig, num_problems: int) -> dict:
    """Every figure of the run, from the verdicts of all its answers."""
    kept = [v for v in verdicts if v.reason is None]
    n = max(len(verdicts), 1)
    fits = [v.checks["num_tokens"] is None or config.max_length is None or v.checks["num_tokens"] <= config.max_length
            for v in verdicts]  # fmt: skip
    paper = [c and v.checks["well_formed"] and v.checks["final_answer"] for v, c in zip(verdicts, fits)]
    wrong_in_paper = sum(p and not v.checks["correct"] for v, p in zip(verdicts, paper))
    unit = "student tokens" if config.student_tokenizer else "characters"
    lengths = [v.checks["num_tokens"] if config.student_tokenizer else len(v.trace) for v in kept]
    return {
        "teacher": config.model_name_or_path,
        "questions": f"{config.dataset_name} [{config.dataset_train_split}]",
        "problems": num_problems,
        "answers": len(verdicts),
        "kept": len(kept),
        "rejected": {rule: sum(v.reason == rule for v in verdicts) for rule in RULES},
        "format_errors": dict(Counter(v.detail for v in verdicts if not v.checks["well_formed"]).most_common()),
        "answer_rates": {
            check: sum(bool(v.checks[check]) for v in verdicts) / n
            for check in ("finished", "well_formed", "final_answer", "correct", "has_block")
        }
        | {"kept": len(kept) / n},
        "problem_rates": {
            "valid_format": _share(  # the first answer of each problem: the paper asked once
                [v.checks["well_formed"] and v.checks["final_answer"] for v in verdicts if v.sample == 0]
            ),
            "paper_valid_format": PAPER_VALID_RATE,
            "with_a_kept_trace": _share(_any_per_problem(verdicts, lambda v: v.reason is None)),
        },
        "correctness": {
            "paper_filter_passes": sum(paper),
            "of_which_wrong": wrong_in_paper,
            "wrong_share": wrong_in_paper / max(sum(paper), 1),
        },
        "shape": {
            "blocks_per_trace": _histogram(v.checks["blocks"] for v in kept),
            "paths_per_block": _histogram(p for v in kept for p in v.checks["paths_per_block"]),
            "mean_blocks": statistics.fmean(v.checks["blocks"] for v in kept) if kept else 0.0,
        },
        "length": {"unit": unit, **_summary(lengths)},
        "filters": {key: getattr(config, key) for key in FILTER_KEYS},
    }


def report_markdown(report: dict) -> str:
    rates, problems, correctness = report["answer_rates"], report["problem_rates"], report["correctness"]
    lines = [
        f"# Cold-start traces from {report['teacher']}",
        "",
        f"{report['answers']} answers to {report['problems']} problems of {report['questions']}: "
        f"**{report['kept']} traces kept** ({rates['kept']:.1%}).",
        "",
        "## Filters, in order (an answer counts under the first rule it breaks)",
        "",
        tabulate([(rule, count) for rule, count in report["rejected"].items()], ["rule", "rejected"], "github"),
        "",
        "## Rates",
        "",
        tabulate(
            [
                ("answers ended on their own", f"{rates['finished']:.1%}"),
                ("answers well-formed", f"{rates['well_formed']:.1%}"),
                ("answers with a Final Answer line", f"{rates['final_answer']:.1%}"),
                ("answers correct", f"{rates['correct']:.1%}"),
                ("answers with a <Parallel> block", f"{rates['has_block']:.1%}"),
                (
                    "problems whose first answer is valid: well-formed, a Final Answer line (paper: 83.7% of GSM8K)",
                    f"{problems['valid_format']:.1%}",
                ),
                ("problems with a kept trace", f"{problems['with_a_kept_trace']:.1%}"),
            ],
            ["", "rate"],
            "github",
        ),
        "",
        f"The paper's filter (well-formed, a Final Answer line, within the length) passes "
        f"{correctness['paper_filter_passes']} answers; {correctness['of_which_wrong']} of them "
        f"({correctness['wrong_share']:.1%}) give a wrong answer"
        + (", and the correctness filter drops them." if report["filters"]["require_correct"] else ", and are kept."),
        "",
        "## Kept traces",
        "",
        tabulate(sorted(report["shape"]["blocks_per_trace"].items()), ["blocks", "traces"], "github"),
        "",
        tabulate(sorted(report["shape"]["paths_per_block"].items()), ["paths in a block", "blocks"], "github"),
        "",
        tabulate(
            [[report["length"].get(k) for k in ("min", "median", "p90", "max", "mean")]],
            [f"length ({report['length']['unit']}): min", "median", "p90", "max", "mean"],
            "github",
        ),
    ]
    if report["format_errors"]:
        lines += ["", "## Why answers were malformed (first error)", ""]
        lines.append(tabulate(list(report["format_errors"].items()), ["error", "answers"], "github"))
    return "\n".join(lines) + "\n"


def plot_report(verdicts: list[Verdict], report: dict, path) -> None:
    """Two panels: the length histogram of the kept traces, and how many blocks they have."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = [v for v in verdicts if v.reason is None]
    unit = report["length"]["unit"]
    lengths = [v.checks["num_tokens"] if unit == "student tokens" else len(v.trace) for v in kept]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.hist(lengths, bins=30, color="tab:blue")
    left.set(xlabel=f"length ({unit})", ylabel="traces", title=f"Kept traces: length (n={len(kept)})")
    blocks = report["shape"]["blocks_per_trace"]
    right.bar(sorted(blocks), [blocks[b] for b in sorted(blocks)], color="tab:orange")
    right.set_xticks(sorted(blocks))
    right.set(xlabel="<Parallel> blocks", ylabel="traces", title="Kept traces: blocks per trace")
    fig.suptitle(f"Cold start from {report['teacher']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _any_per_problem(verdicts: list[Verdict], test) -> list[bool]:
    """For each problem, whether one of its answers passes `test`."""
    passed = {}
    for v in verdicts:
        passed[v.question_id] = passed.get(v.question_id, False) or bool(test(v))
    return list(passed.values())


def _share(flags: list) -> float:
    return sum(flags) / max(len(flags), 1)


def _histogram(values) -> dict:
    return dict(sorted(Counter(values).items()))


def _summary(values: list) -> dict:
    if not values:
        return {"min": None, "median": None, "p90": None, "max": None, "mean": None}
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "median": statistics.median(ordered),
        "p90": ordered[math.ceil(0.9 * len(ordered)) - 1],  # nearest rank
        "max": ordered[-1],
        "mean": round(statistics.fmean(ordered), 1),
    }
