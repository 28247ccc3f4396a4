"""Fork-join rollout speed: the engine vs the paper's re-prefill strategy vs sequential decoding.

    python benchmarks/bench_rollout.py [--device cpu|cuda] [--prefix 128 512 1024] [--paths 2 4] [--repeats 3]

The three write the same completions for the same prompts, greedily:
- engine: `TransformersBackend(kv_reuse="full")`, fork mode, isolated paths: the paths start from the
  prompt's KV and the summary reads the paths' KV, nothing is read twice;
- paper: the same engine with `kv_reuse="per_request"`: every request (each path, the summary, the main
  continuation) first re-reads its whole context, as the official rollout does; its tokens must equal the
  engine's, and where they do not, the first difference and the logit gap between the two tokens are reported;
- sequential: one plain causal decode of the same completion tokens, one per step (teacher-forced) with a
  `DynamicCache`: what a model writing its paths one after the other pays to write T tokens.

The model fixes the shape: a random Qwen3 whose residual stream carries a constant coordinate that no layer
writes. The `<Parallel>` output row reads it, and the other tags' and EOS's rows read it negatively, so greedy
decoding opens a block at once, every path and the summary run to their budgets (the runtime closes them), and
the main text, where the block limit then bans `<Parallel>`, runs to the completion cap. Each completion is
one block of K paths of `--path-tokens`, a summary of `--summary-tokens` and `--main-tokens` of main text.
The ideal engine/sequential ratio in decode steps is D/T (`format.stats`): (P + max L + S) / (P + sum L + S).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from parallel_r1.data import DATA_DIR
from parallel_r1.format import PARALLEL_OPEN, TAGS, TagVocab, parse, stats
from parallel_r1.rollout import ForkJoinEngine, RolloutConfig, Sampling, TransformersBackend
from parallel_r1.structure import isolated_inputs
from parallel_r1.tiny import build_tokenizer, pin_logits
from parallel_r1.tokens import tag_vocab

logger = logging.getLogger("bench_rollout")
STRATEGIES = ("sequential", "engine", "paper")
TARGET = 1.5  # the speed-up over the paper's strategy the rollout issue asks for at K = 2


def shaped_model(tokenizer, hidden: int, layers: int, head_dim: int, seed: int = 0) -> Qwen3ForCausalLM:
    """A random Qwen3 that greedily opens a block at once and never closes a path, a summary or the completion.

    `tiny.pin_logits`: +1 for `<Parallel>`, -1 for the other tags and EOS (a constant logit at every position).
    """
    torch.manual_seed(seed)
    heads = hidden // head_dim
    config = Qwen3Config(
        vocab_size=len(tokenizer) + 16,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=head_dim,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config).eval()
    vocab = tag_vocab(tokenizer)
    stops = [vocab.ids[tag] for tag in TAGS] + [tokenizer.eos_token_id]
    pin_logits(model, {token: 1.0 if token == vocab.ids[PARALLEL_OPEN] else -1.0 for token in stops})
    return model


def make_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` prompts of exactly `length` tokens, consecutive slices of the shipped GSM8K questions."""
    ids = []
    with open(DATA_DIR / "gsm8k_train.jsonl", encoding="utf-8") as f:
        for line in f:
            ids += tokenizer.encode(json.loads(line)["question"] + "\n", add_special_tokens=False)
            if len(ids) >= count * length:
                return [ids[i * length : (i + 1) * length] for i in range(count)]
    raise ValueError(f"the shipped questions hold {len(ids)} tokens, fewer than {count} prompts x {length}")


@torch.no_grad()
def sequential_decode(model, prompts: list[list[int]], completions: list[list[int]]) -> None:
    """Read the prompts, then the completions one token per step: a causal decode of exactly these tokens."""
    if len({len(c) for c in completions}) != 1:
        raise ValueError("sequential_decode needs completions of one length (the shaped model writes them so)")
    device = model.device
    cache = DynamicCache()
    model(input_ids=torch.tensor(prompts, device=device), past_key_values=cache, use_cache=True, logits_to_keep=1)
    tokens = torch.tensor(completions, device=device)
    for step in range(tokens.shape[1]):
        model(input_ids=tokens[:, step : step + 1], past_key_values=cache, use_cache=True, logits_to_keep=1)


class WorkCounter:
    """Counts a model's forward calls and the token slots they read (padding included)."""

    def __init__(self, model):
        self.calls = self.tokens = 0
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        self.calls += 1
        self.tokens += kwargs["input_ids"].numel()

    def reset(self) -> tuple[int, int]:
        """(calls, tokens) since the last reset."""
        counts, self.calls, self.tokens = (self.calls, self.tokens), 0, 0
        return counts


def clocked(device: torch.device, fn, *args):
    """(wall seconds, result) of `fn(*args)`, the device synchronised on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


@torch.no_grad()
def logit_gap(model, rollout, at: int, other: int, vocab: TagVocab) -> float:
    """Logit of the token `rollout` wrote at completion index `at` minus that of `other`, as the sampler saw them."""
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids[:at]], device=model.device)
    inputs = isolated_inputs(ids, torch.ones_like(ids), len(rollout.prompt_ids), vocab)
    logits = model(input_ids=ids, **inputs).logits[0, -1].float()
    return (logits[rollout.completion_ids[at]] - logits[other]).item()


def compare_tokens(model, engine_rollouts, paper_rollouts, vocab: TagVocab) -> str:
    """'yes' if both strategies wrote the same tokens, else where they first differ and the logit gap there."""
    for row, (a, b) in enumerate(zip(engine_rollouts, paper_rollouts)):
        if a.completion_ids == b.completion_ids:
            continue
        pairs = zip(a.completion_ids, b.completion_ids)
        at = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
        if at is None:
            return f"no: row {row} has {len(a.completion_ids)} vs {len(b.completion_ids)} tokens"
        return f"no: row {row}, token {at}, logit gap {logit_gap(model, a, at, b.completion_ids[at], vocab):.2g}"
    return "yes"


def make_engine(model, tokenizer, vocab: TagVocab, kv_reuse: str, config: RolloutConfig) -> ForkJoinEngine:
    backend = TransformersBackend(model, Sampling(temperature=0), kv_reuse, tokenizer.pad_token_id)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    return ForkJoinEngine(backend, vocab, [tokenizer.eos_token_id], newline, config)


def check_shape(rollouts, k: int, cap: int, vocab: TagVocab):
    """The `format.stats` of the first completion, once every completion is one block of k paths and cap tokens."""
    shapes = [stats(parse(r.completion_ids, vocab)) for r in rollouts]
    if any(s.paths_per_block != (k,) or s.total != cap for s in shapes):
        raise RuntimeError(f"the shaped model did not write one block of {k} paths and {cap} tokens: {shapes[0]}")
    return shapes[0]


def measure(model, tokenizer, vocab: TagVocab, prompts, k: int, args, counter: WorkCounter) -> dict:
    """Time the three strategies on one (prefix, K) point, in turns, and check what they wrote."""
    cap = 1 + k * (args.path_tokens + 2) + 3 + args.summary_tokens + 1 + args.main_tokens
    config = RolloutConfig(
        mode="fork",
        attention="isolated",
        num_paths=k,
        max_blocks=1,
        max_path_tokens=args.path_tokens,
        max_summary_tokens=args.summary_tokens,
        max_completion_tokens=cap,
    )
    engine = make_engine(model, tokenizer, vocab, "full", config)
    paper = make_engine(model, tokenizer, vocab, "per_request", config)
    times = {name: [] for name in STRATEGIES}
    work = {}
    counter.reset()
    for _ in range(args.repeats):  # in turns, so that a noisy neighbour slows all three alike
        seconds, rollouts = clocked(model.device, engine.generate, prompts)
        times["engine"].append(seconds)
        work["engine"] = counter.reset()
        shape = check_shape(rollouts, k, cap, vocab)
        seconds, paper_rollouts = clocked(model.device, paper.generate, prompts)
        times["paper"].append(seconds)
        work["paper"] = counter.reset()
        completions = [r.completion_ids for r in rollouts]
        seconds, _ = clocked(model.device, sequential_decode, model, prompts, completions)
        times["sequential"].append(seconds)
        work["sequential"] = counter.reset()
    return {
        "prefix": len(prompts[0]),
        "k": k,
        "total": shape.total,
        "critical": shape.critical,
        "best": {name: min(t) for name, t in times.items()},
        "median": {name: statistics.median(t) for name, t in times.items()},
        "work": work,
        "same": compare_tokens(model, rollouts, paper_rollouts, vocab),
    }


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return (
        f"{platform.machine()} CPU, {os.cpu_count()} cores (other jobs may share them: read the times as upper "
        f"bounds), torch threads: {torch.get_num_threads()}, torch {torch.__version__}"
    )


def report(rows: list[dict], args, model, device: torch.device, command: str) -> str:
    lines = [
        "# Rollout speed: fork-join engine vs the paper's re-prefill vs sequential decoding",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {machine(device)}; Python {platform.python_version()}.",
        f"Command: `{command}`.",
        "",
        f"Model: random Qwen3, hidden {args.hidden}, {args.layers} layers, head_dim {args.head_dim}, "
        f"{model.num_parameters() / 1e6:.1f}M parameters, {args.dtype}, SDPA. Batch: {args.batch} prompts of "
        f"`prefix` tokens (shipped GSM8K text). Each completion (greedy): one block of K paths of "
        f"{args.path_tokens} tokens, a summary of {args.summary_tokens}, then {args.main_tokens} tokens of main "
        f"text, T tokens in all. Times: wall seconds for the whole batch, best of {args.repeats} runs taken in "
        f"turns after a warm-up (median in brackets).",
        "",
        "- engine: `kv_reuse='full'` (the paths fork the prompt's KV, the summary reads the paths' KV);",
        "- paper: `kv_reuse='per_request'` (each path, the summary and the main continuation re-read their "
        "whole context); `same tokens`: it wrote the engine's completions token for token (else: where they first "
        "differ, and the engine's logit gap between the two tokens there);",
        "- sequential: one causal decode of the same T completion tokens, one per step (teacher-forced);",
        "- ideal: D/T from `format.stats`, i.e. (P + max L + S) / (P + sum L + S) in decode steps.",
        "",
        "| prefix | K | T | paper / engine | engine / sequential | ideal | sequential s | engine s | paper s "
        "| same tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        best, median = r["best"], r["median"]
        times = " | ".join(f"{best[name]:.2f} ({median[name]:.2f})" for name in STRATEGIES)
        lines.append(
            f"| {r['prefix']} | {r['k']} | {r['total']} | {best['paper'] / best['engine']:.2f}x "
            f"| {best['engine'] / best['sequential']:.2f} | {r['critical'] / r['total']:.2f} | {times} "
            f"| {r['same']} |"
        )
    lines += [
        "",
        "Work per batch: model forward calls (prefills and decode steps) and token slots read (padding "
        "included); what a call of the engine costs, and what each slot the paper reads beyond the engine's costs.",
        "",
        "| prefix | K | sequential calls / tokens | engine calls / tokens | paper calls / tokens | engine ms per call "
        "| paper ms per extra token |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        work, best = r["work"], r["best"]
        counts = " | ".join("{:,} / {:,}".format(*work[name]) for name in STRATEGIES)
        per_call = 1e3 * best["engine"] / work["engine"][0]
        per_token = 1e3 * (best["paper"] - best["engine"]) / (work["paper"][1] - work["engine"][1])
        lines.append(f"| {r['prefix']} | {r['k']} | {counts} | {per_call:.1f} | {per_token:.2f} |")
    pairs = [r for r in rows if r["k"] == 2]
    if pairs:
        met = [str(r["prefix"]) for r in pairs if r["best"]["paper"] >= TARGET * r["best"]["engine"]]
        lines += [
            "",
            f"Target: the engine at least {TARGET}x faster than the paper's strategy at K = 2. Met at prefix "
            f"{', '.join(met) or 'none'} of {', '.join(str(r['prefix']) for r in pairs)}.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--prefix", type=int, nargs="+", default=[128, 512, 1024], help="prompt lengths (tokens)")
    parser.add_argument("--paths", type=int, nargs="+", default=[2, 4], help="values of K")
    parser.add_argument("--batch", type=int, default=2, help="prompts per call")
    parser.add_argument("--path-tokens", type=int, default=128)
    parser.add_argument("--summary-tokens", type=int, default=32)
    parser.add_argument("--main-tokens", type=int, default=32, help="main text after the block")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rollout.md")
    args = parser.parse_args()
    for name in ("batch", "repeats", "hidden", "layers", "head_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    tokenizer = build_tokenizer()
    vocab = tag_vocab(tokenizer)
    model = shaped_model(tokenizer, args.hidden, args.layers, args.head_dim).to(device, getattr(torch, args.dtype))
    counter = WorkCounter(model)
    logger.info("model: %.1fM parameters on %s", model.num_parameters() / 1e6, device)
    prompts = {prefix: make_prompts(tokenizer, args.batch, prefix) for prefix in args.prefix}

    warm_up = argparse.Namespace(**{**vars(args), "repeats": 1})
    measure(model, tokenizer, vocab, prompts[args.prefix[0]], args.paths[0], warm_up, counter)
    rows = []
    for prefix, k in tqdm([(p, k) for p in args.prefix for k in args.paths], desc="prefix x K"):
        rows.append(measure(model, tokenizer, vocab, prompts[prefix], k, args, counter))
        logger.info("prefix %d, K %d: best %s", prefix, k, rows[-1]["best"])

    command = " ".join(["python benchmarks/bench_rollout.py", *sys.argv[1:]])
    text = report(rows, args, model, device, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
