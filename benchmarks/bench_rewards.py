"""Reward throughput on the shipped cold-start sample (341 real Parallel-GSM8K traces).

    python benchmarks/bench_rewards.py [--passes 3] [--out benchmarks/results/rewards.md]

Each reward scores the whole sample, called as TRL calls it, `--passes` times; the best pass is reported in
completions per second. Two reference sets: the right answers (most checks end at the normalised string
comparison) and answers shifted by one row (wrong: every check goes to math-verify in its child process).
The math-verify process is started before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from bench_common import write_results

from parallel_r1.answers import is_correct
from parallel_r1.data import DATA_DIR
from parallel_r1.rewards import REWARDS

NAMES = ["accuracy", "tiered", "tiered_diversity", "efficiency_bonus"]
# A paper step scores 256 prompts x 8 rollouts: each reward must do it in under 10 s on one core, wrong answers
# (every check through math-verify) included.
BATCH, BUDGET_S = 2048, 10.0
TARGET = BATCH / BUDGET_S  # completions/s


def best_rate(reward, completions: list[str], answers: list[str], passes: int) -> float:
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        reward(prompts=[""] * len(completions), completions=completions, answer=answers)
        best = min(best, time.perf_counter() - start)
    return len(completions) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rewards.md")
    args = parser.parse_args()

    with open(DATA_DIR / "parallel_gsm8k_sample.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    completions = [r["response"] for r in rows]
    right = [r["answer"] for r in rows]
    shifted = right[1:] + right[:1]
    is_correct("Final Answer: 1/2", "0.5")  # start the math-verify process

    lines = [
        "# Reward throughput",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs (shared with other jobs: read the figures as a lower bound).",
        f"Command: `python benchmarks/bench_rewards.py --passes {args.passes}`. "
        f"Data: {len(rows)} cold-start traces (`parallel_gsm8k_sample.jsonl`), mean "
        f"{sum(map(len, completions)) // len(completions)} characters each. Best of {args.passes} passes.",
        "",
        "| reward | right answers (completions/s) | wrong answers (completions/s) |",
        "|---|---|---|",
    ]
    slowest = float("inf")
    for name in NAMES:
        reward = REWARDS[name]
        rates = (
            best_rate(reward, completions, right, args.passes),
            best_rate(reward, completions, shifted, args.passes),
        )
        slowest = min(slowest, *rates)
        lines.append(f"| {name} | {rates[0]:,.0f} | {rates[1]:,.0f} |")
    lines += [
        "",
        f"Target: every reward scores a paper step ({BATCH:,} completions: 256 prompts x 8) in under {BUDGET_S:.0f} s, "
        f"i.e. at least {TARGET:,.0f} completions/s: {'met' if slowest >= TARGET else 'not met'} (slowest "
        f"{slowest:,.0f}/s, {BATCH / slowest:.1f} s a step).",
    ]
    write_results(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
