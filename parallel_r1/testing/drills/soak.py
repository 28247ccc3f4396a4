"""Soak drill: `scripts/serve.py` on localhost under mixed traffic for a while, with clients that leave and bad
requests among the good ones.

    python -m parallel_r1.testing.drills.soak --seconds 600 --clients 16 --out benchmarks/results/soak.md

The server serves the tiny tag-prone model (transformers, `--max_running 16 --max_waiting 16`). Each client thread
sends, until the time is up, requests of a random kind (`KINDS`), each with what it must get:

- `good` (a chat or completions request, streamed or not, n of 1 to 3): 200 and every choice with a finish reason,
  or 429 when the queue is full;
- `leave_stream`: a streamed request its client closes after the first text; `leave_wait`: a request whose client
  gives up after 0.2 s (the server must free both);
- `bad_json`, `unknown_model`, `bad_value`, `too_long`: 400 or 404 with OpenAI's error body naming the field.

A request lost (no answer, a 5xx, a stream without [DONE], a choice without a finish reason) or an answer other than
the expected ones is a failure. At the end the server must be idle (no completion running, none waiting) and alive.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

KINDS = ("good", "good", "good", "good", "leave_stream", "leave_wait", "bad_json", "unknown_model", "bad_value",
         "too_long")  # fmt: skip
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def one_request(url: str, kind: str, rng: random.Random) -> str:
    """Send one request of `kind`; return its outcome: "ok", "429", "left", "refused" (a 4xx as expected) or
    "FAIL: ..." (anything else)."""
    chat = {"model": "served", "messages": QUESTION, "max_tokens": rng.randint(8, 256), "seed": rng.randrange(10**6)}
    if kind == "good":
        body = {**chat, "n": rng.randint(1, 3), "stream": rng.random() < 0.5}
        endpoint = "chat/completions"
        if rng.random() < 0.3:
            body = {k: v for k, v in body.items() if k != "messages"} | {"prompt": "2 + 3 ="}
            endpoint = "completions"
        return good(url, endpoint, body)
    if kind == "leave_stream":
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**chat, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
        return "left"
    if kind == "leave_wait":
        try:
            httpx.post(f"{url}/v1/chat/completions", json={**chat, "max_tokens": 3000}, timeout=0.2)
        except httpx.TimeoutException:
            return "left"
        return "left"  # it ended within 0.2 s: nothing was left behind either
    requests = {
        "bad_json": ({"content": b'{"model": "served", "messages": ['}, 400, None),
        "unknown_model": ({"json": {**chat, "model": "nope"}}, 404, "model"),
        "bad_value": ({"json": {**chat, "temperature": -2}}, 400, "temperature"),
        "too_long": ({"json": {"model": "served", "prompt": [5] * 9000, "max_tokens": 4}}, 400, "prompt"),
    }
    send, status, param = requests[kind]
    endpoint = "completions" if kind == "too_long" else "chat/completions"
    response = httpx.post(f"{url}/v1/{endpoint}", headers={"content-type": "application/json"}, timeout=60, **send)
    if response.status_code == status and response.json()["error"]["param"] == param:
        return "refused"
    return f"FAIL: {kind} got {response.status_code} {response.text[:200]}"


def good(url: str, endpoint: str, body: dict) -> str:
    if not body["stream"]:
        response = httpx.post(f"{url}/v1/{endpoint}", json=body, timeout=600)
        if response.status_code == 429:
            return "429"
        if response.status_code != 200:
            return f"FAIL: {response.status_code} {response.text[:200]}"
        choices = response.json()["choices"]
        if len(choices) != body["n"] or any(c["finish_reason"] not in ("stop", "length") for c in choices):
            return f"FAIL: choices {choices}"
        return "ok"
    finishes, done = {}, False
    with httpx.stream("POST", f"{url}/v1/{endpoint}", json=body, timeout=600) as response:
        if response.status_code == 429:
            return "429"
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                for choice in json.loads(line[6:]).get("choices", []):
                    if choice.get("finish_reason"):
                        finishes[choice["index"]] = choice["finish_reason"]
    if not done or sorted(finishes) != list(range(body["n"])):
        return f"FAIL: stream ended without [DONE] or a finish per choice ({finishes})"
    return "ok"


def soak(url: str, seconds: float, clients: int, seed: int) -> Counter:
    counts: Counter = Counter()
    lock, deadline = threading.Lock(), time.monotonic() + seconds

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < deadline:
            kind = rng.choice(KINDS)
            try:
                outcome = one_request(url, kind, rng)
            except Exception as error:  # a lost request: no answer at all
                outcome = f"FAIL: {kind}: {type(error).__name__}: {error}"
            with lock:
                counts[(kind, outcome if not outcome.startswith("FAIL") else "FAIL")] += 1
                if outcome.startswith("FAIL"):
                    counts[outcome[:300]] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


def run_soak(seconds: float, clients: int, seed: int = 0) -> dict:
    """Serve the tiny tag-prone model, soak it; return the counts, the wall time, the server's health after the
    load and whether it is still alive."""
    from parallel_r1.testing.tiny import save_tiny
    from parallel_r1.testing.vllm_server import parallel_r1_server

    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny(Path(tmp) / "served", tag_prone=True)
        flags = ["--served_model_name", "served", "--max_running", "16", "--max_waiting", "16"]
        with parallel_r1_server(model, *flags, log=Path(tmp) / "serve.log") as (url, process):
            began = time.monotonic()
            counts = soak(url, seconds, clients, seed)
            wall = time.monotonic() - began
            settle = time.monotonic()
            while (health := httpx.get(f"{url}/health").json())["running"] or health["waiting"]:
                if time.monotonic() - settle > 30:
                    break
                time.sleep(0.1)
            alive = process.poll() is None
    failures = sum(n for key, n in counts.items() if isinstance(key, tuple) and key[1] == "FAIL")
    return {"counts": counts, "wall": wall, "health": health, "alive": alive, "failures": failures}


def report(result: dict, command: str) -> str:
    counts, health = result["counts"], result["health"]
    rows = "\n".join(f"| {kind} | {outcome} | {n} |" for (kind, outcome), n in sorted(
        (k, n) for k, n in counts.items() if isinstance(k, tuple)))  # fmt: skip
    notes = "\n".join(f"- {key}" for key in counts if isinstance(key, str))
    total = sum(n for k, n in counts.items() if isinstance(k, tuple))
    return f"""# Soak: the server under mixed traffic

Command: `{command}`. {result['wall']:.0f} s, {total} requests; failures (lost or unexpected): {result['failures']}.
After the load: {health['running']} completions running, {health['waiting']} requests waiting, server
{'alive' if result['alive'] else 'DEAD'}.

| kind | outcome | requests |
|---|---|---|
{rows}
{notes}
"""  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run_soak(args.seconds, args.clients, args.seed)
    command = f"python -m parallel_r1.testing.drills.soak --seconds {args.seconds:g} --clients {args.clients} --seed {args.seed}"
    text = report(result, command)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    health = result["health"]
    if result["failures"] or not result["alive"] or health["running"] or health["waiting"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
