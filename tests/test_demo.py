"""The demo: its task (problems, solutions, the programmatic teacher, the splits), the pieces it added to the library
(the `none` template, the `function` teacher backend, the digit-splitting tokenizer) and a shortened end-to-end run
of scripts/demo.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parallel_r1.answers import extract_answer, is_correct
from parallel_r1.cold_start import ColdStartConfig, generate_cold_start
from parallel_r1.data import build_prompt, load_problems
from parallel_r1.data.loaders import final_answer, problem_text
from parallel_r1.demo.task import (
    EASY_MAX,
    TEACHER_MALFORMED,
    TEACHER_SHORTCUT,
    TEACHER_SLIP,
    Problem,
    all_problems,
    corpus,
    path_report,
    split_problems,
    teacher,
    write_data,
)
from parallel_r1.format import parse
from parallel_r1.tiny import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
digits = st.integers(1, 9)
problems = st.builds(Problem, digits, digits, digits, digits)


@given(problems)
def test_a_problem_reads_back_from_its_text_and_both_solutions_end_on_its_answer(problem):
    assert Problem.parse(problem.text) == problem
    assert problem.answer == problem.a * problem.b + problem.c * problem.d
    plain = problem.plain_solution()
    assert final_answer(plain) == str(problem.answer) and not parse(plain).blocks
    trace = problem.parallel_trace()
    parsed = parse(trace)
    assert parsed.well_formed and len(parsed.blocks) == 1 and len(parsed.blocks[0].paths) == 2
    assert extract_answer(trace) == str(problem.answer)


@pytest.mark.parametrize("text", ["", "7*8+3*4=", "0*1+2*3", "10*1+2*3", "7*8-3*4", "seven"])
def test_what_is_not_a_problem_is_refused_by_name(text):
    with pytest.raises(ValueError, match="not a demo problem"):
        Problem.parse(text)


def test_a_slip_makes_a_wrong_first_path_and_a_wrong_answer_and_each_path_has_its_own_style():
    problem = Problem(7, 8, 3, 4)
    slipped = problem.parallel_trace(slip=2)
    assert "7*8=58" in slipped and extract_answer(slipped) == "70"
    assert extract_answer(problem.parallel_trace((True, False), slip=-3)) == "65"
    paths = problem.parallel_trace(shortcuts=(True, False)).split("<Path>")[1:]
    assert paths[0].startswith("68</Path>") and paths[1].startswith("7*8=56\n3*4=12\n56+12=68</Path>")
    assert "</Summary>" not in problem.parallel_trace(close_summary=False)


def test_the_teacher_is_seeded_and_slips_and_breaks_at_its_stated_rates():
    messages = build_prompt("7*8+3*4", "none")
    assert teacher(messages, 5) == teacher(messages, 5)
    answers = [teacher(messages, seed) for seed in range(2000)]
    outcomes = Counter(
        "malformed" if not parse(a).well_formed else "wrong" if extract_answer(a) != "68" else "right" for a in answers
    )
    assert abs(outcomes["wrong"] / 2000 - TEACHER_SLIP) < 0.03
    assert abs(outcomes["malformed"] / 2000 - TEACHER_MALFORMED) < 0.02
    shortcuts = Counter("*" not in path.split("</Path>")[0] for a in answers for path in a.split("<Path>")[1:])
    assert abs(shortcuts[True] / 4000 - TEACHER_SHORTCUT) < 0.03  # each path picks its style
    with pytest.raises(ValueError, match="not a demo problem"):
        teacher(build_prompt("what is 2+2?", "none"), 0)


def test_the_splits_hold_out_hard_problems_that_no_training_file_has(tmp_path):
    splits = split_problems(seed=0, num_test=50, num_cold_start=300)
    assert len(all_problems()) == 9**4
    test = set(splits["test"])
    assert len(test) == 50 and all(p.answer > EASY_MAX for p in test)
    assert len(splits["cold_start"]) == 300 and any(p.easy for p in splits["cold_start"])
    assert all(not p.easy for p in splits["rl"]) and not set(splits["rl"]) & set(splits["cold_start"])
    for name in ("cold_start", "rl", "train"):
        assert not test & set(splits[name]), name
    assert len(splits["train"]) == 9**4 - 50
    files = write_data(tmp_path, num_test=50)
    rows = {name: [json.loads(line) for line in path.open()] for name, path in files.items()}
    assert len(rows["test"]) == 50 and len(rows["pretrain"]) == 9**4 - 50
    held_out = {r["question"] for r in rows["test"]}
    assert not held_out & {r["prompt"][0]["content"] for r in rows["pretrain"]}
    # the loaders read the problem files as they read GSM8K, with the answers checked by the project's answer code
    loaded = load_problems(str(files["test"]), template="none")
    assert loaded[0]["prompt"] == [{"role": "user", "content": rows["test"][0]["question"]}]
    assert is_correct(Problem.parse(rows["test"][0]["question"]).plain_solution(), loaded[0]["answer"])


def test_the_path_report_counts_each_kind_of_path_and_how_often_it_is_right(tmp_path):
    problem = Problem(7, 8, 3, 4)
    completions = [
        problem.parallel_trace((True, False)),  # alone and right, worked out and right
        problem.parallel_trace((False, True), slip=2),  # worked out and wrong (70), alone and right
        "no block: Final Answer: 68",
    ]
    folder = tmp_path / "sft"
    folder.mkdir()
    rows = [json.dumps({"completion": c, "reference": "68"}) for c in completions]
    (folder / "completions.jsonl").write_text("\n".join(rows) + "\n")
    table = path_report({"sft": folder})
    assert table.splitlines()[2] == "| sft | 4 | 50.0 | 100.0 | 50.0 |"


def test_the_none_template_is_the_problem_alone_and_reads_back():
    prompt = build_prompt("  7*8+3*4 \n", "none")
    assert prompt == [{"role": "user", "content": "7*8+3*4"}]
    assert problem_text(prompt) == "7*8+3*4"
    assert problem_text(build_prompt("7*8+3*4", "parallel")) == "7*8+3*4"


def test_the_demo_tokenizer_has_one_token_per_digit():
    tokenizer = build_tokenizer(vocab_size=300, with_tags=False, corpus=corpus(), split_digits=True)
    tokens = tokenizer.tokenize("123+4567=4690")
    assert tokens[:4] == ["1", "2", "3", "+"] and len(tokens) == 13


def function_teacher_run(tmp_path, function: str, max_problems: int) -> ColdStartConfig:
    """A cold start on the demo's cold-start problems, asked of `function` (backend `function`)."""
    files = write_data(tmp_path / "data", num_test=10)
    return ColdStartConfig(
        output_dir=str(tmp_path / "out"),
        model_name_or_path=function,
        backend="function",
        dataset_name=str(files["cold_start"]),
        prompt_template="none",
        max_problems=max_problems,
    )


def test_a_function_teacher_feeds_the_cold_start_pipeline(tmp_path):
    config = function_teacher_run(tmp_path, "parallel_r1.demo.task:teacher", max_problems=200)
    report = generate_cold_start(config)
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").open()]
    reasons = Counter(r["reason"] for r in rejected)
    assert set(reasons) <= {"malformed", "wrong_answer"} and reasons["wrong_answer"] > 0 and reasons["malformed"] > 0
    assert report["kept"] + len(rejected) == 200 and report["kept"] > 150


def unreliable_teacher(messages, seed):
    """The demo's teacher, except that it raises on one request in three and returns a number on another."""
    if seed % 3 == 0:
        raise ValueError("no answer for this one")
    return 42 if seed % 3 == 1 else teacher(messages, seed)


def test_a_function_teacher_that_fails_some_requests_fails_them_alone(tmp_path):
    config = function_teacher_run(tmp_path, "test_demo:unreliable_teacher", max_problems=30)
    with pytest.raises(RuntimeError, match=r"(\d+) requests failed for good") as failure:
        generate_cold_start(config)
    failed = int(failure.value.args[0].split()[0])
    kept = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").open()]
    assert failed + len(kept) == 30 and failed > 10 and len(kept) > 3  # the others' answers are kept
    assert all(isinstance(r["text"], str) for r in kept)


@pytest.mark.parametrize(
    "name, message",
    [
        ("parallel_r1.demo.task:nothing", "cannot load"),
        ("no.such.module:f", "cannot load"),
        ("parallel_r1", "module:function"),
    ],
)
def test_a_function_teacher_that_cannot_be_loaded_is_named(tmp_path, name, message):
    from parallel_r1.cold_start.teachers import make_teacher

    config = ColdStartConfig(output_dir=str(tmp_path), model_name_or_path=name, backend="function")
    with pytest.raises(ValueError, match=message):
        make_teacher(config)


@pytest.mark.slow
def test_a_shortened_demo_runs_every_stage_and_ends_in_the_table(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "scripts/demo.py", "--quick", "--output_dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for model in ("base-init", "base", "base-special", "sft", "grpo"):
        assert (out / model / "config.json").exists(), model
    assert (out / "cold-start" / "train.parquet").exists() and (out / "cold-start" / "report.md").exists()
    for stage in ("sft", "grpo"):  # the records and curves of each run of the project's scripts
        assert {"trainer_state.json", "all_results.json", "training_curves.png"} <= {
            p.name for p in (out / stage).iterdir()
        }
    table = (out / "results" / "table.md").read_text().splitlines()
    rows = {line.split("|")[1].strip(): line for line in table[2:5]}
    assert list(rows) == ["base", "sft", "grpo"]
    for line in rows.values():
        parallel, accuracy = line.split("|")[2:4]
        assert 0 <= float(parallel) <= 100 and 0 <= float(accuracy.split("/")[0]) <= 100
    assert sorted(p.name for p in (out / "results").glob("*.png"))
    assert (out / "results" / "paths.md").read_text().startswith("| Model | Paths | Answer alone % |")
    stages = (out / "timings.md").read_text()
    assert stages.count("\n| ") == 11 and "total" in stages  # ten stages and the total
    assert len(list((out / "logs").glob("*.log"))) == 10
    assert "Table:" in result.stdout and "Logs:" in result.stdout
