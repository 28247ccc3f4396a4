"""The whole Parallel-R1 method in miniature, on 2 CPU cores: every stage is one of the project's scripts (or TRL's),
run as a user would run it at scale, on the task of `parallel_r1.testing.demo.task`.

    python scripts/demo.py                      # make demo: the method against its baseline (13-14 min, ~15 with the install)
    python scripts/demo.py --paper              # make demo-paper: every row and experiment of the paper (about 30 min)
    python scripts/demo.py --width              # make demo-width: RL moves the width the model chooses
    python scripts/demo.py --matched            # make demo-matched: also plain GRPO given as many tokens (about 35 min)
    python scripts/demo.py --vote --matched     # make demo-vote: the same with a summary trained to vote (about 25 min)
    python scripts/demo.py --strong             # make demo-strong: the strongest plain recipe and cons@k (about 40 min)
    python scripts/demo.py --strong --variant two-digit   # make demo-strong-two-digit: the same on the harder task
    python scripts/demo.py --quick --output_dir /tmp/demo   # a few steps per stage (what the test runs)

Stages of `make demo` (recipes in recipes/demo/, all outputs under --output_dir, one log per stage in its logs/):
  1. data and an untrained base       python -m parallel_r1.testing.demo.task
  2. pretrain the base                TRL's own SFT script on plain step-by-step solutions
  3. add the tags                     scripts/add_special_tokens.py
  4. cold-start traces                scripts/generate_cold_start.py (the task's programmatic teacher)
  5. SFT, Unseen                      scripts/sft.py
  6. GRPO without blocks              scripts/grpo.py with recipes/demo/grpo_plain.yaml, from the base (the baseline)
  7. Parallel-R1                      scripts/grpo.py with recipes/demo/grpo.yaml: fork-join rollouts, the S2 reward
  8. evaluation and plots             scripts/evaluate.py on base, plain GRPO, SFT and Parallel-R1; scripts/plot.py
`--matched` adds plain GRPO with three times the completions a step (24 a problem, not 8: about as many trained
tokens as Parallel-R1's three-path completions), from the base and from a plain SFT on the teacher's plain solutions
(cold start and SFT without blocks), all evaluated: results/matched/table.md and results/sft-plain/table.md (every
model against each, paired by problem) and results/tokens.md (the tokens each RL run trained on).
`--vote` trains the summary to vote: a cold start where two answers in three are vote drills (`task.vote_teacher`), and
an SFT four times as long whose summaries weigh ten times in the loss and whose split blocks train no path
(`VOTE_SFT`); with `--matched`, the plain SFT gets as many steps.
`--strong` runs the arms of `parallel_r1.testing.demo.strong` from one base: a plain SFT (STRONG_PLAIN_SFT steps),
continued plainly for STRONG_PARALLEL_SFT steps and then plain GRPO 3x (arm a, whose samples also give the
self-consistency rows, b), and from the same first stage a parallel cold start and SFT of STRONG_PARALLEL_SFT steps
with --vote's rules, then Parallel-R1 (arm c): results/strong/arms.md, stages.md, votes.md and tokens.md. With
`--strong_start blocks`, arm (c)'s parallel SFT continues instead from an SFT of STRONG_PLAIN_SFT steps on the same
plain solutions, each written as a block of identical attempts (`task.block_teacher`; docs/demo.md has both designs).
`--variant two-digit` gives the task's first factor two digits (`17*8+3*4`, `task.VARIANTS`), with the same recipes:
`make demo-strong-two-digit` runs --strong on it, where the plain arm is well below 100%.
`--base_from DIR` takes the data and the base with its tags from another run's folder instead of making them (so that
two jobs compare from one base: the 2-process pretraining is not reproducible across runs).
`--paper` adds Seen SFT and RL, Unseen S1 and the tiered-only reward, the mid-training scaffold, and paper_table.md.
`--width` runs stages 1-3, a cold start with blocks of 2 to 4 attempts, SFT with min_paths 2 and max_paths 4, and the
three RL runs of `parallel_r1.testing.demo.width` (width/table.md, width/paths_per_block.png).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from parallel_r1.durable import read_lines
from parallel_r1.testing.demo import strong
from parallel_r1.testing.demo.paper import PAPER_ROWS, RL_RUNS, drift, paper_table, plot_drift
from parallel_r1.testing.demo.task import DEFAULT_VARIANT, VARIANTS, token_table, vote_report
from parallel_r1.testing.demo.width import WIDTH_RUNS, curve_table, plot_width, width_table

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
# A few steps per stage: the shape of the demo in a minute or two, for the test suite
QUICK = {
    "base": ["--max_steps", "8", "--per_device_train_batch_size", "16", "--logging_steps", "4"],
    "cold_start": ["--max_train_samples", "24"],
    "sft": ["--max_steps", "4", "--per_device_train_batch_size", "8", "--logging_steps", "2"],
    "grpo": [
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        "--num_generations",
        "4",
        "--logging_steps",
        "1",
    ],
    "eval": ["--max_problems", "6"],
}
QUICK_SAMPLES = 4  # the quick run's samples a held-out problem: enough for --strong's cons@3
MATCHED_GROUPS = 3  # the matched baseline's completions a step, as a multiple of the recipe's
MATCHED = "grpo-plain-matched"  # its label and folder
PLAIN_SFT_MATCHED = "grpo-sft-plain-matched"  # the same from a plain SFT on the teacher's plain solutions
MATCHED_MODELS = (MATCHED, "sft-plain", PLAIN_SFT_MATCHED)  # the models --matched adds, each evaluated plainly
STRONG_PLAIN = "grpo-strong-plain"  # --strong's arm (a)
# --vote: the cold start's teacher (two answers in three a vote drill, kept when the slipped majority wins) and SFT
VOTE_COLD_START = ("--model_name_or_path", "parallel_r1.testing.demo.task:vote_teacher", "--num_samples", "3",
                   "--require_correct", "false")  # fmt: skip
VOTE_SFT_STEPS = 2400  # four times sft.yaml's: the paths learn their arithmetic while the summary learns to count
VOTE_SFT = ("--summary_loss_weight", "10", "--disagreeing_paths_in_loss", "false")
# --strong: the plain SFT both arms start from, and the second SFT stage each arm adds (plain, or the parallel one)
STRONG_PLAIN_SFT = VOTE_SFT_STEPS  # where make demo-vote's plain SFT is right 96-97% of the time
STRONG_PARALLEL_SFT = 2400  # 600 left the paths at 78-79% (docs/demo.md); 2,400: 93%
# --strong_start: what arm (c)'s parallel SFT continues from, the folder and its name in a stage's title; the first
# is the default
STRONG_STARTS = {"plain": ("sft-plain", "the plain SFT"), "blocks": ("sft-blocks", "the block SFT")}
TRACKIO_PROJECT = "parallel-r1-demo"  # the one trackio project every training stage logs to


def clock(seconds: float) -> str:
    """A duration as people read it: `45 s`, `3 min 07 s`."""
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


class Demo:
    """Runs the stages in order into one folder, each with a banner, its output shown and kept in logs/."""

    def __init__(
        self,
        output_dir: Path,
        seed: int,
        quick: bool,
        rl_steps: int | None = None,
        matched: bool = False,
        vote: bool = False,
        base_from: Path | None = None,
        strong_start: str | None = None,
        variant: str = DEFAULT_VARIANT,
    ):
        self.out, self.seed, self.quick, self.rl_steps, self.matched = output_dir, seed, quick, rl_steps, matched
        self.vote, self.base_from, self.strong_start, self.variant = vote, base_from, strong_start, variant
        self.logs = output_dir / "logs"
        self.timings: list[tuple[str, float]] = []
        self.count = 0
        self.started = time.monotonic()

    def path(self, *parts) -> str:
        return str(self.out.joinpath(*parts))

    def stage(self, title: str, name: str, command: list) -> None:
        """Run one stage; its output goes to the console and to logs/<name>.log. A failure stops the demo."""
        self.count += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        banner = f" Stage {self.count}: {title} ({clock(time.monotonic() - self.started)} in) "
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
        print(f"\n-- {title}: {clock(elapsed)} (the demo: {clock(time.monotonic() - self.started)})", flush=True)

    def extra(self, stage: str) -> list:
        return QUICK[stage] if self.quick else []

    def tracking(self, run: str) -> list:
        """A training stage's flags to log to the demo's trackio project as run `run` (its output's name)."""
        return ["--report_to", "trackio", "--project", TRACKIO_PROJECT, "--run_name", run]

    # ------------------------------------------------------------------------------------------- the stages

    def prepare(self) -> None:
        self.prepare_base()
        self.prepare_parallel()

    def prepare_parallel(self) -> None:
        """The cold start and the Unseen SFT of the parallel model (with --vote, its summary trained to vote)."""
        if self.vote:
            self.cold_start("cold-start", "cold-start traces, two in three vote drills", VOTE_COLD_START)
            self.sft("sft", "SFT on the traces (Unseen), the summary trained to vote", (*self.sft_steps(), *VOTE_SFT))
        else:
            self.cold_start("cold-start")
            self.sft("sft", "SFT on the traces (Unseen)")

    def sft_steps(self) -> tuple:
        """The SFT steps of this run as flags: --vote's, else none (the recipe's)."""
        return ("--max_steps", str(VOTE_SFT_STEPS)) if self.vote else ()

    def prepare_base(self) -> None:
        if self.base_from:
            for part in ("data", "base-special"):
                shutil.copytree(self.base_from / part, self.out / part, dirs_exist_ok=True)
            print(f"data and base with its tags copied from {self.base_from}", flush=True)
            return
        self.stage(
            "data and an untrained base",
            "data",
            [*PYTHON, "-m", "parallel_r1.testing.demo.task", str(self.out), "--seed", str(self.seed),
             "--variant", self.variant],
        )  # fmt: skip
        self.stage(
            "pretrain the base on plain solutions (TRL's SFT script)",
            "base",
            [*ACCELERATE, "-m", "trl.scripts.sft", "--config", str(RECIPES / "base.yaml"),
             "--model_name_or_path", self.path("base-init"), "--dataset_name", self.path("data", "pretrain"),
             "--output_dir", self.path("base"), "--seed", str(self.seed), *self.tracking("base"),
             *self.extra("base")],
        )  # fmt: skip
        self.stage(
            "add the six tags",
            "tags",
            [*PYTHON, "scripts/add_special_tokens.py", "--model_name_or_path", self.path("base"),
             "--output_dir", self.path("base-special")],
        )  # fmt: skip

    def cold_start(self, output: str, title: str = "cold-start traces, filtered and reported", extra=()) -> None:
        self.stage(
            title,
            output.replace("-", "_"),
            [*PYTHON, "scripts/generate_cold_start.py", "--config", str(RECIPES / "cold_start.yaml"),
             "--dataset_name", self.path("data", "cold_start.jsonl"), "--student_tokenizer", self.path("base-special"),
             "--output_dir", self.path(output), "--seed", str(self.seed), *extra, *self.extra("cold_start")],
        )  # fmt: skip

    def sft(self, output: str, title: str, extra: tuple = (), traces: str = "cold-start",
            start: str = "base-special") -> None:  # fmt: skip
        self.stage(
            title,
            output,
            [*ACCELERATE, "scripts/sft.py", "--config", str(RECIPES / "sft.yaml"),
             "--model_name_or_path", self.path(start),
             "--dataset_name", self.path(traces, "train.parquet"), "--output_dir", self.path(output),
             "--seed", str(self.seed), *self.tracking(output), *extra, *self.extra("sft")],
        )  # fmt: skip

    def grpo(self, output: str, reward: str | tuple | None = None, title: str = "Parallel-R1: GRPO, fork-join rollouts",
             start: str = "sft", recipe: str = "grpo.yaml", extra: tuple = (), data: str = "rl.jsonl") -> None:  # fmt: skip
        rewards = ["--reward_funcs", *([reward] if isinstance(reward, str) else reward)] if reward else []
        budget = ["--max_steps", str(self.rl_steps)] if self.rl_steps else []
        self.stage(
            title,
            output.replace("/", "-"),
            [*ACCELERATE, "scripts/grpo.py", "--config", str(RECIPES / recipe),
             "--model_name_or_path", self.path(start), "--dataset_name", self.path("data", data),
             "--output_dir", self.path(output), "--seed", str(self.seed), *rewards, *budget,
             *self.tracking(output.replace("/", "-")), *self.extra("grpo"), *extra],
        )  # fmt: skip

    def grpo_plain(self) -> None:
        """The baseline: GRPO without blocks from the base, with the budget of the parallel run."""
        self.grpo("grpo-plain", title="GRPO without blocks (the baseline)", start="base-special",
                  recipe="grpo_plain.yaml")  # fmt: skip

    def matched_controls(self) -> None:
        """The baselines given Parallel-R1's tokens: plain GRPO with MATCHED_GROUPS times the completions a problem
        and a step (the same problems, steps and learning rate; a three-path completion holds about three plain
        ones), from the base, and from a plain SFT on the teacher's plain solutions (the control for what the cold
        start's correct traces teach, blocks aside)."""
        self.grpo(MATCHED, title=f"GRPO without blocks, {MATCHED_GROUPS}x the completions a step",
                  start="base-special", recipe="grpo_plain.yaml", extra=self.matched_flags())  # fmt: skip
        self.plain_sft_control()

    def matched_flags(self) -> tuple:
        generations, batch = self.plain_setting("num_generations"), self.plain_setting("per_device_train_batch_size")
        return ("--num_generations", str(MATCHED_GROUPS * generations),
                "--per_device_train_batch_size", str(MATCHED_GROUPS * batch))  # fmt: skip

    def plain_sft_control(self) -> None:
        """A plain SFT on the teacher's plain solutions, as many steps as the parallel SFT, then plain GRPO with
        MATCHED_GROUPS times the completions."""
        self.cold_start("cold-start-plain", "cold-start traces without blocks (the teacher's plain solutions)",
                        ("--model_name_or_path", "parallel_r1.testing.demo.task:plain_teacher"))  # fmt: skip
        self.sft("sft-plain", "SFT on them (no blocks)", ("--attention", "causal", *self.sft_steps()),
                 traces="cold-start-plain")  # fmt: skip
        self.grpo(PLAIN_SFT_MATCHED, title=f"GRPO without blocks from that SFT, {MATCHED_GROUPS}x the completions",
                  start="sft-plain", recipe="grpo_plain.yaml", extra=self.matched_flags())  # fmt: skip

    def matched_tables(self, folders: list, results: Path) -> None:
        """Every model against each matched baseline, paired by problem, and the tokens of each RL run."""
        for baseline, folder in ((MATCHED, "matched"), (PLAIN_SFT_MATCHED, "sft-plain")):
            self.stage(
                f"every model against {baseline}",
                f"plots-{folder}",
                [*PYTHON, "scripts/plot.py", "--evaluations", *folders, "--baseline", baseline,
                 "--output_dir", str(results / folder)],
            )  # fmt: skip
        runs = {label: self.out / label / "trainer_state.json" for label in ("grpo-plain", MATCHED, PLAIN_SFT_MATCHED)}
        runs["parallel-r1"] = self.out / "grpo" / "trainer_state.json"
        (results / "tokens.md").write_text(token_table(runs) + "\n")

    def evaluate(self, model: str, label: str, plain: bool = False, flags: tuple = ()) -> str:
        folder = self.path("eval", label)
        k = QUICK_SAMPLES if self.quick else self.samples()
        self.stage(
            f"evaluate {label} on the held-out problems",
            f"eval-{label}",
            [*PYTHON, "scripts/evaluate.py", "--config", str(RECIPES / "eval.yaml"),
             "--model_name_or_path", self.path(model), "--label", label, "--output_dir", folder,
             "--benchmarks", f"{self.path('data', 'test.jsonl')}@{k}", "--seed", str(self.seed),
             *(["--rollout_mode", "plain"] if plain else []), *flags, *self.extra("eval")],
        )  # fmt: skip
        return folder

    # ------------------------------------------------------------------------------------------- the two jobs

    def run(self) -> None:
        self.prepare()
        self.grpo_plain()
        if self.matched:
            self.matched_controls()
        self.grpo("grpo")
        folders = [
            self.evaluate("base-special", "base", plain=True),
            self.evaluate("grpo-plain", "grpo-plain", plain=True),
            *[self.evaluate(model, model, plain=True) for model in (MATCHED_MODELS if self.matched else ())],
            self.evaluate("sft", "sft"),
            self.evaluate("grpo", "parallel-r1"),
        ]
        results = Path(self.path("results"))
        self.stage(
            "the table and the plots",
            "plots",
            [*PYTHON, "scripts/plot.py", "--evaluations", *folders,
             "--trainer_state", self.path("grpo", "trainer_state.json"), "--baseline", "grpo-plain",
             "--output_dir", str(results)],
        )  # fmt: skip
        models = ["base-special", "grpo-plain", "sft", "grpo"]
        if self.matched:
            self.matched_tables(folders, results)
            models[2:2] = MATCHED_MODELS
        votes = vote_report({label: self.path("eval", label) for label in ("sft", "parallel-r1")})
        (results / "votes.md").write_text(votes + "\n")
        self.summary(results / "table.md", models, self.out / "timings.md")

    def paper(self) -> None:
        """Every row and experiment of the paper from one base, with the same RL budget for every run."""
        self.prepare()
        self.sft("sft-seen", "SFT on the traces (Seen)", extra=("--attention", "causal"))
        self.grpo_plain()
        half = str(self.steps() // 2)
        self.grpo("grpo", title="Parallel-R1-Unseen S2 (alternating reward)",
                  extra=("--save_strategy", "steps", "--save_steps", half))  # fmt: skip
        self.grpo("paper/s1", "accuracy", title="Parallel-R1-Unseen S1 (accuracy reward)")
        self.grpo("paper/tiered", "tiered", title="Parallel-R1-Unseen, tiered reward (the ablation)")
        self.grpo("paper/seen", "accuracy", title="Parallel-R1-Seen (causal, sequential rollouts)", start="sft-seen",
                  extra=("--attention", "causal", "--rollout_mode", "sequential"))  # fmt: skip
        self.grpo("paper/mid-training", "accuracy", title="Mid-training, phase B: accuracy from S2's halfway point",
                  start=f"grpo/checkpoint-{half}", extra=("--max_steps", half, "--epsilon_high", "0.2"))  # fmt: skip
        folders = {
            label: self.evaluate(model, label, plain, flags) for label, (model, plain, flags) in PAPER_ROWS.items()
        }
        results = {label: json.loads((Path(f) / "results.json").read_text()) for label, f in folders.items()}
        records = {label: read_lines(Path(f) / "completions.jsonl") for label, f in folders.items()}
        out = self.out / "paper"
        curves = {label: [self.out / PAPER_ROWS[label][0] / "trainer_state.json"] for label in RL_RUNS}
        curves["mid-training"].insert(0, self.out / "grpo" / f"checkpoint-{half}" / "trainer_state.json")
        drifts = drift(curves)
        plot_drift(curves, out / "block_position.png")
        (out / "paper_table.md").write_text(paper_table(results, drifts, records) + "\n")
        parallel = {label: folders[label] for label, (_, plain, _) in PAPER_ROWS.items() if not plain}
        (out / "votes.md").write_text(vote_report(parallel) + "\n")
        self.summary(out / "paper_table.md", [model for model, _, _ in PAPER_ROWS.values()], out / "timings.md")

    def width(self) -> None:
        """RL moves the width the model chooses: a cold start with blocks of 2 to 4 attempts, SFT that trains the
        choice (min_paths 2, max_paths 4), and the runs of `WIDTH_RUNS` from it, each with the same budget."""
        self.prepare_base()
        self.cold_start("cold-start-width", "cold-start traces with blocks of 2 to 4 attempts",
                        ("--model_name_or_path", "parallel_r1.testing.demo.task:varied_width_teacher"))  # fmt: skip
        self.sft("sft-width", "SFT on them (Unseen), the width a trained choice",
                 ("--min_paths", "2", "--max_paths", "4"), traces="cold-start-width")  # fmt: skip
        for label, (output, data, rewards) in WIDTH_RUNS.items():
            self.grpo(output, rewards, title=f"GRPO, the model chooses the width: {label}", start="sft-width",
                      recipe="grpo_width.yaml", data=data)  # fmt: skip
        states = {label: self.out / output / "trainer_state.json" for label, (output, _, _) in WIDTH_RUNS.items()}
        out = self.out / "width"
        plot_width(states, out / "paths_per_block.png")
        (out / "table.md").write_text(width_table(states) + "\n\n" + curve_table(states) + "\n")
        self.summary(out / "table.md", ["sft-width", *(output for output, _, _ in WIDTH_RUNS.values())],
                     out / "timings.md", cold_start="cold-start-width")  # fmt: skip

    def strong(self) -> None:
        """The arms of `parallel_r1.testing.demo.strong` from one base, the SFT budget the same for both sides."""
        self.prepare_base()
        self.cold_start("cold-start-plain", "cold-start traces without blocks (the teacher's plain solutions)",
                        ("--model_name_or_path", "parallel_r1.testing.demo.task:plain_teacher"))  # fmt: skip
        plain = ("--attention", "causal")
        self.sft("sft-plain", "plain SFT (where both arms start)",
                 (*plain, "--max_steps", str(STRONG_PLAIN_SFT)), traces="cold-start-plain")  # fmt: skip
        more = ("--max_steps", str(STRONG_PARALLEL_SFT))
        self.sft("sft-plain-more", "arm (a): the plain SFT continued, as many steps as arm (c)'s parallel SFT",
                 (*plain, *more), traces="cold-start-plain", start="sft-plain")  # fmt: skip
        self.grpo(STRONG_PLAIN, title=f"arm (a): plain GRPO from it, {MATCHED_GROUPS}x the completions",
                  start="sft-plain-more", recipe="grpo_plain.yaml", extra=self.matched_flags())  # fmt: skip
        start, named = STRONG_STARTS[self.strong_start or next(iter(STRONG_STARTS))]
        if start == "sft-blocks":
            self.cold_start("cold-start-blocks", "arm (c): the plain solutions, each as a block of identical attempts",
                            ("--model_name_or_path", "parallel_r1.testing.demo.task:block_teacher"))  # fmt: skip
            self.sft(start, "arm (c): SFT on them (Unseen), as many steps as the plain SFT",
                     ("--max_steps", str(STRONG_PLAIN_SFT)), traces="cold-start-blocks")  # fmt: skip
        self.cold_start("cold-start", "arm (c): cold-start traces, two in three vote drills", VOTE_COLD_START)
        self.sft("sft-parallel", f"arm (c): parallel SFT from {named} (--vote's rules)", (*more, *VOTE_SFT),
                 start=start)  # fmt: skip
        self.grpo("grpo", title="arm (c): Parallel-R1, fork-join rollouts", start="sft-parallel")
        folders = {
            "plain SFT": self.evaluate("sft-plain", "sft-plain", plain=True),
            "plain SFT, continued": self.evaluate("sft-plain-more", "sft-plain-more", plain=True),
            "(a) plain": self.evaluate(STRONG_PLAIN, STRONG_PLAIN, plain=True),
            **({"block SFT": self.evaluate("sft-blocks", "sft-blocks")} if start == "sft-blocks" else {}),
            "parallel SFT": self.evaluate("sft-parallel", "sft-parallel"),
            "(c) Parallel-R1": self.evaluate("grpo", "parallel-r1"),
        }
        results = self.out / "results" / "strong"
        strong.write(folders["(a) plain"], folders["(c) Parallel-R1"], results)
        (results / "stages.md").write_text(strong.stages_table(folders) + "\n")
        parallel = ("block SFT", "parallel SFT", "(c) Parallel-R1")
        votes = vote_report({label: folder for label, folder in folders.items() if label in parallel})
        (results / "votes.md").write_text(votes + "\n")
        runs = {STRONG_PLAIN: self.out / STRONG_PLAIN / "trainer_state.json"}
        runs["parallel-r1"] = self.out / "grpo" / "trainer_state.json"
        (results / "tokens.md").write_text(token_table(runs) + "\n")
        models = list(dict.fromkeys(["sft-plain", "sft-plain-more", STRONG_PLAIN, start, "sft-parallel", "grpo"]))
        self.summary(results / "arms.md", models, self.out / "timings.md")

    def steps(self) -> int:
        """GRPO's optimizer steps in this run: the quick run's, --rl_steps, or the recipe's."""
        if self.quick:
            return int(QUICK["grpo"][QUICK["grpo"].index("--max_steps") + 1])
        if self.rl_steps:
            return self.rl_steps
        return yaml.safe_load((RECIPES / "grpo.yaml").read_text())["max_steps"]

    def plain_setting(self, name: str) -> int:
        """An integer setting of the plain GRPO runs: the quick run's, else the plain recipe's."""
        quick = QUICK["grpo"]
        if self.quick and f"--{name}" in quick:
            return int(quick[quick.index(f"--{name}") + 1])
        return int(yaml.safe_load((RECIPES / "grpo_plain.yaml").read_text())[name])

    def samples(self) -> int:
        """Samples per held-out problem: the evaluation recipe's (its `benchmarks` entry is `file@k`)."""
        (benchmark,) = yaml.safe_load((RECIPES / "eval.yaml").read_text())["benchmarks"]
        return int(benchmark.rpartition("@")[2])

    def summary(self, table: Path, models: list[str], timings: Path, cold_start: str = "cold-start") -> None:
        """Write the `timings` file; print the table, the timings and where everything is."""
        lines = ["| Stage | Seconds |", "|---|---|"] + [f"| {t} | {s:.0f} |" for t, s in self.timings]
        lines.append(f"| **total** | **{sum(s for _, s in self.timings):.0f}** |")
        timings.write_text("\n".join(lines) + "\n")
        print("\n" + " Done ".center(100, "="))
        print(table.read_text())
        if (votes := table.with_name("votes.md")).exists():
            print(votes.read_text())
        print("\n".join(lines))
        print(f"\nTable:   {table}")
        if plots := sorted(table.parent.glob("*.png")):
            print(f"Plots:   {', '.join(str(plot) for plot in plots)}")
        print(f"Models:  {', '.join(self.path(model) for model in models)}")
        print(f"Data:    {self.path('data')}, cold-start report {self.path(cold_start, 'report.md')}")
        print(f"Logs:    {self.logs}/")
        trackio = Path(sys.executable).parent / "trackio"
        print(
            f"Curves:  TRACKIO_DIR={shlex.quote(str(self.out / 'trackio'))} {trackio} show --project {TRACKIO_PROJECT}"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="outputs/demo", help="where every stage writes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every stage (the data split is fixed)")
    parser.add_argument("--quick", action="store_true", help="a few steps per stage (a smoke test, not a result)")
    parser.add_argument("--paper", action="store_true", help="every row and experiment of the paper (make demo-paper)")
    parser.add_argument("--width", action="store_true", help="RL moves the width the model chooses (make demo-width)")
    parser.add_argument(
        "--matched",
        action="store_true",
        help="also plain GRPO with 3x the completions a step (Parallel-R1's tokens), from the base and from a plain SFT "
        "(make demo-matched)",
    )
    parser.add_argument(
        "--vote",
        action="store_true",
        help="train the summary to vote: vote drills in the cold start, a longer SFT that weighs the summary "
        "(make demo-vote, with --matched)",
    )
    parser.add_argument(
        "--strong",
        action="store_true",
        help="against the strongest plain recipe (a plain SFT as long, then plain GRPO 3x) and its self-consistency, "
        "at a latency (make demo-strong)",
    )
    parser.add_argument(
        "--strong_start",
        choices=list(STRONG_STARTS),
        default=None,
        help="--strong: what arm (c)'s parallel SFT continues from: the plain SFT arm (a) starts from (plain, the "
        "default), or an SFT as long on the same solutions, each written as a block of identical attempts (blocks)",
    )
    parser.add_argument(
        "--variant",
        choices=list(VARIANTS),
        default=None,
        help="the task of any job: a*b+c*d with digits 1-9 (one-digit, the default), or its harder variant whose "
        "first factor has two digits (two-digit)",
    )
    parser.add_argument(
        "--base_from",
        type=Path,
        default=None,
        help="take data/ and base-special/ from this earlier run's --output_dir instead of making them",
    )
    parser.add_argument(
        "--rl_steps",
        type=int,
        default=None,
        help="GRPO steps of every RL run, the same for all (default: the recipes' 120); 360 takes about 40 minutes",
    )
    args = parser.parse_args(argv)
    if args.rl_steps is not None and args.rl_steps < 2:
        parser.error(f"--rl_steps must be at least 2, got {args.rl_steps}")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if args.paper + args.width + args.matched + args.strong > 1:
        parser.error("--paper, --width, --matched and --strong are four jobs: run one at a time")
    if args.vote and (args.paper or args.width or args.strong):
        parser.error(
            "--vote changes the parallel SFT of make demo and --matched; --paper, --width and --strong keep theirs"
        )
    if args.strong_start and not args.strong:
        parser.error("--strong_start chooses a design of --strong: give --strong too")
    if args.base_from and args.variant:
        parser.error("--base_from takes the data of that run, and with it its variant: give one or the other")
    base_from = args.base_from.resolve() if args.base_from else None
    if base_from and not all((base_from / part).is_dir() for part in ("data", "base-special")):
        parser.error(
            f"--base_from {args.base_from}: no data/ and base-special/ there (a demo's --output_dir has both)"
        )
    demo = Demo(Path(args.output_dir).resolve(), args.seed, args.quick, args.rl_steps, args.matched, args.vote,
                base_from, args.strong_start, args.variant or DEFAULT_VARIANT)  # fmt: skip
    # Every training stage logs to one local trackio store in the output folder; a rerun starts it afresh (trackio
    # resumes a run of the same name, so old curves would go on under the new ones)
    os.environ["TRACKIO_DIR"] = str(demo.out / "trackio")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demo needs nothing from the Hub: no lookups, no telemetry
    shutil.rmtree(demo.out / "trackio", ignore_errors=True)
    demo.paper() if args.paper else demo.width() if args.width else demo.strong() if args.strong else demo.run()


if __name__ == "__main__":
    main()
