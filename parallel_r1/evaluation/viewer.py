"""The rollout viewer: completion records as one self-contained HTML page, each completion read as blocks.

    python -m parallel_r1.evaluation.viewer outputs/eval/parallel-r1/completions.jsonl   # viewer.html beside it
    python -m parallel_r1.evaluation.viewer COMPLETIONS.jsonl --output page.html

`scripts/evaluate.py` writes `viewer.html` next to an evaluation's completions.jsonl; GRPO writes one next to each
completions table TRL saves (`log_completions`). The page needs no server and no network: its style, its script and
its data are inline, the data as JSON whose `<` are escaped, so no completion can close the script that holds it.

Each completion shows its text outside the blocks as text and each block (`language.parse` of the text) as its
paths side by side, each with its result (`answers.path_result`), and the summary beneath; a split vote
(`answers.paths_disagree`) is marked, and so is each path that ends against a majority of its block. Above it: the
final answer, right or wrong (the record's verdict; unknown when the record has none), the reference, the critical
path D and the total T in tokens (the record's shape, `ParallelPolicy.shape`), the first format error, and what else
the record holds (rewards, advantage, how it ended).
A record whose shape counts no block (a tokenizer without the tags) is shown as text, whatever its text spells.
Everything shown is computed here; the page's script only lays it out, filters (wrong only, with a split block,
without a block: all that are ticked must hold) and searches the prompts and completions (case-insensitive), 50
completions a page, so a file of 10,000 opens at once.
"""

from __future__ import annotations

import argparse
import html
import json
import re
from collections import Counter
from pathlib import Path

from ..answers import extract_answer, path_result, paths_disagree
from ..cli import OneLineErrors, run
from ..tags.language import Block, parse
from .viewer_page import PAGE

VIEWER_FILE = "viewer.html"
FACTS = ("reference", "finish", "advantage")  # shown as they are, when a record holds them
LABEL_KEYS = ("benchmark", "problem_index", "sample")  # what names a completion, in this order


def view(record: dict) -> dict:
    """What the page shows of one completion record (a `records.score` line, or any dict with a `completion`)."""
    text = record["completion"]
    parsed = parse(text)
    plain = record.get("blocks", len(parsed.blocks)) == 0
    nodes = [{"text": text}] if plain else [_node(node) for node in parsed.nodes]
    blocks = [node for node in nodes if "paths" in node]
    rewards = record.get("rewards") or {}
    label = [f"{key.removesuffix('_index')} {_short(record[key])}" for key in LABEL_KEYS if key in record]
    return {
        "label": " · ".join(label),
        "prompt": record.get("prompt", ""),
        "nodes": nodes,
        "answer": record["answer"] if "answer" in record else extract_answer(text),
        "correct": record.get("correct"),
        "tokens_total": record.get("tokens_total"),
        "tokens_critical": record.get("tokens_critical"),
        "error": None if plain else parsed.reason,
        "facts": {**{key: record[key] for key in FACTS if key in record}, **rewards},
        "blocks": len(blocks),
        "split": any(block["split"] for block in blocks),
    }


def _node(node) -> dict:
    """A text node as its text; a block as its paths (text, result, closed, and `against`: the path ends against
    a majority of its split block), its summary, whether it is closed and split."""
    if not isinstance(node, Block):
        return {"text": node.content}
    split = paths_disagree(node)
    results = [path_result(path.body) for path in node.paths]
    value, count = Counter(results).most_common(1)[0] if results else (None, 0)
    majority = split and count > len(results) / 2
    paths = [
        {
            "text": path.body.strip(),
            "result": None if result is None else str(result),
            "closed": path.closed,
            "against": majority and result != value,
        }
        for path, result in zip(node.paths, results)
    ]
    summary = None if node.summary is None else node.summary.strip()
    return {"paths": paths, "summary": summary, "closed": node.closed, "split": split}


def _short(value) -> str:
    """A benchmark's name without its folders (a local file's path is long)."""
    return str(value).rstrip("/").rsplit("/", 1)[-1]


def page_data(records: list, title: str) -> dict:
    """Every completion's view, and the counts the filters are labelled with."""
    views = [view(record) for record in records]
    counts = {
        "all": len(views),
        "wrong": sum(v["correct"] is False for v in views),
        "split": sum(v["split"] for v in views),
        "no_block": sum(v["blocks"] == 0 for v in views),
        "correct": sum(v["correct"] is True for v in views),
    }
    return {"title": title, "counts": counts, "completions": views}


def page(records: list, title: str) -> str:
    """The HTML page of `records`."""
    data = json.dumps(page_data(records, title), ensure_ascii=False, separators=(",", ":"))
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # nothing HTML reads
    fill = {"title": html.escape(title), "data": data}
    return re.sub(r"\{\{(title|data)\}\}", lambda match: fill[match.group(1)], PAGE)  # one pass: no text refilled


def write_viewer(records: list, path: Path, title: str) -> Path:
    """Write the page of `records` to `path`; returns it."""
    path = Path(path)
    path.write_text(page(records, title), encoding="utf-8")
    return path


def read_records(path: Path) -> list:
    """The records of a completions file: one JSON object with a `completion` text a line (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    records = []
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                raise ValueError(f"{path}, line {number}, is not a JSON record ({error})") from None
            if not isinstance(record, dict) or not isinstance(record.get("completion"), str):
                raise ValueError(f"{path}, line {number}, has no `completion` text")
            records.append(record)
    return records


class _Parser(OneLineErrors, argparse.ArgumentParser):
    pass


def main(argv: list | None = None) -> None:
    parser = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("completions", help="A completions file: one JSON record a line (completions.jsonl).")
    parser.add_argument("--output", default=None, help=f"Where the page goes (default: {VIEWER_FILE} beside it).")
    args = parser.parse_args(argv)
    source = Path(args.completions)
    records = read_records(source)
    output = Path(args.output) if args.output else source.with_name(VIEWER_FILE)
    print(write_viewer(records, output, str(source)))


if __name__ == "__main__":
    run(main)
