"""Fork-join rollouts at realistic shapes: per-completion scheduling against batch-wide rounds, the official
strategy, plain decoding and the ideal, on transformers and vLLM.

    python benchmarks/bench_rollout.py [--backends transformers vllm] [--workloads traces tag-prone]
        [--batches 8 64 256] [--repeats 1] [--device cpu|cuda] [--dtype float32|bfloat16] [--shape small|13m|qwen3-4b]
        [--threads N] [--out benchmarks/results/rollout.md]

Two workloads, fork mode with isolated paths, temperature 1:
- traces: each completion has the shape of one of the shipped cold-start traces (`parallel_gsm8k_sample.jsonl`,
  341 GSM8K answers of 1 to 4 blocks of 2 to 4 paths): its main stretches, paths, width decisions and summaries
  have the lengths of the trace's, in this benchmark's tokenizer (a BPE of 16,384 pieces trained on the shipped
  data: the traces are 308 tokens on average, 828 at most). The model computes every step for real; only the
  choice of token is scripted (`Script`): filler text until a segment's length, then the trace's tag. Completion i
  follows trace i modulo 341;
- tag-prone: the model writes the structure itself (`tiny.make_tag_prone`: strong output rows for `<Parallel>`,
  `</Path>`, `</Summary>` and EOS, of norm 8: at the tests' 5 this model opens 0.56 blocks a completion, at 8 about
  one, nearer the traces' 1.29), 2 paths a block, at most 3 blocks, a 512-token cap.

For each batch size and backend the same prompts are decoded by:
- engine: per-completion scheduling (`ForkJoinEngine`), keys and values shared by reference (transformers:
  `kv_reuse="full"`; vLLM: prefix caching on);
- rounds: the same with `schedule="rounds"`: every completion waits for the batch's slowest segment, as the engine
  did before;
- official: per-completion scheduling, each path and summary reading its whole context again, as the official
  code's agent loop does without a prefix cache (transformers `kv_reuse="per_request"`; vLLM prefix caching off),
  and each of a block's paths decoded to its own budget (the engine's: up to the room left), what lies past the cap
  thrown away afterwards (the engine ends a path once all it could still add lies past the cap: `backend.Room`; the
  official recipe lets a path run to 4,096 tokens under a 3,000-token cap, so it throws away more than this);
- plain: each completion's T tokens decoded in one stream, one token a step, the streams scheduled on their own
  (what a model that writes its paths one after the other pays);
- ideal: the longest critical path, max over completions of the sampled tokens one after another (`critical`).

Counts: model forward calls on transformers; engine steps on vLLM (each runs one forward over its scheduled
tokens). Times: best of `--repeats` runs taken in turns. The transformers rows also give the key/value bytes the
cache copied per generated token, against what the earlier stacked cache copied for the same rounds (each call
stacked every stream's keys and values into one batch cache and copied them out again: counted, not timed).

A last table simulates the paper's scale without a model: 256 completions per GPU (a generation of 256 prompts x 8
on 8 GPUs), the traces' segment lengths scaled so that their 95th percentile is the 3,000-token cap.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
from bench_common import cpu_machine, use_vllm_cpu, vllm_cpu_settings, write_results
from transformers import Qwen3Config, Qwen3ForCausalLM

from parallel_r1.data import DATA_DIR
from parallel_r1.rollout import EngineTokens, ForkJoinEngine, RolloutArguments, Sampling, Segment, TransformersBackend
from parallel_r1.rollout.vllm_backend import VLLMBackend
from parallel_r1.tags.language import (
    PARALLEL_CLOSE,
    PARALLEL_OPEN,
    PATH_CLOSE,
    PATH_OPEN,
    SUMMARY_CLOSE,
    Block,
    parse,
)
from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.tiny import build_tokenizer, make_tag_prone

logger = logging.getLogger("bench_rollout")
STRATEGIES = ("engine", "rounds", "official", "plain")
SHAPES = {  # hidden, layers, heads, kv heads, head_dim, intermediate
    "small": (256, 4, 4, 2, 64, 768),  # the CPU default
    "13m": (512, 4, 8, 2, 64, 1536),  # the earlier rollout benchmark's shape (13.1M with its 1,024-piece vocabulary)
    "qwen3-4b": (2560, 36, 32, 8, 128, 9728),
}
VOCAB = 16384
TARGET_IDEAL = 1.25  # engine forwards within this factor of the ideal, at 64 and 256 completions


# ---------------------------------------------------------------------------------------------- the workloads


@dataclass(frozen=True)
class TraceShape:
    """A completion's shape: main stretches (each with the tag that ends it), and per block its paths' and
    summary's sampled tokens (`</Path>` and `</Summary>` included)."""

    mains: tuple  # sampled tokens of each main stretch, its <Parallel> (or EOS) included
    paths: tuple  # per block: tokens of each path
    summaries: tuple  # per block

    @property
    def total(self) -> int:
        """T under the engine: the mains; per block each path with its <Path>, </Parallel> \\n <Summary> and the
        summary (a width decision is the later path's <Path>, or the </Parallel>)."""
        return sum(self.mains) + sum(len(p) + sum(p) + 3 + s for p, s in zip(self.paths, self.summaries))

    def phases(self, min_paths: int, max_paths: int) -> list[tuple[int, int]]:
        """(decode steps, context tokens read again by the official strategy) of each phase, in order: a main
        stretch; a block's first paths, decoded at once; each width decision; each later path; a summary."""
        phases, context = [], 0
        for i, main in enumerate(self.mains):
            phases.append((main, context))
            context += main
            if i == len(self.paths):
                break
            paths, block = self.paths[i], context
            phases.append((max(paths[:min_paths]), min_paths * (block + 1)))
            context += sum(paths[:min_paths]) + min_paths
            for late in paths[min_paths:]:
                phases += [(1, context), (late, block + 1)]  # the decision reads the block; the path its context
                context += late + 1
            if len(paths) < max_paths:
                phases.append((1, context))  # the decision that closes the block
            context += 3
            phases.append((self.summaries[i], context))
            context += self.summaries[i]
        return phases

    def critical(self, min_paths: int, max_paths: int) -> int:
        """Sampled tokens one after another."""
        return sum(steps for steps, _ in self.phases(min_paths, max_paths))


def trace_shapes(tokenizer) -> list[TraceShape]:
    """The shapes of the shipped cold-start traces, in `tokenizer`'s tokens (leads and separators dropped: the
    engine inserts its own)."""
    vocab = tag_vocab(tokenizer)
    shapes = []
    with open(DATA_DIR / "parallel_gsm8k_sample.jsonl", encoding="utf-8") as f:
        for line in f:
            parsed = parse(tokenizer.encode(json.loads(line)["response"], add_special_tokens=False), vocab)
            mains, paths, summaries, text = [], [], [], 0
            for node in parsed.nodes:
                if isinstance(node, Block):
                    mains.append(text + 1)
                    paths.append(tuple(len(p.body) + 1 for p in node.paths))
                    summaries.append(len(node.summary or ()) + 1)
                    text = 0
                else:
                    text += len(node.content)
            mains.append(text + 1)
            shapes.append(TraceShape(tuple(mains), tuple(paths), tuple(summaries)))
    return shapes


class Script:
    """Which length each segment of a traced completion has, and which token ends it; assigned as the engine
    submits the segments, in each completion's own order."""

    def __init__(self, shapes: list[TraceShape], seeds: list[int], vocab, eos: int, min_paths: int):
        self.shapes = {seed: shapes[i % len(shapes)] for i, seed in enumerate(seeds)}
        self.tag, self.eos, self.min_paths = vocab.ids, eos, min_paths
        self.cursor = {seed: [0, 0, 0] for seed in seeds}  # main, block, path
        self.plans: dict[Segment, tuple[int, int]] = {}

    def assign(self, segment: Segment) -> None:
        shape, cursor = self.shapes[segment.stream.key[0]], self.cursor[segment.stream.key[0]]
        main, block, path = cursor
        if segment.only is not None:  # a width decision
            wider = path < len(shape.paths[block])
            plan = (1, self.tag[PATH_OPEN] if wider else self.tag[PARALLEL_CLOSE])
        elif segment.closer == self.tag[PATH_CLOSE]:
            plan, cursor[2] = (shape.paths[block][path], self.tag[PATH_CLOSE]), path + 1
        elif segment.closer == self.tag[SUMMARY_CLOSE]:
            plan, cursor[1], cursor[2] = (shape.summaries[block], self.tag[SUMMARY_CLOSE]), block + 1, 0
        else:
            last = main == len(shape.mains) - 1
            plan, cursor[0] = (shape.mains[main], self.eos if last else self.tag[PARALLEL_OPEN]), main + 1
        self.plans[segment] = plan

    def constrained(self, segment: Segment, written: int) -> Segment:
        """The segment as the next token must be drawn: filler (every tag and EOS banned) or its final token."""
        length, final = self.plans[segment]
        if written == length - 1:
            return replace(segment, only=frozenset({final}))
        return replace(segment, only=None, banned=frozenset([*self.tag.values(), self.eos]))


class ScriptedTransformers(TransformersBackend):
    """The transformers backend with its token choice scripted (the forwards are the model's own)."""

    script: Script

    def submit(self, segments):
        for segment in segments:
            self.script.assign(segment)
        super().submit(segments)

    def _choose(self, logits, segments):
        scripted = [self.script.constrained(s, len(self._active[s].tokens)) for s in segments]
        return super()._choose(logits, scripted)


class ScriptedVLLM(VLLMBackend):
    """The vLLM backend with each request made to write its segment's length: its final token is held back
    (`min_tokens`) until then, and then all but certain (`logit_bias` +100)."""

    script: Script

    def submit(self, segments):
        for segment in segments:
            self.script.assign(segment)
        super().submit(segments)

    def _request(self, segment):
        params = super()._request(segment)
        length, final = self.script.plans[segment]
        params.pop("allowed_token_ids", None)
        params.update(max_tokens=length, min_tokens=length - 1, stop_token_ids=[final])
        if length == 1:
            params["allowed_token_ids"], params["logit_bias"] = [final], {}
        else:
            params["logit_bias"] = {t: -math.inf for t in self.script.banned if t != final} | {final: 100.0}
        return params


# ------------------------------------------------------------------------------------------------- the model


TAG_STRENGTH = 8.0  # the norm of the tags' and EOS's output rows (see the docstring)


def random_model(tokenizer, shape: str, seed: int = 0) -> Qwen3ForCausalLM:
    """A random Qwen3 of `shape`, untied, tag-prone (its tags and EOS have strong output rows)."""
    hidden, layers, heads, kv_heads, head_dim, intermediate = SHAPES[shape]
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config).eval()
    make_tag_prone(model, tokenizer, strength=TAG_STRENGTH)
    return model


def workload_config(workload: str, shapes: list[TraceShape]) -> RolloutArguments:
    if workload == "traces":
        longest = max(s.total for s in shapes)
        widths = max(len(p) for s in shapes for p in s.paths)
        return RolloutArguments(
            attention="isolated", rollout_mode="fork", min_paths=2, max_paths=widths, max_blocks=4,
            max_completion_length=longest + 16, max_path_tokens=longest, max_summary_tokens=longest,
        )  # fmt: skip
    return RolloutArguments(
        attention="isolated", rollout_mode="fork", min_paths=2, max_paths=2, max_blocks=3,
        max_completion_length=512, max_path_tokens=512, max_summary_tokens=512,
    )  # fmt: skip


def make_prompts(tokenizer, count: int) -> list[list[int]]:
    """The traces' own questions, in turn, each followed by a newline."""
    with open(DATA_DIR / "parallel_gsm8k_sample.jsonl", encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f]
    return [tokenizer.encode(questions[i % len(questions)] + "\n", add_special_tokens=False) for i in range(count)]


def critical(rollout, vocab, min_paths: int) -> int:
    """Sampled tokens of a rollout one after another (the first min_paths paths of a block run at once)."""
    sampled = rollout.env_mask
    saved = 0
    for block in parse(rollout.completion_ids, vocab).blocks:
        concurrent = [sum(sampled[p.start : p.end]) for p in block.paths[:min_paths]]
        saved += sum(concurrent) - max(concurrent, default=0)
    return sum(sampled) - saved


# ----------------------------------------------------------------------------------------------- the runners


class Runner:
    """The four strategies on one backend kind. `work()`: forward calls (transformers) or engine steps (vLLM)."""

    name: str

    def __init__(self, tokenizer, vocab, eos: int, args):
        self.tokenizer, self.vocab, self.eos, self.args = tokenizer, vocab, eos, args
        self.tokens = EngineTokens.of(tokenizer, [eos], vocab)
        self.banned = frozenset([*vocab.ids.values(), eos])

    def run(self, strategy, workload, prompts, seeds, shapes, config, lengths=None) -> dict:
        scripted = workload == "traces" and strategy != "plain"
        backend = self.backend(strategy, scripted)
        if scripted:
            backend.script = Script(shapes, seeds, self.vocab, self.eos, config.min_paths)
            backend.script.banned = self.banned
        start = time.perf_counter()
        if strategy == "plain":
            rollouts = self.plain(backend, prompts, seeds, lengths)
        else:
            schedule = "rounds" if strategy == "rounds" else "per_completion"
            engine = (OfficialEngine if strategy == "official" else ForkJoinEngine)(
                backend, self.tokens, self.tokens.grammar(config), config, schedule
            )
            stacked = _StackCount(backend) if strategy == "rounds" and self.name == "transformers" else None
            rollouts = engine.generate(prompts, seeds)
        seconds = time.perf_counter() - start
        out = {"seconds": seconds, "rollouts": rollouts, "work": self.work(backend)}
        if self.name == "transformers":
            out["copied"] = backend.copied_bytes
            if strategy == "rounds":
                out["stacked"] = stacked.slots
        return out

    def plain(self, backend, prompts, seeds, lengths) -> list:
        """Each prompt decoded plainly for its completion's length (tags and EOS banned)."""
        streams = backend.start(prompts, seeds)
        segments = [Segment(s, max_new=n, banned=self.banned) for s, n in zip(streams, lengths)]
        backend.submit(segments)
        done = {}
        while len(done) < len(segments):
            done.update(backend.step())
        return [done[s] for s in segments]


class OfficialEngine(ForkJoinEngine):
    """The engine without the shared `Room`, as the official code: each of a block's paths runs to its own budget,
    and what lies past the completion's cap is thrown away afterwards."""

    def _segments(self, state):
        segments = super()._segments(state)
        for segment in segments:
            segment.room = None
        return segments


class _StackCount:
    """What the earlier stacked cache copied in rounds: at each call, every stream's slots into the batch cache and
    back out; counted from the segments the engine submits, in slots."""

    def __init__(self, backend):
        self.slots = 0
        submit = backend.submit

        def counting(segments):
            self.slots += 2 * sum(len(s.stream.ids) for s in segments)
            submit(segments)

        backend.submit = counting


class TransformersRunner(Runner):
    name = "transformers"

    def __init__(self, model, *args):
        super().__init__(*args)
        self.model, self.device = model, model.device

    def backend(self, strategy: str, scripted: bool):
        cls = ScriptedTransformers if scripted else TransformersBackend
        reuse = "per_request" if strategy == "official" else "full"
        return cls(self.model, Sampling(temperature=1.0), reuse)

    def work(self, backend) -> int:
        return backend.forwards

    def slot_bytes(self) -> int:
        config = self.model.config
        return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * self.model.dtype.itemsize


class VLLMRunner(Runner):
    name = "vllm"

    def __init__(self, folder: Path, max_model_len: int, *args):
        super().__init__(*args)
        from vllm import LLM

        def llm(caching: bool):
            share = {"gpu_memory_utilization": 0.3} if self.args.device == "cuda" else {}
            if self.args.vllm_block_size:
                share["block_size"] = self.args.vllm_block_size
            return LLM(model=str(folder), dtype=self.args.dtype, enforce_eager=True, max_model_len=max_model_len,
                       enable_prefix_caching=caching, seed=0, logprobs_mode="processed_logprobs", **share)  # fmt: skip

        self.cached, self.uncached = llm(True), llm(False)
        self.block_size = self.cached.llm_engine.vllm_config.cache_config.block_size  # the prefix cache's unit
        self.device = torch.device(self.args.device)

    def backend(self, strategy: str, scripted: bool):
        llm = self.uncached if strategy == "official" else self.cached
        llm.reset_prefix_cache()  # no run reads what an earlier one computed
        return (ScriptedVLLM if scripted else VLLMBackend)(llm=llm, sampling=Sampling(temperature=1.0))

    def work(self, backend) -> int:
        return backend.steps


# ------------------------------------------------------------------------------------------------ measuring


def measure(runner, workload: str, batch: int, shapes, args) -> dict:
    config = workload_config(workload, shapes)
    prompts, seeds = make_prompts(runner.tokenizer, batch), list(range(batch))
    best, work, out = {}, {}, {}
    for _ in range(args.repeats):  # in turns, so that a noisy neighbour slows all four alike
        for strategy in STRATEGIES:
            lengths = [len(r.completion_ids) for r in out["engine"]["rollouts"]] if strategy == "plain" else None
            result = runner.run(strategy, workload, prompts, seeds, shapes, config, lengths)
            if strategy not in out or result["seconds"] < out[strategy]["seconds"]:
                out[strategy] = result
    for strategy, result in out.items():
        best[strategy], work[strategy] = result["seconds"], result["work"]
    engine = out["engine"]["rollouts"]
    generated = sum(len(r.completion_ids) for r in engine)
    row = {
        "workload": workload,
        "backend": runner.name,
        "batch": batch,
        "blocks": sum(r.blocks for r in engine) / batch,
        "T": max(len(r.completion_ids) for r in engine),
        "ideal": max(critical(r, runner.vocab, config.min_paths) for r in engine),
        "seconds": best,
        "work": work,
        "same": {
            s: "yes" if [r.completion_ids for r in out[s]["rollouts"]] == [r.completion_ids for r in engine] else "no"
            for s in ("rounds", "official")
        },
    }
    if runner.name == "transformers":
        row["copied"] = out["engine"]["copied"] / generated
        row["stacked"] = out["rounds"]["stacked"] * runner.slot_bytes() / generated
    return row


def simulate(shapes: list[TraceShape], completions: int, cap: int, max_paths: int, seed: int = 0) -> dict:
    """Decode steps and tokens read at the paper's scale, from the traces' shapes scaled so that their 95th
    percentile is `cap` (longer ones lose their last blocks). No model: steps count sampled tokens one after
    another; rounds advance every completion one phase at a time."""
    totals = sorted(s.total for s in shapes)
    scale = cap / totals[int(0.95 * (len(totals) - 1))]
    rng = random.Random(seed)
    picked = [_scaled(rng.choice(shapes), scale, cap) for _ in range(completions)]
    phases = [s.phases(2, max_paths) for s in picked]
    rounds = sum(max(p[depth][0] for p in phases if len(p) > depth) for depth in range(max(len(p) for p in phases)))
    tokens = sum(s.total for s in picked)
    return {
        "completions": completions,
        "ideal": max(s.critical(2, max_paths) for s in picked),
        "rounds": rounds,
        "plain": max(s.total for s in picked),
        "mean T": statistics.mean(s.total for s in picked),
        "engine reads": tokens,
        "official reads": tokens + sum(read for p in phases for _, read in p),
    }


def _scaled(shape: TraceShape, scale: float, cap: int) -> TraceShape:
    def grow(n: int) -> int:
        return max(1, round(n * scale))

    scaled = TraceShape(
        tuple(grow(n) for n in shape.mains),
        tuple(tuple(grow(n) for n in p) for p in shape.paths),
        tuple(grow(n) for n in shape.summaries),
    )
    while scaled.total > cap and scaled.paths:  # cut: the last block goes, the main before it ends the answer
        scaled = TraceShape(scaled.mains[:-1], scaled.paths[:-1], scaled.summaries[:-1])
    return scaled


# -------------------------------------------------------------------------------------------------- the report


def machine(device: torch.device, backends: list[str]) -> str:
    text = (
        f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}" if device.type == "cuda" else cpu_machine()
    )
    if "vllm" in backends:
        import vllm

        text += f", vLLM {vllm.__version__}"
        if device.type == "cpu":
            text += f" (vllm-cpu; {vllm_cpu_settings()})"
    return text


def report(rows: list[dict], simulations: list[dict], args, model, command: str) -> str:
    shape = SHAPES[args.shape]
    lines = [
        "# Fork-join rollouts at realistic shapes: per-completion scheduling",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {machine(torch.device(args.device), args.backends)}; "
        f"Python {platform.python_version()}.",
        f"Command: `{command}`.",
        "",
        f"Model: random Qwen3 ({args.shape}: hidden {shape[0]}, {shape[1]} layers, {shape[2]} heads, {shape[3]} "
        f"key/value heads, head_dim {shape[4]}), {model.num_parameters() / 1e6:.1f}M parameters with a "
        f"{VOCAB:,}-piece vocabulary, {args.dtype}, tag-prone; vLLM loads the same weights (offline `vllm.LLM`, "
        "eager). Temperature 1, fork mode, isolated paths; completion i has seed i. The workloads, strategies and "
        "counts are those of the module's docstring (`benchmarks/bench_rollout.py`).",
    ]
    if "vllm" in args.backends:
        lines[-1] += (
            f" vLLM's KV block: {args.vllm_block_size} tokens. Its prefix cache reuses whole blocks, so each new "
            "request (a path, a width decision, a summary, the main text after a block) computes again the part of "
            "its context past its last whole block."
        )
    lines += [
        "",
        "| workload | backend | completions | blocks | longest T | ideal | engine | rounds | official | plain "
        "| engine / ideal | rounds / engine | official / engine s | plain / engine s | engine s | rounds s "
        "| official s | plain s | same tokens (rounds, official) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        w, s = r["work"], r["seconds"]
        lines.append(
            f"| {r['workload']} | {r['backend']} | {r['batch']} | {r['blocks']:.2f} | {r['T']} | {r['ideal']} "
            f"| {w['engine']} | {w['rounds']} | {w['official']} | {w['plain']} | {w['engine'] / r['ideal']:.2f} "
            f"| {w['rounds'] / w['engine']:.2f} | {s['official'] / s['engine']:.2f} | {s['plain'] / s['engine']:.2f} "
            f"| {s['engine']:.2f} | {s['rounds']:.2f} | {s['official']:.2f} | {s['plain']:.2f} "
            f"| {r['same']['rounds']}, {r['same']['official']} |"
        )
    copies = [r for r in rows if "copied" in r]
    if copies:
        lines += [
            "",
            "Key/value bytes copied per generated token on transformers: the engine's cache (its growth and "
            "compactions, measured) against the earlier stacked cache in rounds (every stream's slots into each "
            "call's batch cache and out again, counted from the rounds run's calls).",
            "",
            "| workload | completions | engine (bytes / token) | stacked cache (bytes / token) |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r['workload']} | {r['batch']} | {r['copied']:,.0f} | {r['stacked']:,.0f} |" for r in copies]
    lines += ["", "Targets:"]
    for backend in args.backends:
        mine = [r for r in rows if r["backend"] == backend]
        near = [r for r in mine if r["batch"] >= 64]
        ratios = ", ".join(f"{r['workload']} {r['batch']}: {r['work']['engine'] / r['ideal']:.2f}" for r in near)
        met = all(r["work"]["engine"] <= TARGET_IDEAL * r["ideal"] for r in near)
        lines.append(f"- {backend}, engine within {TARGET_IDEAL}x of the ideal at 64 and 256: "
                     f"{'met' if met else 'not met'} ({ratios or 'not run'}).")  # fmt: skip
        for other in ("plain", "official"):
            slower = [f"{r['workload']} {r['batch']}" for r in mine if r["seconds"][other] <= r["seconds"]["engine"]]
            lines.append(f"- {backend}, engine faster than {other} in wall time at every point: "
                         f"{'met' if not slower else 'not met at ' + ', '.join(slower)}.")  # fmt: skip
    if simulations:
        lines += [
            "",
            f"Simulated at the paper's scale: completions drawn from the traces' shapes, their lengths scaled so that "
            f"the 95th percentile is {args.paper_cap:,} tokens (completions cut there), 2 paths at once. Decode steps "
            "(sampled tokens one after another) and tokens read (decoded, plus every context read again).",
            "",
            "| completions | mean T | ideal = engine steps | rounds steps | plain steps | rounds / ideal "
            "| plain / ideal | engine tokens read | official tokens read |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for s in simulations:
            lines.append(
                f"| {s['completions']} | {s['mean T']:.0f} | {s['ideal']:,} | {s['rounds']:,} | {s['plain']:,} "
                f"| {s['rounds'] / s['ideal']:.2f} | {s['plain'] / s['ideal']:.2f} | {s['engine reads']:,} "
                f"| {s['official reads']:,} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["transformers", "vllm"], choices=["transformers", "vllm"])
    parser.add_argument("--workloads", nargs="+", default=["traces", "tag-prone"], choices=["traces", "tag-prone"])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--vllm-block-size", type=int, default=None,
                        help="vLLM's KV block in tokens (default: vLLM's, 128 on CPU and 16 on CUDA)")  # fmt: skip
    parser.add_argument("--paper-cap", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rollout.md")
    args = parser.parse_args()
    if min(args.batches) < 1 or args.repeats < 1:
        parser.error("--batches and --repeats must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)  # before vLLM starts: it then refuses to change them
    if "vllm" in args.backends and torch.device(args.device).type == "cpu":
        # 256 completions of the traces' shapes hold more tokens than the tests' 1 GiB cache: vLLM
        # would preempt and recompute requests, which is not what is measured
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        use_vllm_cpu()

    tokenizer = build_tokenizer(vocab_size=VOCAB)
    vocab = tag_vocab(tokenizer)
    shapes = trace_shapes(tokenizer)
    model = random_model(tokenizer, args.shape).to(torch.device(args.device), getattr(torch, args.dtype))
    logger.info("model: %.1fM parameters; %d trace shapes", model.num_parameters() / 1e6, len(shapes))
    common = (tokenizer, vocab, tokenizer.eos_token_id, args)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        runners = []
        for name in args.backends:
            if name == "transformers":
                runners.append(TransformersRunner(model, *common))
            else:
                model.save_pretrained(folder)
                tokenizer.save_pretrained(folder)
                longest = max(workload_config(w, shapes).max_completion_length for w in args.workloads) + 512
                runners.append(VLLMRunner(Path(folder), longest, *common))
                args.vllm_block_size = runners[-1].block_size
        for runner in runners:  # warm-up
            measure(runner, args.workloads[0], min(args.batches), shapes, replace_repeats(args))
        for workload in args.workloads:
            for batch in args.batches:
                for runner in runners:
                    row = measure(runner, workload, batch, shapes, args)
                    logger.info("%s %s %d: %s, work %s", workload, runner.name, batch, row["seconds"], row["work"])
                    rows.append(row)
    widths = workload_config("traces", shapes).max_paths
    simulations = [simulate(shapes, n, args.paper_cap, widths) for n in (64, 256)]
    command = " ".join(["python benchmarks/bench_rollout.py", *sys.argv[1:]])
    write_results(args.out, report(rows, simulations, args, model, command))


def replace_repeats(args):
    return argparse.Namespace(**{**vars(args), "repeats": 1})


if __name__ == "__main__":
    main()
