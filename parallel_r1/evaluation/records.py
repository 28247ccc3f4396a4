"""Completion records: one JSON line per sampled completion, written as they arrive and read back on resume.

A record holds the problem (benchmark, index, id, text, reference), the sample index, the completion as text
(tags included) and as token ids, its extracted answer and correctness, and its shape (`ParallelPolicy.shape` of
the ids, in tokens: a tokenizer without the tag tokens has no blocks, whatever its text spells). Every number of an
evaluation is computed from these records (`metrics`), so any table can be recomputed from `completions.jsonl`.

Each process appends to its own shard (`shards/rank-<i>.jsonl`, a `durable.AppendLog`) after every batch; a
line cut by a crash is dropped when the shard is read back. A record is keyed by (benchmark, problem_index, sample):
a restarted evaluation skips the keys it already has.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..answers import extract_answer, extract_reference, is_correct
from ..durable import AppendLog, read_lines


def score(problem: dict, sample: int, rollout, policy) -> dict:
    """The record of one completion (a `rollout.Rollout`) of `problem` (a `problem_record`), sampled with
    `policy` (a `ParallelPolicy`, whose tokenizer reads it and whose settings say which paths were decoded at once)."""
    text = policy.tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)
    return {
        **problem,
        "sample": sample,
        "completion": text,
        "completion_ids": list(rollout.completion_ids),
        "finish": rollout.finish,
        "answer": extract_answer(text),
        "correct": is_correct(text, problem["reference"]),
        **policy.shape(rollout.completion_ids),
    }


def key(record: dict) -> tuple:
    return record["benchmark"], record["problem_index"], record["sample"]


def problem_record(benchmark: str, index: int, row: dict) -> dict:
    """The problem part of a record, from a `data.load_problems` row (prompt, answer, id)."""
    return {
        "benchmark": benchmark,
        "problem_index": index,
        "problem_id": row["id"],
        "prompt": row["prompt"][-1]["content"],
        "reference": extract_reference(row["answer"]),
    }


def read_shards(folder: Path) -> list:
    """Every record written so far, each key once."""
    records = {}
    for shard in sorted((folder / "shards").glob("rank-*.jsonl")):
        for record in read_lines(shard):
            records.setdefault(key(record), record)
    return list(records.values())


def shard_writer(folder: Path, rank: int) -> AppendLog:
    """The append log of one process's shard."""
    return AppendLog(folder / "shards" / f"rank-{rank}.jsonl")


def write_completions(path: Path, records: list) -> list:
    """All records in one file, ordered by benchmark order of appearance, problem and sample; returns them in that
    order."""
    order = {}
    for record in records:
        order.setdefault(record["benchmark"], len(order))
    ordered = sorted(records, key=lambda r: (order[r["benchmark"]], r["problem_index"], r["sample"]))
    with path.open("w", encoding="utf-8") as file:
        for record in ordered:
            file.write(json.dumps(record, ensure_ascii=False) + "\n")
    return ordered
