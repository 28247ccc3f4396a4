"""Tables of results: the paper's main table (one row per model), the shape of the completions, and each model
against a baseline, paired by problem."""

from __future__ import annotations

from pathlib import Path

from .metrics import paired_difference

LOCAL_FILES = (".jsonl", ".json", ".parquet")


def _percent(value: float) -> str:
    return f"{100 * value:.1f}"


def shown_name(benchmark: str) -> str:
    """A benchmark's name in a table: a local file by its file name, anything else as given."""
    return Path(benchmark).name if benchmark.endswith(LOCAL_FILES) else benchmark


def _with_error(metrics: dict, name: str) -> str:
    """A metric and its standard error over problems, in percent: `52.2 ± 1.9`."""
    return f"{_percent(metrics[name])} ± {_percent(metrics[f'{name}_stderr'])}"


def _accuracy(metrics: dict) -> str:
    """mean@k / pass@k in percent, each with its standard error (mean only when k is 1)."""
    k = metrics["samples"]
    if k == 1:
        return _with_error(metrics, "mean@1")
    return f"{_with_error(metrics, f'mean@{k}')} / {_with_error(metrics, f'pass@{k}')}"


def markdown_table(results: list) -> str:
    """The paper's main table for results of the same benchmarks: parallel ratio, accuracy per benchmark
    (mean@k / pass@k, each ± its standard error over problems), the average of the means; then the shape of each
    model's completions."""
    first = results[0]["benchmarks"]
    header = ["Model", "Parallel %"]
    header += [
        f"{shown_name(name)} (mean@{m['samples']}" + (f" / pass@{m['samples']})" if m["samples"] > 1 else ")")
        for name, m in first.items()
    ]
    header.append("Avg of means")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        cells = [result["label"], _percent(result["average"]["parallel_ratio"])]
        cells += [_accuracy(result["benchmarks"][name]) if name in result["benchmarks"] else "-" for name in first]
        cells.append(_percent(result["average"]["mean"]))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", shape_table(results)]
    return "\n".join(lines)


def shape_table(results: list) -> str:
    header = [
        "Model",
        "Benchmark",
        "cons@k %",
        "Parallel %",
        "Valid %",
        "Blocks",
        "Paths/block (min-max)",
        "Alike %",
        "Self-BLEU",
        "Block pos.",
        "T",
        "D",
        "D/T",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        for name, m in result["benchmarks"].items():
            cells = [
                result["label"],
                shown_name(name),
                _percent(m[f"cons@{m['samples']}"]),
                _percent(m["parallel_ratio"]),
                _percent(m["format_valid"]),
                f"{m['blocks_per_completion']:.2f}",
                f"{m['paths_per_block']:.2f} ({m.get('paths_per_block_min', 0)}-{m.get('paths_per_block_max', 0)})",
                _percent(m.get("openings_alike", 0.0)),
                "-" if m.get("self_bleu") is None else f"{m['self_bleu']:.2f}",
                f"{m['block_position']:.2f}",
                f"{m['tokens_total']:.0f}",
                f"{m['tokens_critical']:.0f}",
                f"{m['critical_over_total']:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def difference_table(evaluations: list, baseline: str) -> str:
    """Each model's mean@k minus the `baseline` model's, per benchmark, in points ± the standard error of the
    difference paired by problem (`metrics.paired_difference`). `evaluations`: (results, completion records) per
    model, the baseline among them by its label."""
    by_label = {results["label"]: (results, records) for results, records in evaluations}
    if baseline not in by_label:
        raise ValueError(f"the baseline {baseline!r} is not among the evaluations: {sorted(by_label)}")
    names = list(by_label[baseline][0]["benchmarks"])
    of = lambda records, name: [r for r in records if r["benchmark"] == name]  # noqa: E731
    header = ["Model"] + [f"{shown_name(name)}: mean minus {baseline}'s (points)" for name in names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, (results, records) in by_label.items():
        if label == baseline:
            continue
        cells = [label]
        for name in names:
            if name not in results["benchmarks"]:
                cells.append("-")
                continue
            gap, error = paired_difference(of(records, name), of(by_label[baseline][1], name))
            cells.append(
                f"{100 * gap:+.1f} ± {100 * error:.1f} ({gap / error:+.1f} SE)" if error else f"{100 * gap:+.1f}"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
