"""Strategy-evolution plots (PNG): how accuracy, the parallel ratio, where blocks open and D/T move over training.

Inputs: evaluation folders and/or a trainer's `trainer_state.json` (its logged `parallel/*` metrics, reward and `eval/*/mean@k`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..durable import read_lines
from .report import shown_name

CHECKPOINT = re.compile(r"(^|/)checkpoint-\d+/?$")
TRAINING_KEYS = {
    "loss": "loss",
    "reward": "reward",
    "parallel/ratio": "parallel ratio",
    "parallel/format_valid": "format valid",
    "parallel/critical_over_total": "D/T",
    "parallel/block_position": "block position",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_evaluations(folders: list) -> list:
    """(x, results, completion records) per folder. When every folder evaluated a checkpoint of one training run
    (`run/checkpoint-N` or `run` itself, each with a known step), x is the step and the folders are sorted by it;
    otherwise (say base, SFT and GRPO models) x is the folder's rank in the order given."""
    loaded = []
    for folder in map(Path, folders):
        results_file = folder / "results.json"
        if not results_file.exists():
            raise FileNotFoundError(f"{folder} has no results.json: run scripts/evaluate.py into it first")
        loaded.append((json.loads(results_file.read_text()), read_lines(folder / "completions.jsonl")))
    if over_training_steps([results for results, _ in loaded]):
        return sorted(((r["model"]["step"], r, records) for r, records in loaded), key=lambda item: item[0])
    return [(rank, results, records) for rank, (results, records) in enumerate(loaded)]


def over_training_steps(results: list) -> bool:
    """Whether these evaluations are of checkpoints of one run, each with its step."""
    models = [r["model"] for r in results]
    runs = {
        Path(m["name_or_path"]).parent if CHECKPOINT.search(m["name_or_path"]) else Path(m["name_or_path"])
        for m in models
    }
    return len(runs) == 1 and all(m.get("step") is not None for m in models)


def plot_evaluations(runs: list, output_dir: Path) -> list:
    """The three evaluation plots of `load_evaluations(...)`, over the benchmarks every run has (same k)."""
    plt = _pyplot()
    steps = [step for step, _, _ in runs]
    first = runs[0][1]["benchmarks"]
    names = [
        name
        for name, metrics in first.items()
        if all(r["benchmarks"].get(name, {}).get("samples") == metrics["samples"] for _, r, _ in runs)
    ]
    if not names:
        raise ValueError("the evaluation folders share no benchmark (with the same number of samples) to plot")
    known = over_training_steps([results for _, results, _ in runs])
    x_label = "training step" if known else "model"
    ticks = {x: str(x) if known else results["label"] for x, results, _ in runs}
    written = []

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for name in names:
        k = runs[0][1]["benchmarks"][name]["samples"]
        top.plot(
            steps,
            [100 * r["benchmarks"][name][f"mean@{k}"] for _, r, _ in runs],
            marker="o",
            label=f"{shown_name(name)} mean@{k}",
        )
        bottom.plot(
            steps,
            [100 * r["benchmarks"][name]["parallel_ratio"] for _, r, _ in runs],
            marker="o",
            label=shown_name(name),
        )
    top.set(ylabel="accuracy (%)", title="Accuracy and parallel ratio " + ("over training" if known else "per model"))
    bottom.set(xlabel=x_label, ylabel="parallel ratio (%)")
    bottom.set_xticks(steps, [ticks[x] for x in steps])
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    written.append(_save(fig, output_dir / "accuracy_and_parallel.png"))

    fig, axis = plt.subplots(figsize=(8, 4.5))
    positions = [[p for record in records for p in record["block_positions"]] for _, _, records in runs]
    shown = [(step, values) for step, values in zip(steps, positions) if values]
    if shown:
        axis.boxplot([values for _, values in shown], tick_labels=[ticks[x] for x, _ in shown])
    axis.set(
        xlabel=x_label,
        ylabel="relative position of <Parallel> (0 = start, 1 = end)",
        title="Where blocks open (the paper: from ~0.4 to ~0.7 over ~250 RL steps)",
        ylim=(0, 1),
    )
    axis.grid(alpha=0.3)
    written.append(_save(fig, output_dir / "block_position.png"))

    fig, axis = plt.subplots(figsize=(8, 4.5))
    for name in names:
        axis.plot(
            steps,
            [r["benchmarks"][name]["critical_over_total"] for _, r, _ in runs],
            marker="o",
            label=shown_name(name),
        )
    axis.set_xticks(steps, [ticks[x] for x in steps])
    axis.set(xlabel=x_label, ylabel="D / T", title="Critical path over total tokens (1 = no saving)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    written.append(_save(fig, output_dir / "critical_over_total.png"))
    return written


def plot_trainer_state(path: Path, output_dir: Path) -> list:
    """The trainer's logged loss, reward, parallel ratio, format validity, D/T, block position and in-training
    accuracies over its steps (those it logged)."""
    plt = _pyplot()
    history = json.loads(Path(path).read_text()).get("log_history", [])
    evaluated = sorted({key for entry in history for key in entry if key.startswith("eval/") and "/mean@" in key})
    labels = {**TRAINING_KEYS, **{key: key.removeprefix("eval/") for key in evaluated}}
    present = [key for key in labels if any(key in entry for entry in history)]
    if not present:
        raise ValueError(f"{path} logs none of {list(TRAINING_KEYS)}: is it a trainer's state?")
    fig, axes = plt.subplots(len(present), 1, figsize=(8, 2.6 * len(present)), sharex=True, squeeze=False)
    for axis, key in zip(axes[:, 0], present):
        points = [(entry["step"], entry[key]) for entry in history if key in entry]
        axis.plot(*zip(*points), marker=".")
        axis.set(ylabel=labels[key])
        axis.grid(alpha=0.3)
    axes[0, 0].set_title(f"Training curves ({Path(path).parent.name})")
    axes[-1, 0].set_xlabel("training step")
    return [_save(fig, output_dir / "training_curves.png")]


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path
