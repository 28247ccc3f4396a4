"""The whole Parallel-R1 method in miniature, on 2 CPU cores: every stage is one of the project's scripts (or TRL's),
run as a user would run it at scale, on the task of `parallel_r1.demo.task`.

    python scripts/demo.py                      # make demo: all stages, then the table and plots (~11 min, ~13 with the install)
    python scripts/demo.py --ablation           # make demo-ablation: three rewards from the same SFT model
    python scripts/demo.py --quick --output_dir /tmp/demo   # a few steps per stage (what the test runs)

Stages (recipes in recipes/demo/, all outputs under --output_dir, one log per stage in its logs/):
  1. data and an untrained base       python -m parallel_r1.demo.task
  2. pretrain the base                TRL's own SFT script on plain step-by-step solutions
  3. add the tags                     scripts/add_special_tokens.py
  4. cold-start traces                scripts/generate_cold_start.py (the task's programmatic teacher)
  5. SFT, Unseen                      scripts/sft.py
  6. GRPO, fork-join rollouts         scripts/grpo.py with the paper's alternating reward
  7. evaluation and plots             scripts/evaluate.py on base, SFT and GRPO; scripts/plot.py
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from parallel_r1.demo.task import path_report

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes" / "demo"
ACCELERATE = [
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--config_file",
    str(ROOT / "accelerate_configs" / "cpu.yaml"),
]
PYTHON = [sys.executable]
# The parallel ratios of the paper's reward ablation (Parallel-R1-Unseen; REFERENCE)
PAPER_RATIOS = {"accuracy": 13.6, "tiered": 80.3, "alternating": 63.0}
ABLATION = {
    "accuracy": "accuracy",
    "tiered": "tiered",
    "alternating": "alternating(accuracy, tiered, window=10, a_steps=8)",
}
# A few steps per stage: the shape of the demo in a minute or two, for the test suite
QUICK = {
    "base": ["--max_steps", "8", "--per_device_train_batch_size", "16", "--logging_steps", "4"],
    "cold_start": ["--max_problems", "24"],
    "sft": ["--max_steps", "4", "--per_device_train_batch_size", "8", "--logging_steps", "2"],
    "grpo": ["--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4"],
    "eval": ["--max_problems", "6"],
}


class Demo:
    """Runs the stages in order into one folder, each with a banner, its output shown and kept in logs/."""

    def __init__(self, output_dir: Path, seed: int, quick: bool):
        self.out, self.seed, self.quick = output_dir, seed, quick
        self.logs = output_dir / "logs"
        self.timings: list[tuple[str, float]] = []
        self.count = 0

    def path(self, *parts) -> str:
        return str(self.out.joinpath(*parts))

    def stage(self, title: str, name: str, command: list) -> None:
        """Run one stage; its output goes to the console and to logs/<name>.log. A failure stops the demo."""
        self.count += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        banner = f" Stage {self.count}: {title} "
        print(f"\n{banner:=^100}\n$ {shlex.join(command)}\n", flush=True)
        start = time.monotonic()
        with log.open("wb") as sink:
            sink.write(f"$ {shlex.join(command)}\n".encode())
            process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            while chunk := process.stdout.read1(4096):
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
                sink.write(chunk)
        elapsed = time.monotonic() - start
        self.timings.append((title, elapsed))
        if process.wait() != 0:
            raise SystemExit(
                f"error: stage {self.count} ({title}) failed with exit code {process.returncode}; see {log}"
            )
        print(f"\n-- {title}: {elapsed:.0f} s", flush=True)

    def extra(self, stage: str) -> list:
        return QUICK[stage] if self.quick else []

    # ------------------------------------------------------------------------------------------- the stages

    def prepare(self) -> None:
        self.stage(
            "data and an untrained base",
            "data",
            [*PYTHON, "-m", "parallel_r1.demo.task", str(self.out), "--seed", str(self.seed)],
        )
        self.stage(
            "pretrain the base on plain solutions (TRL's SFT script)",
            "base",
            [*ACCELERATE, "-m", "trl.scripts.sft", "--config", str(RECIPES / "base.yaml"),
             "--model_name_or_path", self.path("base-init"), "--dataset_name", self.path("data", "pretrain"),
             "--output_dir", self.path("base"), "--seed", str(self.seed), *self.extra("base")],
        )  # fmt: skip
        self.stage(
            "add the six tags",
            "tags",
            [*PYTHON, "scripts/add_special_tokens.py", "--model_name_or_path", self.path("base"),
             "--output_dir", self.path("base-special")],
        )  # fmt: skip
        self.stage(
            "cold-start traces, filtered and reported",
            "cold_start",
            [*PYTHON, "scripts/generate_cold_start.py", "--config", str(RECIPES / "cold_start.yaml"),
             "--dataset_name", self.path("data", "cold_start.jsonl"), "--student_tokenizer", self.path("base-special"),
             "--output_dir", self.path("cold-start"), "--seed", str(self.seed), *self.extra("cold_start")],
        )  # fmt: skip
        self.stage(
            "SFT on the traces (Unseen)",
            "sft",
            [*ACCELERATE, "scripts/sft.py", "--config", str(RECIPES / "sft.yaml"),
             "--model_name_or_path", self.path("base-special"),
             "--dataset_name", self.path("cold-start", "train.parquet"), "--output_dir", self.path("sft"),
             "--seed", str(self.seed), *self.extra("sft")],
        )  # fmt: skip

    def grpo(self, output: str, reward: str | None = None, title: str = "GRPO, fork-join rollouts") -> None:
        rewards = ["--reward_funcs", reward] if reward else []
        self.stage(
            title,
            output.replace("/", "-"),
            [*ACCELERATE, "scripts/grpo.py", "--config", str(RECIPES / "grpo.yaml"),
             "--model_name_or_path", self.path("sft"), "--dataset_name", self.path("data", "rl.jsonl"),
             "--output_dir", self.path(output), "--seed", str(self.seed), *rewards, *self.extra("grpo")],
        )  # fmt: skip

    def evaluate(self, model: str, label: str, plain: bool = False) -> str:
        folder = self.path("eval", label)
        k = 2 if self.quick else 4
        self.stage(
            f"evaluate {label} on the held-out problems",
            f"eval-{label}",
            [*PYTHON, "scripts/evaluate.py", "--config", str(RECIPES / "eval.yaml"),
             "--model_name_or_path", self.path(model), "--label", label, "--output_dir", folder,
             "--benchmarks", f"{self.path('data', 'test.jsonl')}@{k}", "--seed", str(self.seed),
             *(["--rollout_mode", "plain"] if plain else []), *self.extra("eval")],
        )  # fmt: skip
        return folder

    # ------------------------------------------------------------------------------------------- the two jobs

    def run(self) -> None:
        self.prepare()
        self.grpo("grpo")
        folders = [self.evaluate("base-special", "base", plain=True), self.evaluate("sft", "sft")]
        folders.append(self.evaluate("grpo", "grpo"))
        results = self.path("results")
        self.stage(
            "the table and the plots",
            "plots",
            [*PYTHON, "scripts/plot.py", "--evaluations", *folders,
             "--trainer_state", self.path("grpo", "trainer_state.json"), "--output_dir", results],
        )  # fmt: skip
        paths = path_report({label: self.path("eval", label) for label in ("sft", "grpo")})
        (Path(results) / "paths.md").write_text(paths + "\n")
        self.summary(Path(results) / "table.md", ["base-special", "sft", "grpo"], self.out / "timings.md")

    def ablation(self) -> None:
        if (self.out / "sft" / "config.json").exists():
            print(f"Starting from the SFT model in {self.path('sft')} (delete it to redo the stages before GRPO)")
        else:
            self.prepare()
        rows = []
        for name, reward in ABLATION.items():
            self.grpo(f"ablation/{name}", reward, title=f"GRPO with the {name} reward")
            folder = self.evaluate(f"ablation/{name}", f"ablation-{name}")
            rows.append((name, json.loads((Path(folder) / "results.json").read_text())))
        table = ablation_table(rows)
        path = self.out / "ablation" / "table.md"
        path.write_text(table + "\n")
        self.summary(path, [f"ablation/{name}" for name in ABLATION], path.with_name("timings.md"))

    def summary(self, table: Path, models: list[str], timings: Path) -> None:
        """Write the `timings` file; print the table, the timings and where everything is."""
        lines = ["| Stage | Seconds |", "|---|---|"] + [f"| {t} | {s:.0f} |" for t, s in self.timings]
        lines.append(f"| **total** | **{sum(s for _, s in self.timings):.0f}** |")
        timings.write_text("\n".join(lines) + "\n")
        print("\n" + " Done ".center(100, "="))
        print(table.read_text())
        if (paths := table.with_name("paths.md")).exists():
            print(paths.read_text())
        print("\n".join(lines))
        print(f"\nTable:   {table}")
        if plots := sorted(table.parent.glob("*.png")):
            print(f"Plots:   {', '.join(str(plot) for plot in plots)}")
        print(f"Models:  {', '.join(self.path(model) for model in models)}")
        print(f"Data:    {self.path('data')}, cold-start report {self.path('cold-start', 'report.md')}")
        print(f"Logs:    {self.logs}/")


def ablation_table(rows: list) -> str:
    """One row per reward: accuracy (mean@k / pass@k) and parallel ratio on the held-out problems, next to the
    paper's parallel ratio for the same reward."""
    lines = [
        "| Reward | mean@k % | pass@k % | Parallel % | Paper's parallel % |",
        "|---|---|---|---|---|",
    ]
    for name, results in rows:
        ((_, metrics),) = results["benchmarks"].items()
        k = metrics["samples"]
        lines.append(
            f"| {name} | {100 * metrics[f'mean@{k}']:.1f} | {100 * metrics[f'pass@{k}']:.1f} "
            f"| {100 * metrics['parallel_ratio']:.1f} | {PAPER_RATIOS[name]} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="outputs/demo", help="where every stage writes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every stage (the data split is fixed)")
    parser.add_argument("--quick", action="store_true", help="a few steps per stage (a smoke test, not a result)")
    parser.add_argument("--ablation", action="store_true", help="GRPO with three rewards from the same SFT model")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    demo = Demo(Path(args.output_dir).resolve(), args.seed, args.quick)
    demo.ablation() if args.ablation else demo.run()


if __name__ == "__main__":
    main()
