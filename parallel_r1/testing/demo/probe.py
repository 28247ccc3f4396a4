"""Does the summary count? A teacher-forced probe of a parallel model's summary on the demo task.

For each held-out problem, three paths are written for the model (the teacher's workings, one slipped by a few),
and the summary's probability of each value is read off the model, the paths fixed:

    right majority   paths right, slipped, right      the majority is the right value
    wrong majority   paths slipped, right, slipped    the same two values, the majority now the slipped one
    all agree        paths right, right, right

A summary that counts states the majority in both split cases. A summary that prefers one value whatever the
count (the right one, or the one its attention weighs most) states the same value in both, and its probability
of the majority falls in one of them. The model runs under its own attention (`ParallelPolicy.training_forward`:
the paths isolated from each other, as sampled).

    python -m parallel_r1.testing.demo.probe outputs/demo/sft outputs/demo/grpo --test outputs/demo/data/test.jsonl
"""

from __future__ import annotations

import argparse
import math
import random

import torch

from ...data.prompts import build_prompt, prompt_ids
from ...durable import read_lines
from ...policy import ParallelPolicy, load_for_sampling
from .task import Problem, slip_size

CASES = {"right majority": (0, 1, 0), "wrong majority": (1, 0, 1), "all agree": (0, 0, 0)}  # 1: the slipped path


def value_logprob(policy: ParallelPolicy, model, problem: Problem, slips: tuple, value: int) -> float:
    """log p(the summary states `value`, then closes) given the block of `slips`, teacher-forced."""
    tokenizer = policy.tokenizer
    prompt = prompt_ids(tokenizer, build_prompt(problem.text, "none"))
    trace = problem.parallel_trace(slips)
    head = trace[: trace.rindex("Final Answer: ") + len("Final Answer: ")]
    fixed = tokenizer.encode(head, add_special_tokens=False)
    tail = tokenizer.encode(f"{value}</Summary>", add_special_tokens=False)
    ids = torch.tensor([prompt + fixed + tail])
    forward = policy.training_forward(model, len(prompt))
    with torch.no_grad():
        logits = forward(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    start = len(prompt) + len(fixed)
    logps = torch.log_softmax(logits[start - 1 : -1], -1)
    return logps.gather(-1, ids[0, start:, None]).sum().item()


def probe(model_path: str, problems: list[Problem], seed: int = 0) -> dict:
    """Per case: the mean probability that the summary states the majority's value, the minority's, or another."""
    policy = ParallelPolicy.from_pretrained(model_path)
    model = load_for_sampling(model_path)
    rng = random.Random(seed)
    sums = {case: [0.0, 0.0, 0.0] for case in CASES}
    for problem in problems:
        slip = slip_size(rng)
        right, wrong = problem.answer, problem.working(slip)[1]
        for case, pattern in CASES.items():
            slips = tuple(slip * s for s in pattern)
            majority, minority = (right, wrong) if pattern[0] == 0 else (wrong, right)
            p_major = math.exp(value_logprob(policy, model, problem, slips, majority))
            p_minor = math.exp(value_logprob(policy, model, problem, slips, minority)) if case != "all agree" else 0.0
            for i, value in enumerate([p_major, p_minor, 1 - p_major - p_minor]):
                sums[case][i] += value
    return {case: [100 * s / len(problems) for s in values] for case, values in sums.items()}


def table(results: dict) -> str:
    lines = [
        "| Model | Case | p(majority's value) % | p(minority's value) % | p(another value) % |",
        "|---|---|---|---|---|",
    ]
    for label, cases in results.items():
        for case, (major, minor, other) in cases.items():
            minor_text = "-" if case == "all agree" else f"{minor:.1f}"
            lines.append(f"| {label} | {case} | {major:.1f} | {minor_text} | {other:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="parallel models (folders) to probe")
    parser.add_argument("--test", required=True, help="the demo's held-out problems (test.jsonl)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the slips")
    parser.add_argument("--max_problems", type=int, default=None, help="the first N problems only")
    args = parser.parse_args(argv)
    problems = [Problem.parse(row["question"]) for row in read_lines(args.test)][: args.max_problems]
    print(table({path: probe(path, problems, args.seed) for path in args.models}))


if __name__ == "__main__":
    main()
