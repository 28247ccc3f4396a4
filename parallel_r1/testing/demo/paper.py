"""The paper's findings in miniature (`make demo-paper`): which of our runs stands for which row of the paper, the
paper's numbers beside ours, one line per finding saying whether its direction holds here, and the drift of the
block's position over training.

The paper's numbers are those of Qwen3-4B-Base (parallel ratio and the average of its benchmark means; the tiered
ablation reports a parallel ratio only). Ours are mean@k on the demo's held-out problems. Only directions are
compared: the scales have nothing in common.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...evaluation.metrics import paired_difference

# label -> (the model's folder under the demo's output, evaluated without the engine?, extra flags of the evaluation)
PAPER_ROWS = {
    "base": ("base-special", True, ()),
    "sft-seen": ("sft-seen", False, ("--attention", "causal", "--rollout_mode", "sequential")),
    "sft-unseen": ("sft", False, ()),
    "grpo-plain": ("grpo-plain", True, ()),
    "r1-seen": ("paper/seen", False, ("--attention", "causal", "--rollout_mode", "sequential")),
    "r1-unseen-s1": ("paper/s1", False, ()),
    "r1-unseen-s2": ("grpo", False, ()),
    "r1-unseen-tiered": ("paper/tiered", False, ()),
    "mid-training": ("paper/mid-training", False, ()),
}
# label -> (the paper's row, its parallel %, its average of means or None)
PAPER = {
    "base": ("Qwen3-4B-Base", 0.0, 6.6),
    "sft-seen": ("Parallel-SFT-Seen", 95.6, 36.0),
    "sft-unseen": ("Parallel-SFT-Unseen", None, None),
    "grpo-plain": ("GRPO on DAPO (no blocks)", 0.0, 45.1),
    "r1-seen": ("Parallel-R1-Seen", 27.3, 48.9),
    "r1-unseen-s1": ("Parallel-R1-Unseen S1 (accuracy)", 13.6, 47.1),
    "r1-unseen-s2": ("Parallel-R1-Unseen S2 (alternating)", 63.0, 46.8),
    "r1-unseen-tiered": ("Parallel-R1-Unseen, tiered only", 80.3, None),
    "mid-training": ("Mid-training (S2, then accuracy)", 0.0, None),
}
RL_RUNS = ("grpo-plain", "r1-seen", "r1-unseen-s1", "r1-unseen-s2", "r1-unseen-tiered", "mid-training")
PARALLEL_RUNS = ("r1-seen", "r1-unseen-s1", "r1-unseen-s2")
WELL_BELOW = 20.0  # points under the SFT ratio that count as "well below" for accuracy-only RL
MIN_DRIFT = 0.05  # how much later (positions run 0 to 1 over the answer) a block must end up to count as moved
POSITION_KEY = "parallel/block_position"
RATIO_KEY = "parallel/ratio"


def _metrics(results: dict) -> dict:
    ((_, metrics),) = results["benchmarks"].items()
    return metrics


def _mean(results: dict) -> tuple[float, float]:
    """mean@k and its standard error, in percent."""
    m = _metrics(results)
    k = m["samples"]
    return 100 * m[f"mean@{k}"], 100 * m[f"mean@{k}_stderr"]


def logged(states: list[Path | str], key: str) -> list[tuple[int, float]]:
    """(step, value) of `key` over one RL run whose trainer_state.json files are given in order (a run continued
    from another's checkpoint counts its steps on from the end of the first)."""
    points, offset = [], 0
    for state in states:
        history = json.loads(Path(state).read_text())["log_history"]
        run = [(offset + e["step"], e[key]) for e in history if key in e]
        points += run
        offset = points[-1][0] if points else offset
    return points


def with_blocks(states: list[Path | str], key: str) -> list[tuple[int, float]]:
    """(step, value) of a per-block metric of one RL run (a block's position, its width) at the logged steps where it
    opened blocks: such a metric is logged as 0 when there were none."""
    ratios = dict(logged(states, RATIO_KEY))
    return [(s, v) for s, v in logged(states, key) if ratios.get(s, 0) > 0]


def ends(points: list[tuple[int, float]], window: int = 3) -> tuple[float, float] | None:
    """The mean of the first and of the last `window` points of a curve (fewer when it is short: one point is both),
    or None for no point."""
    if not points:
        return None
    window = max(1, min(window, len(points) // 2))
    return sum(v for _, v in points[:window]) / window, sum(v for _, v in points[-window:]) / window


def drift(curves: dict) -> dict:
    """label -> (block position at the start, at the end) of each run's logged curve (`ends`), over its points at
    which blocks were opened; a run with fewer than two such points has none."""
    out = {}
    for label, states in curves.items():
        points = with_blocks(states, POSITION_KEY)
        if len(points) >= 2:
            out[label] = ends(points)
    return out


def findings(results: dict, drifts: dict, records: dict) -> list[tuple[str, bool, str]]:
    """(finding, does its direction hold here, our numbers) for the paper's five findings; `records`: label -> the
    completion records of its evaluation (a gap between two models is weighed by its error paired by problem)."""
    ratio = {label: 100 * _metrics(r)["parallel_ratio"] for label, r in results.items()}
    mean = {label: _mean(r) for label, r in results.items()}
    sft = min(ratio["sft-seen"], ratio["sft-unseen"])
    best = max(PARALLEL_RUNS, key=lambda label: mean[label][0])
    m_best, m_plain = mean[best][0], mean["grpo-plain"][0]
    margin, se_margin = (100 * v for v in paired_difference(records[best], records["grpo-plain"]))
    s1, s2, tiered = ratio["r1-unseen-s1"], ratio["r1-unseen-s2"], ratio["r1-unseen-tiered"]
    later = {label: d for label, d in drifts.items() if d[1] - d[0] >= MIN_DRIFT}
    mid = mean["mid-training"][0]
    return [
        (
            "1. Cold-start SFT teaches the format (parallel ratio >= 80%; paper 95.6%)",
            sft >= 80,
            f"Seen {ratio['sft-seen']:.1f}%, Unseen {ratio['sft-unseen']:.1f}%",
        ),
        (
            "2. Parallel-R1 beats GRPO without blocks (by more than 2 standard errors of the difference, paired by problem)",
            margin > 2 * se_margin,
            f"best variant {best} {m_best:.1f} against {m_plain:.1f}: {margin:+.1f} ± {se_margin:.1f} points",
        ),
        (
            "3. The reward decides whether blocks survive: accuracy < alternating < tiered, accuracy well below SFT",
            s1 < s2 < tiered and s1 <= ratio["sft-unseen"] - WELL_BELOW,
            f"parallel % accuracy {s1:.1f}, alternating {s2:.1f}, tiered {tiered:.1f} (SFT {ratio['sft-unseen']:.1f})",
        ),
        (
            f"4. The block moves later in the answer over RL (by at least {MIN_DRIFT:.2f}), in at least one run",
            bool(later),
            ", ".join(f"{label} {a:.2f} -> {b:.2f}" for label, (a, b) in drifts.items()) or "no run opened blocks",
        ),
        (
            "5. Mid-training (S2, then accuracy) ends at or above GRPO without blocks at the same total steps",
            mid >= m_plain,
            f"{mid:.1f} against {m_plain:.1f}",
        ),
    ]


def paper_table(results: dict, drifts: dict, records: dict) -> str:
    """Our rows beside the paper's, then the findings, each marked as holding here or not."""
    lines = [
        "| Ours | Paper's row | Paper: parallel % | Paper: avg of means | Parallel % | mean@k % | pass@k % | T | D/T "
        "| Block pos. (RL start -> end) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    show = lambda value: "-" if value is None else f"{value:.1f}"  # noqa: E731
    for label, results_of in results.items():
        m = _metrics(results_of)
        k = m["samples"]
        name, paper_ratio, paper_mean = PAPER[label]
        moved = f"{drifts[label][0]:.2f} -> {drifts[label][1]:.2f}" if label in drifts else "-"
        lines.append(
            f"| {label} | {name} | {show(paper_ratio)} | {show(paper_mean)} | {100 * m['parallel_ratio']:.1f} "
            f"| {100 * m[f'mean@{k}']:.1f} ± {100 * m[f'mean@{k}_stderr']:.1f} "
            f"| {100 * m[f'pass@{k}']:.1f} ± {100 * m[f'pass@{k}_stderr']:.1f} | {m['tokens_total']:.0f} "
            f"| {m['critical_over_total']:.2f} | {moved} |"
        )
    lines += ["", "| Finding | Holds here | Our numbers |", "|---|---|---|"]
    lines += [
        f"| {text} | {'yes' if holds else 'no'} | {numbers} |"
        for text, holds, numbers in findings(results, drifts, records)
    ]
    return "\n".join(lines)


def plot_drift(curves: dict, path: Path) -> Path:
    """The block's relative position over training steps, one line per RL run that opened blocks."""
    points = {label: with_blocks(states, POSITION_KEY) for label, states in curves.items()}
    return plot_curves(points, path, "block position in the answer (0 start, 1 end)", "Where the block opens, over RL")


def plot_curves(curves: dict, path: Path, ylabel: str, title: str) -> Path:
    """label -> (step, value) points, one line each over training steps (a label without points is left out)."""
    from ...evaluation.plots import _pyplot, _save

    plt = _pyplot()
    fig, axis = plt.subplots(figsize=(8, 4))
    for label, points in curves.items():
        if points:
            axis.plot(*zip(*points), marker=".", label=label)
    axis.set(xlabel="training step", ylabel=ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _save(fig, path)
