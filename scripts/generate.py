"""Sample a trained model with the fork-join engine and the settings it was trained with (read from its config).

    python scripts/generate.py --model_name_or_path outputs/tiny-grpo --prompt "What is 2 + 3?"
    python scripts/generate.py --model_name_or_path <model> --file problems.txt --output answers.jsonl
    python scripts/generate.py --model_name_or_path <model>            # interactive: one problem a line
    python scripts/generate.py --model_name_or_path <model> --backend vllm --file problems.txt   # an offline vLLM

A file holds one problem a line (.txt) or JSON lines with a `problem` or `question` field (.jsonl). Any rollout
setting can be overridden (--max_paths 3 ...). Tags are printed whole, in colour on a terminal; --output writes
one JSON line a problem (problem, completion with its tags, token ids, blocks, finish).
Training's own completions are in TRL's logs: `log_completions: true` prints a table every logging step, and with
`report_to: wandb` they go to a table there.
"""

import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from transformers import HfArgumentParser

from parallel_r1.cli import OneLineErrors, run
from parallel_r1.configs import refuse_renamed_settings
from parallel_r1.docstrings import document_parameters
from parallel_r1.rollout.arguments import BackendArguments, RecordedRolloutArguments, SamplingArguments


class ArgumentParser(OneLineErrors, HfArgumentParser):
    """transformers' parser; a bad flag or value ends in one line."""


@document_parameters
@dataclass(kw_only=True)
class GenerateArguments(RecordedRolloutArguments, SamplingArguments, BackendArguments):
    """What to answer and how, and on which backend; a rollout setting left unset is the model's recorded one."""

    model_name_or_path: str = field(metadata={"help": "A trained model folder or Hub id."})
    prompt: list[str] = field(default_factory=list, metadata={"help": "Problems to answer: --prompt 'one' 'two'."})
    file: str | None = field(default=None, metadata={"help": "A .txt (one problem a line) or .jsonl file."})
    output: str | None = field(default=None, metadata={"help": "Write one JSON line a problem here."})
    batch_size: int = field(default=16, metadata={"help": "Problems sampled together (and written) at a time."})

    def __post_init__(self):
        """The bases' checks: no dataclass's __post_init__ calls another's."""
        RecordedRolloutArguments.__post_init__(self)
        SamplingArguments.__post_init__(self)
        BackendArguments.__post_init__(self)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")


def read_problems(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--file {path} does not exist")
    numbered = [(n, line) for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    if file.suffix.lower() != ".jsonl":
        return [line for _, line in numbered]
    problems = []
    for n, line in numbered:
        try:
            row = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}, line {n}, is not JSON: {error}") from None
        problem = row.get("problem") or row.get("question") if isinstance(row, dict) else None
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{path}, line {n}: no 'problem' or 'question' text")
        problems.append(problem)
    return problems


def main() -> None:
    refuse_renamed_settings(sys.argv[1:], recipe=None)
    (args,) = ArgumentParser(GenerateArguments).parse_args_into_dataclasses()
    from parallel_r1.sampling import ParallelSampler

    overrides = {f.name: getattr(args, f.name) for f in fields(RecordedRolloutArguments)}
    problems = list(args.prompt) + (read_problems(args.file) if args.file else [])
    sampler = ParallelSampler(
        args.model_name_or_path, temperature=args.temperature, top_p=args.top_p, seed=args.seed, backend=args,
        **overrides,
    )  # fmt: skip
    color = sys.stdout.isatty()
    out = open(args.output, "w", encoding="utf-8") if args.output else None  # noqa: SIM115 - closed below
    try:
        if problems:
            for start in range(0, len(problems), args.batch_size):
                answer(sampler, problems[start : start + args.batch_size], out, color)
            return
        while True:  # interactive
            try:
                problem = input("problem> ").strip()
            except EOFError:
                break
            if problem:
                answer(sampler, [problem], out, color)
    finally:
        if out:
            out.close()


def answer(sampler, problems: list[str], out, color: bool) -> None:
    """Sample, print and (with --output) write one batch of problems."""
    for problem, rollout in zip(problems, sampler.answer(problems, progress=len(problems) > 1)):
        print(f"=== {problem}\n{sampler.text(rollout, color)}\n")
        if out:
            record = {"problem": problem, "completion": sampler.text(rollout), "finish": rollout.finish,
                      "blocks": rollout.blocks, "completion_ids": rollout.completion_ids}  # fmt: skip
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()


if __name__ == "__main__":
    run(main)
