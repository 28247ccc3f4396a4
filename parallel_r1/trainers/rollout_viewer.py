"""GRPO's sampled completions as rollout viewer pages (`evaluation.viewer`), beside the completions tables TRL saves.

With `log_completions`, TRL saves the last generation's completions when it logs, as
`<output_dir>/completions/completions_<step>.parquet`; `RolloutViewer` writes `completions_<step>.html` beside each
one, from the same completions (TRL's `_logs`: the prompt, the completion with its tags, each reward, the advantage)
and what it keeps of each after every generation, gathered in TRL's order: the reference (the dataset's `answer`)
and the shape of the sampled ids (`ParallelPolicy.shape`: blocks, T, D). The answer and its correctness
(`answers.is_correct`, when there is a reference) are read when the page is written, on the main process. TRL's
rows come in groups of `num_generations` samples of one prompt: a completion is labelled by its group and sample.
A page shows a generation's first whole groups, up to `viewer_completions` (a big generation's page would be tens of
megabytes, and each completion is checked while the other processes wait); `viewer_completions: 0` writes none.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

from accelerate.utils import gather_object
from transformers import TrainerCallback

from ..answers import extract_answer, extract_reference, is_correct
from ..evaluation.viewer import write_viewer
from ..rewards.completion import completion_text


class RolloutViewer(TrainerCallback):
    """Keeps what the pages need after each generation (`keep`, on every process) and writes a page whenever TRL
    writes its completions table (`on_log`)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.kept = deque(maxlen=trainer.args.generation_batch_size)  # as long as TRL's `_logs`, in step with them

    def keep(self, inputs: list, shapes: list) -> None:
        """Record the reference and the shape (`ParallelPolicy.shape`) of each completion of a generation, this
        process's `inputs` and `shapes` in order (every process calls it)."""
        kept = [{"reference": row.get("answer"), **shape} for row, shape in zip(inputs, shapes)]
        self.kept.extend(gather_object(kept))

    def on_log(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.trainer.log_completions:  # TRL writes its table at this log
            path = Path(args.output_dir) / "completions" / f"completions_{state.global_step:05d}.html"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_viewer(self.records(args.num_generations), path, f"{args.output_dir}, step {state.global_step}")

    def records(self, num_generations: int) -> list:
        """The last generation's completions as viewer records: its first whole groups, up to `viewer_completions`
        (each is checked against its reference, on the main process, while the others wait)."""
        logs = self.trainer._logs
        count = min(len(logs["completion"]), len(self.kept))
        columns = {"prompt": logs["prompt"], "completion": logs["completion"], "advantage": logs["advantages"]}
        columns = {name: list(values)[-count:] for name, values in columns.items()}
        rewards = {name: list(values)[-count:] for name, values in logs["rewards"].items()}
        records = []
        shown = max(num_generations, self.trainer.args.viewer_completions // num_generations * num_generations)
        for i, kept in enumerate(list(self.kept)[-count:][:shown]):
            text = completion_text(columns["completion"][i])
            reference = None if kept["reference"] is None else extract_reference(kept["reference"])
            records.append(
                {
                    "problem_index": i // num_generations,
                    "sample": i % num_generations,
                    "prompt": _prompt_text(columns["prompt"][i]),
                    "completion": text,
                    **kept,
                    "reference": reference,
                    "answer": extract_answer(text),
                    "correct": None if reference is None else is_correct(text, reference),
                    "rewards": {name: _number(values[i]) for name, values in rewards.items()},
                    "advantage": _number(columns["advantage"][i]),
                }
            )
        return records


def _prompt_text(prompt) -> str:
    """A TRL prompt as text: a string, or chat messages as `role: content` paragraphs."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(f"{message.get('role', '')}: {message.get('content', '')}" for message in prompt)


def _number(value) -> float | None:
    """A reward or advantage for the page: rounded, and None for TRL's NaN (a reward that scored nothing)."""
    return None if value is None or math.isnan(value) else round(value, 4)
