"""The width demo (`make demo-width`): the model chooses how many paths each block gets (min_paths 2, max_paths 4),
and RL moves that choice.

From one SFT model (trained on blocks of 2, 3 and 4 attempts, `task.varied_width_teacher`), three GRPO runs with the
same budget differ only in their reward or their problems:

- `hard, accuracy`: accuracy alone on the hard problems: a wider block is a larger vote, and costs nothing;
- `hard, accuracy + cost`: `path_cost` too (-0.1 for each path beyond min_paths, the second);
- `easy, accuracy + cost`: the same reward on the easy problems, where one attempt is already right most of the time.

What each run logs at every logged step (`parallel/paths_per_block`, `parallel/openings_alike`, the accuracy reward)
becomes a table of start and end and a plot of the width over training.
"""

from __future__ import annotations

from pathlib import Path

from .paper import ends, logged, plot_curves, with_blocks

# label -> (the run's folder under the demo's output, its problems under data/, its reward specs)
WIDTH_RUNS = {
    "hard, accuracy": ("width/hard-accuracy", "rl.jsonl", ("accuracy",)),
    "hard, accuracy + cost": ("width/hard-cost", "rl.jsonl", ("accuracy", "path_cost")),
    "easy, accuracy + cost": ("width/easy-cost", "rl_easy.jsonl", ("accuracy", "path_cost")),
}
WIDTH_KEY = "parallel/paths_per_block"
SHOWN = {
    "paths per block": WIDTH_KEY,
    "alike openings %": "parallel/openings_alike",
    "accuracy reward": "rewards/accuracy/mean",
}
PER_BLOCK = {WIDTH_KEY, "parallel/openings_alike"}  # logged as 0 at a step without blocks: read where there were


def width_table(states: dict) -> str:
    """label -> trainer_state.json of each run: each shown metric at the start and at the end of its RL run (a
    per-block metric over the steps that opened blocks)."""
    header = ["Run", *(f"{name} (start -> end)" for name in SHOWN)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, state in states.items():
        cells = [label]
        for name, key in SHOWN.items():
            moved = ends((with_blocks if key in PER_BLOCK else logged)([state], key))
            scale = 100 if name.endswith("%") else 1
            cells.append("-" if moved is None else f"{scale * moved[0]:.2f} -> {scale * moved[1]:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curve_table(states: dict, every: int = 20) -> str:
    """The paths-per-block curve of each run as text: one column per run, a row at the first and the last logged step
    and every `every` steps between."""
    curves = {label: dict(with_blocks([state], WIDTH_KEY)) for label, state in states.items()}
    logged_steps = sorted({step for curve in curves.values() for step in curve})
    steps = [s for s in logged_steps if s % every == 0 or s in (logged_steps[0], logged_steps[-1])]
    lines = ["| step | " + " | ".join(curves) + " |", "|" + "---|" * (len(curves) + 1)]
    for step in steps:
        cells = [f"{curve[step]:.2f}" if step in curve else "-" for curve in curves.values()]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_width(states: dict, path: Path) -> Path:
    """Paths per block over training steps, one line per run."""
    curves = {label: with_blocks([state], WIDTH_KEY) for label, state in states.items()}
    return plot_curves(
        curves, path, "paths per block (the model's choice, 2 to 4)", "The width the model chooses, over RL"
    )
