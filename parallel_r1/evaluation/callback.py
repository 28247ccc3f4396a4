"""Evaluation during GRPO training: every `parallel_eval_steps` optimizer steps, the current weights answer a
fixed subset of benchmark problems with the training rollout, and the numbers go into the trainer's log.

Logged under `eval/<benchmark>/`: mean@k, pass@k, parallel_ratio, format_valid, block_position and
critical_over_total (definitions in `metrics`), next to the training metrics of the same step. The problems are
the first `parallel_eval_problems` of each benchmark's test split in the run's prompt template, spread over
the processes; sampling uses the transformers backend on the gathered weights (also in vLLM runs, whose engine
holds the weights of the last generation), as many streams at once as a training generation, with a seed of its
own per step (`evaluation_rollouts`), so the training's random stream is not touched. Every process makes the
same number of generation calls, as ZeRO-3's gathering needs.
"""

from __future__ import annotations

import zlib

from accelerate.utils import gather_object
from transformers import TrainerCallback

from ..data import DataArguments, load_problems, prompt_ids
from . import records as rec
from .config import parse_benchmarks
from .metrics import summarize

LOGGED = ("parallel_ratio", "format_valid", "block_position", "critical_over_total")


class InTrainingEvaluation(TrainerCallback):
    def __init__(self, trainer):
        """The benchmarks, problems and template of `trainer.args` (`parallel_eval_benchmarks`,
        `parallel_eval_problems`, `prompt_template`)."""
        self.trainer = trainer
        args, processes = trainer.args, trainer.accelerator.num_processes
        self.batch = args.per_device_train_batch_size * args.steps_per_generation  # a training generation's streams
        self.items, self.rows, self.prompts = [], {}, {}
        for name, k in parse_benchmarks(args.parallel_eval_benchmarks):
            problems = load_problems(
                DataArguments(dataset_name=name),
                "test",
                template=args.prompt_template,
                limit=args.parallel_eval_problems,
            )
            for i, row in enumerate(problems):
                self.rows[name, i] = rec.problem_record(name, i, row)
                self.prompts[name, i] = row["prompt"]
                self.items += [(name, i, s) for s in range(k)]
        share = -(-len(self.items) // processes)  # the largest share of one process
        self.calls = max(1, -(-share // self.batch))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.parallel_eval_steps != 0:
            return
        trainer = self.trainer
        tokenizer = trainer.processing_class
        with trainer.accelerator.split_between_processes(self.items) as mine:
            prompts = [prompt_ids(tokenizer, self.prompts[n, i]) for n, i, _ in mine]
            seed = zlib.crc32(f"{args.seed}/{state.global_step}/{trainer.accelerator.process_index}".encode())
            # every process runs the same number of calls (an empty share too): ZeRO-3 gathers the weights in each
            rollouts = []
            for start in range(0, self.calls * self.batch, self.batch):
                rollouts += trainer.evaluation_rollouts(prompts[start : start + self.batch], seed + start)
            records = [rec.score(self.rows[n, i], s, r, trainer.policy) for (n, i, s), r in zip(mine, rollouts)]
        summary = summarize(gather_object(records))
        metrics = trainer._metrics["train"]
        for name, values in summary["benchmarks"].items():
            k = values["samples"]
            for key in (f"mean@{k}", f"pass@{k}", *LOGGED):
                metrics[f"eval/{name}/{key}"].append(values[key])
