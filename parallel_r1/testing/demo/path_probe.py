"""Does a path write a working as well as a plain answer does? A teacher-forced probe on the demo task.

For each held-out problem, the teacher's correct working (`7*8=56 / 3*4=12 / 56+12=68`) is read off a model twice:
as a plain answer, right after the prompt, and as each path of a block of three correct paths, under the structure
of a parallel model (`ParallelPolicy.training_forward`: Unseen paths isolated from each other, as sampled). Per
place: the share of the working's tokens that are the model's most likely token, and the mean log-probability of a
token. A working of L tokens is sampled whole at temperature 1 with probability exp(L x that mean), so the mean says
how often a path can be right before any vote.

    python -m parallel_r1.testing.demo.path_probe outputs/demo-strong/sft-plain outputs/demo-strong/sft-parallel \
        --structure outputs/demo-strong/sft-parallel --test outputs/demo-strong/data/test.jsonl
"""

from __future__ import annotations

import argparse

import torch

from ...data.prompts import build_prompt, prompt_ids
from ...durable import read_lines
from ...policy import ParallelPolicy, load_for_sampling
from .task import NUM_PATHS, Problem

PLACES = ("plain", *(f"path {k}" for k in range(1, NUM_PATHS + 1)))


def scored(model, ids: list, spans: list) -> list:
    """(tokens that are the argmax, summed log-prob, tokens) of each [start, end) span of `ids` under `model`."""
    tensor = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=tensor, attention_mask=torch.ones_like(tensor)).logits[0].float()
    logps = torch.log_softmax(logits, -1)
    out = []
    for start, end in spans:
        target = tensor[0, start:end]
        out.append(
            (
                (logits[start - 1 : end - 1].argmax(-1) == target).sum().item(),
                logps[start - 1 : end - 1].gather(-1, target[:, None]).sum().item(),
                end - start,
            )
        )
    return out


def probe(model_path: str, structure: str, problems: list[Problem]) -> dict:
    """place -> (token accuracy %, mean log-prob a token) of the correct working, plain and as each path."""
    policy = ParallelPolicy.from_pretrained(structure)
    if policy.settings.attention == "causal":
        raise ValueError(f"--structure {structure}: a parallel model's folder is needed, this one is causal")
    model, tokenizer = load_for_sampling(model_path, device="cpu"), policy.tokenizer
    path_open = tokenizer.convert_tokens_to_ids("<Path>")
    sums = {place: [0.0, 0.0, 0] for place in PLACES}
    for problem in problems:
        prompt = prompt_ids(tokenizer, build_prompt(problem.text, "none"))
        working = tokenizer.encode(problem.working()[0], add_special_tokens=False)
        block = tokenizer.encode(problem.parallel_trace(), add_special_tokens=False)
        opens = [len(prompt) + i + 1 for i, token in enumerate(block) if token == path_open]
        paths = [(start, start + len(working)) for start in opens]
        if any(block[start - len(prompt) : end - len(prompt)] != working for start, end in paths):
            raise ValueError(f"{problem.text}: a path's tokens are not the working's")
        rows = scored(model, prompt + working, [(len(prompt), len(prompt) + len(working))])
        rows += scored(policy.training_forward(model, len(prompt)), prompt + block, paths)
        for place, row in zip(PLACES, rows, strict=True):
            sums[place] = [total + value for total, value in zip(sums[place], row)]
    return {place: (100 * hits / count, logp / count) for place, (hits, logp, count) in sums.items()}


def table(results: dict) -> str:
    lines = ["| Model | Where | Token accuracy % | Mean log-prob a token |", "|---|---|---|---|"]
    for label, places in results.items():
        for place, (accuracy, logp) in places.items():
            lines.append(f"| {label} | {place} | {accuracy:.1f} | {logp:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="models (folders) to probe, plain or parallel")
    parser.add_argument("--structure", required=True, help="a parallel model whose structure the paths are read in")
    parser.add_argument("--test", required=True, help="the demo's held-out problems (test.jsonl)")
    parser.add_argument("--max_problems", type=int, default=None, help="the first N problems only")
    args = parser.parse_args(argv)
    problems = [Problem.parse(row["question"]) for row in read_lines(args.test)][: args.max_problems]
    print(table({path: probe(path, args.structure, problems) for path in args.models}))


if __name__ == "__main__":
    main()
