"""Trainer overhead: a `ParallelGRPOTrainer` step against a stock TRL `GRPOTrainer` step on the same workload.

    python benchmarks/bench_trainer.py [--threads 1] [--steps 30] [--attention isolated|causal|tree]

The workload is the same for every trainer: the tiny Qwen3 of `parallel_r1.testing.tiny`, changed so that it never
samples a tag or EOS, GSM8K prompts in the `plain` template, and a reward that reads only the text's length; so
every completion is plain text of exactly `--completion-length` tokens, with no block (checked from the logs):
- stock: TRL's `GRPOTrainer` (TRL's generation, TRL's fused log-prob head);
- plain: `ParallelGRPOTrainer(rollout_mode="plain", attention="causal")` (TRL's generation through the subclass);
- fork: `ParallelGRPOTrainer(rollout_mode="fork")` (the fork-join engine on the transformers backend, the tag
  grammar in the sampler and in the log-prob forward, the `--attention` structure, the shape and sampler-gap
  metrics).

A step is one optimizer step (generation, rewards, loss, backward, AdamW), timed from the trainer's
`on_step_begin` to its `on_step_end`; the generate-and-score call inside it is timed on its own. All trainers
run in one process, each `train()` in a thread of its own, and take their steps in turns (stock, plain, fork,
stock, ...; one runs at a time), so a neighbour's load slows them alike. `--warmup` steps each are not timed.
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
import trl
from bench_common import cpu_machine, write_results
from transformers import PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from parallel_r1.configs import ParallelGRPOConfig
from parallel_r1.data import DataArguments, load_problems
from parallel_r1.tags.language import TAGS
from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.tiny import build_model, build_tokenizer, pin_logits
from parallel_r1.trainers import ParallelGRPOTrainer

logger = logging.getLogger("bench_trainer")
SUPPRESSION = 20.0  # how far below zero the tags' and EOS's logits are pushed, in units of that coordinate
TARGET = 1.10  # the step-time ratio to stock TRL the trainer-overhead issue asks for
TRAINERS = ("stock", "plain", "fork")


def endless_model(tokenizer, hidden: int, layers: int, seed: int = 0):
    """The tiny Qwen3, changed so that it never samples a tag or EOS: plain text up to the length cap.

    `tiny.pin_logits` holds the logits of the tags and EOS at -SUPPRESSION times a positive constant everywhere.
    """
    model = build_model(
        tokenizer,
        tie_word_embeddings=False,
        seed=seed,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32,
    )
    stops = [tag_vocab(tokenizer).ids[tag] for tag in TAGS] + [tokenizer.eos_token_id]
    pin_logits(model, dict.fromkeys(stops, -SUPPRESSION))
    return model


def length_reward(completions, **kwargs) -> list[float]:
    """Reads the text only (no structure), with spread inside every group so that the loss is not zero."""
    return [float(len(c[0]["content"]) % 7) for c in completions]


class Turns:
    """Trainers training in threads of their own take their steps in turns: one step each, in a fixed order."""

    def __init__(self, names):
        self.order, self.current = list(names), 0
        self.changed = threading.Condition()

    def wait(self, name: str) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.order[self.current] == name)

    def pass_on(self, name: str) -> None:
        with self.changed:
            self.current = (self.order.index(name) + 1) % len(self.order)
            self.changed.notify_all()

    def leave(self, name: str) -> None:
        with self.changed:
            if name in self.order:
                at = self.order.index(name)
                del self.order[at]
                self.current -= at < self.current
                self.current = self.current % len(self.order) if self.order else 0
                self.changed.notify_all()


class StepClock(TrainerCallback):
    """Wall seconds of each optimizer step and of the generate-and-score call inside it; between two steps it
    hands the turn to the next trainer and waits for its own (outside the timed span)."""

    def __init__(self, name: str, trainer, turns: Turns):
        self.name, self.turns = name, turns
        self.steps, self.generation = [], []
        generate = trainer._generate_and_score_completions

        def timed(inputs):
            start = time.perf_counter()
            output = generate(inputs)
            self.generation.append(time.perf_counter() - start)
            return output

        trainer._generate_and_score_completions = timed

    def on_train_begin(self, args, state, control, **kwargs):
        self.turns.wait(self.name)

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(time.perf_counter() - self._start)
        self.turns.pass_on(self.name)
        self.turns.wait(self.name)


def make_trainer(kind: str, tokenizer, dataset, args, out: str):
    settings = dict(
        output_dir=out,
        per_device_train_batch_size=args.batch,
        num_generations=args.generations,
        max_completion_length=args.completion_length,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    model = endless_model(tokenizer, args.hidden, args.layers)
    if kind == "stock":
        trainer_class, config = GRPOTrainer, GRPOConfig(**settings)
    else:
        trainer_class = ParallelGRPOTrainer
        structure = (
            dict(rollout_mode="plain", attention="causal") if kind == "plain" else dict(attention=args.attention)
        )
        budgets = dict(max_path_tokens=args.completion_length // 4, max_summary_tokens=args.completion_length // 8)
        config = ParallelGRPOConfig(**settings, **structure, **budgets)
    return trainer_class(
        model=model, reward_funcs=[length_reward], args=config, processing_class=tokenizer, train_dataset=dataset
    )


def check_workload(kind: str, trainer, length: int) -> None:
    """Every completion of every step was `length` tokens long, and none opened a block."""
    logs = [entry for entry in trainer.state.log_history if "completions/mean_length" in entry]
    for entry in logs:
        if entry["completions/min_length"] != length or entry["completions/clipped_ratio"] != 1:
            raise RuntimeError(f"{kind}: completions are not all {length} tokens: {entry}")
        if entry.get("parallel/ratio", 0.0) != 0.0:
            raise RuntimeError(f"{kind}: some completion opened a block: {entry}")


def train_in_turns(trainers: dict, turns: Turns) -> None:
    """Train every trainer in a thread of its own, their steps taken in turns; re-raise the first failure."""
    failures = []

    def train(name: str, trainer) -> None:
        try:
            trainer.train()
        except BaseException as error:  # handed to the main thread, which re-raises it
            failures.append(error)
        finally:
            turns.leave(name)

    threads = [threading.Thread(target=train, args=item) for item in trainers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def report(times: dict, args, command: str) -> str:
    stock = times["stock"]["steps"]
    lines = [
        "# Trainer overhead: a ParallelGRPOTrainer step vs a stock GRPOTrainer step",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {cpu_machine()}; Python {platform.python_version()}, "
        f"transformers {transformers.__version__}, TRL {trl.__version__}.",
        f"Command: `{command}`.",
        "",
        f"Workload: the tiny Qwen3 (hidden {args.hidden}, {args.layers} layers), never sampling a tag or EOS; "
        f"{args.batch} completions a step ({args.batch // args.generations} GSM8K prompts, `plain` template, x "
        f"{args.generations}), every one exactly {args.completion_length} tokens with no block (checked); a reward on "
        f"the text's length; AdamW, fp32, CPU. The trainers take their steps in turns (one step each, in threads), "
        f"{args.warmup} warm-up + {args.steps} timed steps each.",
        "",
        "- step s: median wall seconds of a step (min in brackets); `vs stock`: the ratio of the medians; `paired`: "
        "the median over k of step k's time / the stock trainer's step k (taken one after the other);",
        "- generate + score: median seconds of TRL's `_generate_and_score_completions` (the rollout, the rewards, "
        "the subclass's metrics and its sampler-gap forward); rest: median over the steps of the step minus that "
        "(loss forward, backward, optimizer).",
        "",
        "| trainer | step s | vs stock | paired | generate + score s | rest s |",
        "|---|---|---|---|---|---|",
    ]
    names = {
        "stock": "stock `GRPOTrainer`",
        "plain": "`ParallelGRPOTrainer`, rollout_mode plain (causal)",
        "fork": f"`ParallelGRPOTrainer`, rollout_mode fork ({args.attention})",
    }
    ratios = {}
    for kind in args.trainers:
        steps, generation = times[kind]["steps"], times[kind]["generation"]
        step, gen = statistics.median(steps), statistics.median(generation)
        rest = statistics.median(t - g for t, g in zip(steps, generation))
        ratios[kind] = step / statistics.median(stock)
        paired = statistics.median(t / s for t, s in zip(steps, stock))
        lines.append(
            f"| {names[kind]} | {step:.3f} ({min(steps):.3f}) | {ratios[kind]:.2f}x | {paired:.2f}x "
            f"| {gen:.3f} ({min(generation):.3f}) | {rest:.3f} |"
        )
    lines.append("")
    for kind in args.trainers[1:]:
        verdict = "met" if ratios[kind] <= TARGET else "not met"
        lines.append(f"- {kind}: target <= {TARGET:.2f}x: {verdict} ({ratios[kind]:.2f}x, ratio of the medians)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    parser.add_argument("--attention", default="isolated", choices=["isolated", "causal", "tree"], help="for fork")
    parser.add_argument("--batch", type=int, default=8, help="completions per step")
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt")
    parser.add_argument("--completion-length", type=int, default=128, help="tokens in every completion")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed steps at the start (at least 1: the trainers set up concurrently)",
    )
    parser.add_argument("--steps", type=int, default=30, help="timed steps per trainer")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trainer.md")
    args = parser.parse_args()
    args.trainers = [kind for kind in TRAINERS if kind == "stock" or kind in args.trainers]  # stock: the reference
    if args.batch % args.generations or args.hidden % 32:
        parser.error("--batch must be a multiple of --generations and --hidden of 32")
    for name in ("threads", "warmup", "steps", "completion_length", "layers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)

    tokenizer = build_tokenizer()
    prompts = (args.warmup + args.steps) * args.batch // args.generations
    dataset = load_problems(DataArguments(dataset_name="gsm8k"), "train", template="plain", limit=prompts)
    turns = Turns(args.trainers)
    with tempfile.TemporaryDirectory() as out:
        trainers, clocks = {}, {}
        for kind in args.trainers:
            trainers[kind] = make_trainer(kind, tokenizer, dataset, args, f"{out}/{kind}")
            clocks[kind] = StepClock(kind, trainers[kind], turns)
            trainers[kind].add_callback(clocks[kind])
            trainers[kind].remove_callback(PrinterCallback)  # the per-step log lines; the log history is kept
        train_in_turns(trainers, turns)
    times = {}
    for kind, trainer in trainers.items():
        check_workload(kind, trainer, args.completion_length)
        times[kind] = {
            "steps": clocks[kind].steps[args.warmup :],
            "generation": clocks[kind].generation[args.warmup :],
        }
        logger.info("%s: steps %s", kind, ", ".join(f"{t:.3f}" for t in times[kind]["steps"]))

    command = " ".join(["python benchmarks/bench_trainer.py", *sys.argv[1:]])
    text = report(times, args, command)
    write_results(args.out, text)


if __name__ == "__main__":
    main()
