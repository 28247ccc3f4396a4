"""Sample a trained model with the fork-join engine and the settings it was trained with (read from its config).

    python scripts/generate.py --model_name_or_path outputs/tiny-grpo --prompt "What is 2 + 3?"
    python scripts/generate.py --model_name_or_path <model> --file problems.txt --output answers.jsonl
    python scripts/generate.py --model_name_or_path <model>            # interactive: one problem a line

A file holds one problem a line (.txt) or JSON lines with a `problem` or `question` field (.jsonl). Any rollout
setting can be overridden (--num_paths 3 ...). Tags are printed whole, in colour on a terminal; --output writes
one JSON line a problem (problem, completion with its tags, token ids, blocks, finish).
Training's own completions are in TRL's logs: `log_completions: true` prints a table every logging step, and with
`report_to: wandb` they go to a table there.
"""

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from parallel_r1.cli import run


@dataclass
class GenerateArguments:
    model_name_or_path: str = field(metadata={"help": "A trained model folder or Hub id."})
    prompt: list[str] = field(default_factory=list, metadata={"help": "Problems to answer (repeat the flag)."})
    file: str | None = field(default=None, metadata={"help": "A .txt (one problem a line) or .jsonl file."})
    output: str | None = field(default=None, metadata={"help": "Write one JSON line a problem here."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (0: greedy)."})
    seed: int = field(default=0, metadata={"help": "Seed of the sampling."})
    attention: str | None = field(default=None, metadata={"help": "Override: isolated, causal or tree."})
    prompt_template: str | None = field(default=None, metadata={"help": "Override: parallel or plain."})
    num_paths: int | None = field(default=None, metadata={"help": "Override: paths per block."})
    max_blocks: int | None = field(default=None, metadata={"help": "Override: blocks per completion."})
    max_path_tokens: int | None = field(default=None, metadata={"help": "Override: tokens per path."})
    max_summary_tokens: int | None = field(default=None, metadata={"help": "Override: tokens per summary."})
    max_completion_tokens: int | None = field(default=None, metadata={"help": "Override: tokens per completion."})


def read_problems(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--file {path} does not exist")
    lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if file.suffix != ".jsonl":
        return lines
    rows = [json.loads(line) for line in lines]
    missing = [i for i, row in enumerate(rows) if not (row.get("problem") or row.get("question"))]
    if missing:
        raise ValueError(f"{path}: line {missing[0] + 1} has no 'problem' or 'question' field")
    return [row.get("problem") or row["question"] for row in rows]


def main() -> None:
    (args,) = HfArgumentParser(GenerateArguments).parse_args_into_dataclasses()
    from parallel_r1.sampling import ParallelSampler

    overrides = {k: getattr(args, k) for k in ("attention", "prompt_template", "num_paths", "max_blocks",
                                                "max_path_tokens", "max_summary_tokens", "max_completion_tokens")}  # fmt: skip
    sampler = ParallelSampler(args.model_name_or_path, temperature=args.temperature, seed=args.seed, **overrides)
    problems = list(args.prompt) + (read_problems(args.file) if args.file else [])
    interactive = not problems
    color = sys.stdout.isatty()
    out = open(args.output, "w", encoding="utf-8") if args.output else None  # noqa: SIM115 - closed below
    try:
        while True:
            if interactive:
                try:
                    problems = [input("problem> ").strip()]
                except EOFError:
                    break
                if not problems[0]:
                    continue
            for problem, rollout in zip(problems, sampler.answer(problems)):
                print(f"=== {problem}\n{sampler.text(rollout, color)}\n")
                if out:
                    record = {"problem": problem, "completion": sampler.text(rollout), "finish": rollout.finish,
                              "blocks": rollout.blocks, "completion_ids": rollout.completion_ids}  # fmt: skip
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
            if not interactive:
                break
    finally:
        if out:
            out.close()


if __name__ == "__main__":
    run(main)
