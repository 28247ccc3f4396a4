"""The rollout viewer's page (`evaluation.viewer`): what it holds of each completion, the data its filters read, safe
escaping, the command's errors, a page beside each GRPO completions table. The page in a browser: test_browser.py."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parallel_r1.cli import run
from parallel_r1.evaluation.viewer import main, page, page_data, read_records, view, write_viewer
from parallel_r1.tags.language import canonical_block
from parallel_r1.testing.completions import completion_records

ROOT = Path(__file__).resolve().parents[1]


def record(completion: str, **fields) -> dict:
    return {"benchmark": "demo", "problem_index": 0, "sample": 0, "prompt": "What is 2+3?", "completion": completion,
            **fields}  # fmt: skip


def embedded(html: str) -> dict:
    """The data a page holds, read back as its script reads it."""
    (data,) = re.findall(r'<script type="application/json" id="data">(.*?)</script>', html, re.DOTALL)
    return json.loads(data)


AGREE = canonical_block(["2+3=5", "3+2=5", "count: 5"], "all give 5")
SPLIT = canonical_block(["2+3=5", "3+2=5", "2+3=6"], "most give 5")


def test_a_block_shows_its_paths_as_columns_its_summary_and_the_text_around_it():
    shown = view(record(f"Think.{SPLIT}Then \\boxed{{5}}", answer="5", correct=True, blocks=1, tokens_total=40,
                        tokens_critical=25))  # fmt: skip
    text, block, tail = shown["nodes"]
    assert text == {"text": "Think."} and tail == {"text": "Then \\boxed{5}"}
    assert [p["text"] for p in block["paths"]] == ["2+3=5", "3+2=5", "2+3=6"]
    assert [p["result"] for p in block["paths"]] == ["5", "5", "6"]
    assert [p["against"] for p in block["paths"]] == [False, False, True]  # the path that ends against the majority
    assert block["summary"] == "most give 5" and block["split"] and shown["split"]
    assert (shown["answer"], shown["correct"], shown["tokens_critical"], shown["tokens_total"]) == ("5", True, 25, 40)
    assert shown["label"] == "benchmark demo · problem 0 · sample 0" and shown["error"] is None


def test_the_filters_data_flag_split_blocks_completions_without_a_block_and_wrong_answers():
    records = [
        record(f"{AGREE} \\boxed{{5}}", correct=True, blocks=1),
        record(f"{SPLIT} \\boxed{{6}}", correct=False, blocks=1),
        record("plain \\boxed{5}", correct=True, blocks=0),
        # a tokenizer without the tags: its shape counts no block, whatever the text spells
        record(f"{SPLIT} \\boxed{{5}}", correct=False, blocks=0),
        # a block cut by the length is not judged split
        record("<Parallel><Path>5</Path><Path>6", correct=None),
    ]
    data = page_data(records, "five")
    flags = [(v["split"], v["blocks"], v["correct"]) for v in data["completions"]]
    assert flags == [(False, 1, True), (True, 1, False), (False, 0, True), (False, 0, False), (False, 1, None)]
    assert data["completions"][3]["nodes"] == [{"text": records[3]["completion"]}]
    assert data["completions"][4]["error"]  # the cut block is reported malformed
    assert data["counts"] == {"all": 5, "wrong": 2, "split": 1, "no_block": 2, "correct": 2}


def test_the_page_holds_every_completion_and_each_block_its_paths():
    records = [record(canonical_block([f"path {p}: {n}" for p in range(n)], "s"), blocks=1) for n in (2, 3, 4)]
    data = embedded(page(records, "widths"))
    assert len(data["completions"]) == 3
    assert [len(v["nodes"][0]["paths"]) for v in data["completions"]] == [2, 3, 4]


def test_no_completion_can_break_out_of_the_page_s_script():
    hostile = "</script><script>alert(1)</script><!-- & \u2028"
    html = page([record(hostile, prompt="<b>x</b>")], "<title>&")
    assert html.count("</script>") == 2  # the data's and the code's own closing tags, nothing more
    assert "<b>x</b>" not in html and "<title>&<" not in html
    data = embedded(html)
    assert data["completions"][0]["nodes"] == [{"text": hostile}] and data["completions"][0]["prompt"] == "<b>x</b>"
    assert data["title"] == "<title>&"


def test_the_command_writes_the_page_beside_the_file(tmp_path):
    source = tmp_path / "completions.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in completion_records(7)) + "\n\n")
    main([str(source)])
    assert len(embedded((tmp_path / "viewer.html").read_text())["completions"]) == 7
    main([str(source), "--output", str(tmp_path / "other.html")])
    assert (tmp_path / "other.html").exists()


@pytest.mark.parametrize(
    "content, error",
    [
        (None, "does not exist"),
        ('{"completion": "a"}\n{"completion": \n', "line 2, is not a JSON record"),
        ('{"completion": "a"}\n[1, 2]\n', "line 2, has no `completion` text"),
        ('{"prompt": "a"}\n', "line 1, has no `completion` text"),
    ],
)
def test_the_command_refuses_a_missing_or_malformed_file_in_one_line(tmp_path, capsys, content, error):
    source = tmp_path / "completions.jsonl"
    if content is not None:
        source.write_text(content)
    with pytest.raises(SystemExit) as stopped:
        run(lambda: main([str(source)]))
    stderr = capsys.readouterr().err
    assert stopped.value.code == 2 and stderr.startswith("error: ") and error in stderr
    assert len(stderr.strip().splitlines()) == 1 and not (tmp_path / "viewer.html").exists()


def test_python_m_runs_the_command_without_torch_and_a_bad_flag_is_one_line(tmp_path):
    command = [sys.executable, "-m", "parallel_r1.evaluation.viewer", str(tmp_path / "none.jsonl"), "--bad"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr == "error: unrecognized arguments: --bad (see --help)\n"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *command[1:-1]], cwd=ROOT, capture_output=True, text=True
    )
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time")]
    assert done.returncode == 2 and said == [f"error: {tmp_path / 'none.jsonl'} does not exist"]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "parallel_r1.answers" in imported and not {"torch", "transformers"} & imported  # starts at once


def test_the_command_refuses_a_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a file"):
        read_records(tmp_path)


def test_a_page_of_10000_completions_holds_them_all(tmp_path):
    records = completion_records(10_000)
    data = embedded(write_viewer(records, tmp_path / "viewer.html", "many").read_text())
    assert len(data["completions"]) == 10_000
    widths = [[len(n["paths"]) for n in v["nodes"] if "paths" in n] for v in data["completions"]]
    assert widths == [r["paths_per_block"] for r in records]
    assert data["counts"]["no_block"] == sum(r["blocks"] == 0 for r in records) > 0
    assert 0 < data["counts"]["split"] < 10_000


def test_grpo_writes_a_page_beside_each_completions_table(tmp_path, tag_prone_dir):
    from parallel_r1.testing.tiny_grpo import ANSWERS, PROBLEMS, tiny_grpo_config, tiny_grpo_trainer

    args = tiny_grpo_config(tmp_path / "out", max_steps=1, per_device_train_batch_size=8, log_completions=True)
    trainer = tiny_grpo_trainer(tag_prone_dir, args)
    trainer.train()
    tables = sorted(p.name for p in (Path(args.output_dir) / "completions").iterdir())
    assert tables == ["completions_00001.html", "completions_00001.parquet"]
    data = embedded((Path(args.output_dir) / "completions" / tables[0]).read_text())
    shown, count = data["completions"], args.generation_batch_size
    assert len(shown) == count == 8
    assert [v["label"] for v in shown] == [f"problem {i // 4} · sample {i % 4}" for i in range(count)]
    texts = [str(c) for c in trainer._logs["completion"]]
    assert all(v["prompt"].startswith("user: ") and any(p in v["prompt"] for p in PROBLEMS) for v in shown)
    answers = dict(zip(PROBLEMS, ANSWERS))  # each completion's reference is its own prompt's answer (kept in step)
    assert all(v["facts"]["reference"] == next(a for p, a in answers.items() if p in v["prompt"]) for v in shown)
    assert all(isinstance(v["correct"], bool) and v["tokens_total"] >= v["tokens_critical"] > 0 for v in shown)
    assert all(set(v["facts"]) == {"reference", "advantage", "length_reward"} for v in shown)
    # the completions keep their tags: the tag-prone model opens blocks, and the page shows their paths
    assert any(v["blocks"] for v in shown) and any("<Path>" in text for text in texts)


def test_a_grpo_page_shows_the_first_whole_groups_up_to_viewer_completions():
    """A generation of 3 groups of 4: a cap of 6 shows the first group only (whole groups), 12 or more all."""
    from collections import deque
    from types import SimpleNamespace

    from parallel_r1.trainers.rollout_viewer import RolloutViewer

    logs = {"prompt": [f"p{i // 4}" for i in range(12)], "completion": [f"Final Answer: {i}" for i in range(12)],
            "advantages": [0.0] * 12, "rewards": {"r": [1.0] * 12}}  # fmt: skip
    for cap, shown in ((6, 4), (12, 12), (100, 12)):
        viewer = RolloutViewer.__new__(RolloutViewer)
        viewer.trainer = SimpleNamespace(_logs=logs, args=SimpleNamespace(viewer_completions=cap))
        viewer.kept = deque({"reference": str(i), "blocks": 0} for i in range(12))
        records = viewer.records(num_generations=4)
        assert [r["completion"] for r in records] == logs["completion"][:shown]
        assert all(r["correct"] for r in records)  # each kept in step with its own completion
