"""The demo: its task (problems, solutions, the programmatic teacher, the splits), the pieces it added to the library
(the `none` template, the `function` teacher backend, the digit-splitting tokenizer) and a shortened end-to-end run
of scripts/demo.py."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_r1.answers import extract_answer, final_answer, is_correct
from parallel_r1.cold_start import ColdStartConfig, generate_cold_start
from parallel_r1.data import DataArguments, build_prompt, load_problems
from parallel_r1.data.loaders import problem_text
from parallel_r1.durable import read_lines
from parallel_r1.tags.language import parse, stats
from parallel_r1.testing.demo import path_probe, task
from parallel_r1.testing.demo.paper import PAPER_ROWS, drift, findings, logged, paper_table
from parallel_r1.testing.demo.task import (
    DEFAULT_VARIANT,
    EASY_MAX,
    NUM_PATHS,
    TEACHER_LATE,
    TEACHER_MALFORMED,
    TEACHER_PLAIN,
    TEACHER_SLIP,
    VARIANTS,
    Problem,
    all_problems,
    block_teacher,
    corpus,
    majority,
    plain_teacher,
    split_problems,
    teacher,
    token_table,
    vote_report,
    write_data,
)
from parallel_r1.testing.tiny import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
digits = st.integers(1, 9)
problems = st.builds(Problem, digits, digits, digits, digits)
any_variant = st.builds(Problem, st.integers(1, 99), digits, digits, digits)  # the first factor of either variant


@given(any_variant)
def test_a_problem_reads_back_from_its_text_and_both_solutions_end_on_its_answer(problem):
    assert Problem.parse(problem.text) == problem
    assert problem.answer == problem.a * problem.b + problem.c * problem.d
    plain = problem.plain_solution()
    assert final_answer(plain) == str(problem.answer) and not parse(plain).blocks
    trace = problem.parallel_trace()
    parsed = parse(trace)
    assert parsed.well_formed and len(parsed.blocks) == 1 and len(parsed.blocks[0].paths) == NUM_PATHS
    assert extract_answer(trace) == str(problem.answer)


@given(st.lists(st.integers(0, 9), min_size=1, max_size=6))
def test_the_vote_is_the_most_common_value_and_the_first_of_a_tie(values):
    vote = majority(values)
    counts = Counter(values)
    assert counts[vote] == max(counts.values())
    assert values.index(vote) == min(values.index(v) for v in counts if counts[v] == counts[vote])


def test_the_summary_states_the_vote_and_outvotes_a_lone_slip():
    problem = Problem(7, 8, 3, 4)
    slipped = problem.parallel_trace((0, 2, 0))
    assert "7*8=58\n3*4=12\n58+12=70</Path>" in slipped
    assert slipped.endswith("</Parallel>\n<Summary>Final Answer: 68</Summary>") and extract_answer(slipped) == "68"
    assert extract_answer(problem.parallel_trace((3, 3, 0))) == "71"  # two alike slips win the vote
    assert extract_answer(problem.parallel_trace((1, 2, 3))) == "69"  # no majority: the first
    assert "</Summary>" not in problem.parallel_trace(close_summary=False)
    assert problem.plain_solution(slip=-6) == "7*8=50\n3*4=12\n50+12=62\nFinal Answer: 62"


def test_a_late_block_checks_a_working_whose_result_votes_and_wins_a_tie():
    problem = Problem(7, 8, 3, 4)
    late = problem.parallel_trace((0, 0, 0), first=0)
    assert late.startswith("7*8=56\n3*4=12\n56+12=68\n<Parallel><Path>7*8=56")
    parsed = parse(late)
    assert parsed.well_formed and len(parsed.blocks[0].paths) == NUM_PATHS
    assert stats(parsed).block_positions[0] == late.index("<Parallel>") / len(late)  # after the working (characters)
    assert extract_answer(problem.parallel_trace((2, 2, 0), first=0)) == "68"  # two against two: the working's
    assert extract_answer(problem.parallel_trace((2, 3, 4), first=0)) == "68"  # no majority: the working's
    assert extract_answer(problem.parallel_trace((0, 0, 0), first=5)) == "68"  # a slipped working outvoted
    assert extract_answer(problem.parallel_trace((2, 2, 0), first=2)) == "70"  # the working and two slips


@pytest.mark.parametrize("late_share", [TEACHER_LATE, 0.45])  # the demo's, and the late-block experiment's
def test_the_teacher_is_seeded_and_mixes_plain_early_and_late_block_answers_at_its_stated_rates(
    late_share, monkeypatch
):
    monkeypatch.setattr(task, "TEACHER_LATE", late_share)
    messages = build_prompt("7*8+3*4", "none")
    assert teacher(messages, 5) == teacher(messages, 5)
    answers = [teacher(messages, seed) for seed in range(3000)]
    plain = [a for a in answers if "<Parallel>" not in a]
    late = [a for a in answers if "<Parallel>" in a and not a.startswith("<Parallel>")]
    assert abs(len(plain) / 3000 - TEACHER_PLAIN) < 0.02
    assert abs(len(late) / 3000 - late_share) < 0.03
    blocks = [a for a in answers if "<Parallel>" in a]
    malformed = sum(not parse(a).well_formed for a in blocks)
    assert abs(malformed / len(blocks) - TEACHER_MALFORMED) < 0.02
    assert all(len(parse(a).blocks[0].paths) == NUM_PATHS for a in blocks)
    workings = [a.split("<Parallel>")[0] for a in late] + plain
    attempts = [path.split("</Path>")[0] for a in blocks for path in a.split("<Path>")[1:]] + workings
    slipped = sum("7*8=56" not in attempt for attempt in attempts)
    assert abs(slipped / len(attempts) - TEACHER_SLIP) < 0.02  # each attempt slips on its own
    with pytest.raises(ValueError, match="not a demo problem"):
        teacher(build_prompt("what is 2+2?", "none"), 0)


def test_the_plain_teacher_writes_only_plain_solutions_that_slip_at_the_teachers_rate():
    messages = build_prompt("7*8+3*4", "none")
    assert plain_teacher(messages, 5) == plain_teacher(messages, 5)
    answers = [plain_teacher(messages, seed) for seed in range(3000)]
    assert not any("<" in answer for answer in answers)
    assert all(answer.startswith("7*8=") and "\nFinal Answer: " in answer for answer in answers)
    assert abs(sum("7*8=56" not in answer for answer in answers) / 3000 - TEACHER_SLIP) < 0.02


@settings(deadline=None)  # the first example imports the prompt loaders
@given(problems, st.integers(0, 2**32 - 1))
def test_the_block_teacher_writes_the_plain_teachers_attempt_in_every_path_and_states_it(problem, seed):
    messages = build_prompt(problem.text, "none")
    working, result = plain_teacher(messages, seed).rsplit("\nFinal Answer: ", 1)
    trace = block_teacher(messages, seed)
    parsed = parse(trace)
    assert parsed.well_formed and len(parsed.blocks) == 1
    assert [path.body for path in parsed.blocks[0].paths] == [working] * NUM_PATHS
    assert final_answer(trace) == result


def test_the_default_teacher_writes_the_traces_it_wrote_before_the_late_kind_existed():
    """With `TEACHER_LATE = 0` no extra draw is made: the digest of 938 traces (every 7th problem, a seed each) as the
    teacher of commit 525e2cd wrote them, before `TEACHER_LATE`."""
    assert TEACHER_LATE == 0
    traces = [teacher(build_prompt(p.text, "none"), seed) for seed, p in enumerate(all_problems()[::7])]
    assert hashlib.sha256("\x00".join(traces).encode()).hexdigest()[:16] == "1eef77e4f0795c73"


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
    loaded = load_problems(DataArguments(dataset_name=str(files["test"])), template="none")
    assert loaded[0]["prompt"] == [{"role": "user", "content": rows["test"][0]["question"]}]
    assert is_correct(Problem.parse(rows["test"][0]["question"]).plain_solution(), loaded[0]["answer"])


@pytest.mark.parametrize("text", ["100*2+3*4", "07*2+3*4", "0*2+3*4", "17*12+3*4", "17*2+13*4", "1*2+3*4+5*6", "12*3"])
def test_a_problem_outside_both_variants_is_refused_by_name(text):
    with pytest.raises(ValueError, match="not a demo problem"):
        Problem.parse(text)


def test_the_two_digit_variant_holds_out_its_own_hard_problems_and_keeps_the_working(tmp_path):
    """The harder variant: every first factor 10-99, split as the demo's task (held out, hard), the same working."""
    every = all_problems("two-digit")
    assert len(every) == 90 * 9**3 and {p.a for p in every} == set(range(10, 100))
    splits = split_problems(seed=0, num_test=50, num_cold_start=300, variant="two-digit")
    test = set(splits["test"])
    assert len(test) == 50 and all(p.answer > EASY_MAX and p.a >= 10 for p in test)
    assert all(not test & set(splits[name]) for name in ("cold_start", "rl", "train"))
    assert len(splits["train"]) == len(every) - 50
    assert Problem.parse("17*8+3*4").plain_solution() == "17*8=136\n3*4=12\n136+12=148\nFinal Answer: 148"
    files = write_data(tmp_path, num_test=50, variant="two-digit")
    questions = [json.loads(line)["question"] for line in files["test"].open()]
    assert all(Problem.parse(q).a >= 10 for q in questions)
    assert all(p.a < 10 for p in split_problems(seed=0, num_test=50, num_cold_start=300)["test"])  # the default's


def test_the_vote_report_counts_paths_blocks_and_plain_answers(tmp_path):
    problem = Problem(7, 8, 3, 4)
    completions = [
        (problem.parallel_trace((0, 0, 0)), True),  # three right paths, right
        (problem.parallel_trace((0, 2, 0)), True),  # a slip outvoted: two right paths of three, right
        (problem.parallel_trace((1, 1, 0)), False),  # outvoted by two alike slips: one right path, wrong
        (problem.parallel_trace((0, 2, 0)).replace("Answer: 68", "Answer: 70"), False),  # the minority's value
        (problem.parallel_trace((0, 2, 0)).replace("Answer: 68", "Answer: 71"), False),  # no path's value
        (problem.plain_solution(), True),
    ]
    folder = tmp_path / "sft"
    folder.mkdir()
    rows = [json.dumps({"completion": c, "reference": "68", "correct": ok}) for c, ok in completions]
    (folder / "completions.jsonl").write_text("\n".join(rows) + "\n")
    table = vote_report({"sft": folder})
    # 10 of 15 paths right (66.7%), 2 of 5 block answers (40.0%); 4 of 5 blocks disagree; 1 of 5 has one right path
    # of three (no right majority); the plain one right; of the 4 blocks of two against one, 2 summaries state the
    # majority, 1 the minority and 1 a value no path reached
    assert table.splitlines()[2] == "| sft | 6 | 83.3 | 66.7 | 40.0 | -26.7 | 80.0 | 20.0 | 100.0 | 4 | 50.0 | 25.0 |"


def test_the_token_table_reads_each_runs_steps_batch_lengths_and_tokens(tmp_path):
    logs = [
        {"step": 5, "completions/mean_length": 30.0, "num_tokens": 1000.0},
        {"step": 10, "completions/mean_length": 32.0, "num_tokens": 2100.0},
        {"step": 10, "train_loss": 0.1},  # the closing entry: no length, no tokens
    ]
    state = {"global_step": 10, "train_batch_size": 384, "log_history": logs}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    table = token_table({"plain, 3x": tmp_path / "trainer_state.json"})
    assert table.splitlines()[2] == "| plain, 3x | 10 | 384 | 31.0 | 2,100 |"


def test_a_listed_summary_lists_the_paths_results_in_order_then_the_majority():
    trace = Problem(7, 8, 3, 4).parallel_trace((0, 2, 0), listed=True)
    assert trace.endswith("<Summary>68 70 68\nFinal Answer: 68</Summary>")


def test_the_none_template_is_the_problem_alone_and_reads_back():
    prompt = build_prompt("  7*8+3*4 \n", "none")
    assert prompt == [{"role": "user", "content": "7*8+3*4"}]
    assert problem_text(prompt) == "7*8+3*4"
    assert problem_text(build_prompt("7*8+3*4", "parallel")) == "7*8+3*4"


def test_the_demo_tokenizer_has_one_token_per_digit():
    tokenizer = build_tokenizer(vocab_size=300, with_tags=False, corpus=corpus(), split_digits=True)
    tokens = tokenizer.tokenize("123+4567=4690")
    assert tokens[:4] == ["1", "2", "3", "+"] and len(tokens) == 13


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variants_longest_working_fits_the_demo_recipes_budgets(variant):
    """The harder variant runs on the same recipes: its longest prompt, path and block stay within the budgets that
    the GRPO recipes and eval.yaml give (and sft.yaml records), so nothing is cut."""
    tokenizer = build_tokenizer(vocab_size=300, with_tags=True, corpus=corpus(), split_digits=True)
    longest = max(all_problems(variant), key=lambda p: len(p.parallel_trace()))  # the most digits
    working, trace = longest.working()[0], longest.parallel_trace()
    text = tokenizer.apply_chat_template(
        build_prompt(longest.text, "none"), add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    # each budget a recipe sets (grpo_plain.yaml has no path budget; only the GRPO recipes cut prompts)
    lengths = {
        "max_prompt_length": len(prompt),
        "max_path_tokens": len(tokenizer.tokenize(working)),
        "max_completion_length": len(tokenizer.tokenize(trace)) + 1,  # and the end token
    }
    for recipe in ("grpo.yaml", "grpo_plain.yaml", "eval.yaml", "sft.yaml"):
        budgets = yaml.safe_load((ROOT / "recipes" / "demo" / recipe).read_text())
        assert "max_completion_length" in budgets, recipe
        for budget, length in lengths.items():
            if budget in budgets:
                assert length <= budgets[budget], (recipe, budget)


def function_teacher_run(
    tmp_path, function: str, max_problems: int, variant: str = DEFAULT_VARIANT
) -> ColdStartConfig:
    """A cold start on the demo's cold-start problems, asked of `function` (backend `function`)."""
    files = write_data(tmp_path / "data", num_test=10, variant=variant)
    return ColdStartConfig(
        output_dir=str(tmp_path / "out"),
        model_name_or_path=function,
        backend="function",
        dataset_name=str(files["cold_start"]),
        prompt_template="none",
        max_train_samples=max_problems,
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_function_teacher_feeds_the_cold_start_pipeline(tmp_path, variant):
    config = function_teacher_run(tmp_path, "parallel_r1.testing.demo.task:teacher", max_problems=200, variant=variant)
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
        ("parallel_r1.testing.demo.task:nothing", "cannot load"),
        ("no.such.module:f", "cannot load"),
        ("parallel_r1", "module:function"),
    ],
)
def test_a_function_teacher_that_cannot_be_loaded_is_named(tmp_path, name, message):
    from parallel_r1.cold_start.teachers import make_teacher

    config = ColdStartConfig(
        output_dir=str(tmp_path), model_name_or_path=name, backend="function", dataset_name="gsm8k"
    )
    with pytest.raises(ValueError, match=message):
        make_teacher(config)


def quick_demo(quick_demos: dict, job: str) -> tuple[Path, subprocess.CompletedProcess]:
    """One quick job's folder and process; it must have succeeded (its output's tail is the message)."""
    out, result = quick_demos[job]
    assert result.returncode == 0, result.stdout[-6000:]
    return out, result


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first of the four to ask waits for all of them
def test_a_shortened_demo_runs_every_stage_and_ends_in_the_table(quick_demos):
    """`scripts/demo.py --matched --quick` (make demo's stages, and plain GRPO given 3x the completions a step, from
    the base and from a plain SFT): every stage writes its files, the tables hold every model, against plain GRPO
    and against each matched run; then the summary probe reads the SFT and RL models."""
    out, result = quick_demo(quick_demos, "matched")
    runs = ("grpo", "grpo-plain", "grpo-plain-matched", "grpo-sft-plain-matched")
    for model in ("base-init", "base", "base-special", "sft", "sft-plain", *runs):
        assert (out / model / "config.json").exists(), model
    for cold_start in ("cold-start", "cold-start-plain"):
        assert (out / cold_start / "train.parquet").exists() and (out / cold_start / "report.md").exists()
    for stage in ("sft", "sft-plain", *runs):  # the records and curves of each run
        assert {"trainer_state.json", "all_results.json", "training_curves.png"} <= {
            p.name for p in (out / stage).iterdir()
        }
    labels = ["base", "grpo-plain", "grpo-plain-matched", "sft-plain", "grpo-sft-plain-matched", "sft", "parallel-r1"]
    tables = {"": "grpo-plain", "matched": "grpo-plain-matched", "sft-plain": "grpo-sft-plain-matched"}
    for folder, baseline in tables.items():
        table = (out / "results" / folder / "table.md").read_text().splitlines()
        rows = {line.split("|")[1].strip(): line for line in table[2:9]}
        assert list(rows) == labels
        for line in rows.values():
            parallel, accuracy = line.split("|")[2:4]
            assert 0 <= float(parallel) <= 100 and 0 <= float(accuracy.split("±")[0]) <= 100
        (header,) = [i for i, line in enumerate(table) if f"mean minus {baseline}'s (points)" in line]
        against = [line.split("|")[1].strip() for line in table[header + 2 : header + 8]]
        assert against == [label for label in labels if label != baseline]  # paired by problem
    # the matched runs had 3x the completions a step of the plain one, over the same steps
    tokens = {line.split("|")[1].strip(): line.split("|")[2:4] for line in
              (out / "results" / "tokens.md").read_text().splitlines()[2:]}  # fmt: skip
    assert list(tokens) == ["grpo-plain", "grpo-plain-matched", "grpo-sft-plain-matched", "parallel-r1"]
    for matched in ("grpo-plain-matched", "grpo-sft-plain-matched"):
        assert int(tokens[matched][1]) == 3 * int(tokens["grpo-plain"][1])
        assert tokens[matched][0] == tokens["grpo-plain"][0] == tokens["parallel-r1"][0]
    assert sorted(p.name for p in (out / "results").glob("*.png"))
    assert (out / "results" / "votes.md").read_text().startswith("| Model | Answers | With a block % |")
    stages = (out / "timings.md").read_text()
    assert stages.count("\n| ") == 22 and "total" in stages  # twenty-one stages and the total
    assert len(list((out / "logs").glob("*.log"))) == 21
    assert "Table:" in result.stdout and "Logs:" in result.stdout
    # each stage's banner says how long the demo has run, and its end how long it took
    banners = re.findall(r"= Stage (\d+): .+ \((?:\d+ min )?\d+ s in\) =", result.stdout)
    assert banners == [str(n) for n in range(1, 22)]
    assert len(re.findall(r"\n-- .+: (?:\d+ min )?\d+ s \(the demo: (?:\d+ min )?\d+ s\)", result.stdout)) == 21
    probe = subprocess.run(
        [sys.executable, "-m", "parallel_r1.testing.demo.probe", str(out / "sft"), str(out / "grpo"),
         "--test", str(out / "data" / "test.jsonl"), "--max_problems", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in probe.stdout.strip().splitlines()[2:]]
    assert [row[1].strip() for row in rows] == ["right majority", "wrong majority", "all agree"] * 2
    for row in rows:
        shares = [float(cell) for cell in row[2:] if cell.strip() != "-"]
        assert all(0 <= share <= 100 for share in shares) and sum(shares) == pytest.approx(100, abs=0.2)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_shortened_strong_demo_runs_every_arm_from_one_plain_sft(quick_demos):
    """`scripts/demo.py --strong --quick`: both arms start from the plain SFT (arm c's parallel cold start and SFT
    too), each stage writes its model, and the tables hold every arm."""
    out, result = quick_demo(quick_demos, "strong")
    for model in ("sft-plain", "sft-plain-more", "grpo-strong-plain", "sft-parallel", "grpo"):
        assert (out / model / "config.json").exists(), model
    started = {
        log.stem: log.read_text().splitlines()[0].split("--model_name_or_path ")[1].split()[0]
        for log in (out / "logs").glob("*.log")
        if log.stem in ("sft-plain", "sft-plain-more", "sft-parallel", "grpo-strong-plain", "grpo")
    }
    assert started == {
        "sft-plain": str(out / "base-special"), "sft-plain-more": str(out / "sft-plain"),
        "sft-parallel": str(out / "sft-plain"), "grpo-strong-plain": str(out / "sft-plain-more"),
        "grpo": str(out / "sft-parallel"),
    }  # fmt: skip
    results = out / "results" / "strong"
    arms = [line.split("|")[1].strip() for line in (results / "arms.md").read_text().splitlines()[2:]]
    assert arms[:2] == ["(a) plain", "(b) cons@3 of (a)"] and arms[-1] == "(c) Parallel-R1" and len(arms) in (3, 4)
    stages = [line.split("|")[1].strip() for line in (results / "stages.md").read_text().splitlines()[2:]]
    assert stages == ["plain SFT", "plain SFT, continued", "(a) plain", "parallel SFT", "(c) Parallel-R1"]
    assert len((results / "votes.md").read_text().splitlines()) == 4
    assert (out / "timings.md").read_text().count("\n| ") == 16  # fifteen stages and the total
    assert "(b) cons@3 of (a)" in result.stdout and "Table:" in result.stdout
    # the path probe reads the plain model's working plainly and in the parallel model's paths
    problems = [Problem.parse(row["question"]) for row in read_lines(out / "data" / "test.jsonl")][:3]
    probed = path_probe.probe(str(out / "sft-plain"), str(out / "sft-parallel"), problems)
    assert list(probed) == ["plain", "path 1", "path 2", "path 3"]
    for path in ("path 2", "path 3"):  # Unseen: a path reads the prompt and itself, alike up to float rounding
        assert probed[path] == pytest.approx(probed["path 1"], rel=1e-6)
    assert all(0 <= accuracy <= 100 and logp <= 0 for accuracy, logp in probed.values())
    with pytest.raises(ValueError, match="is causal"):
        path_probe.probe(str(out / "sft-plain"), str(out / "sft-plain"), problems)


def evaluation_folder(folder: Path, samples: dict, total: int, critical: int) -> Path:
    """An evaluation folder whose completions.jsonl holds, per problem index, its samples' answers (reference "5")."""
    folder.mkdir(parents=True)
    rows = [
        {"benchmark": "test.jsonl", "problem_index": problem, "sample": i, "answer": answer, "correct": answer == "5",
         "tokens_total": total, "tokens_critical": critical, "completion": f"Final Answer: {answer}",
         "reference": "5"}
        for problem, answers in samples.items() for i, answer in enumerate(answers)
    ]  # fmt: skip
    (folder / "completions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_the_strong_arms_table_pairs_each_arm_with_the_plain_arm_and_its_vote_at_a_latency(tmp_path):
    from parallel_r1.testing.demo.strong import arms_table, matching_samples, write

    plain = evaluation_folder(tmp_path / "plain", {0: ["5", "4", "5", "5"], 1: ["4", "4", "5", "3"]}, 20, 20)
    parallel = evaluation_folder(tmp_path / "parallel", {0: ["5"] * 4, 1: ["5", "4", "5", "4"]}, 80, 30)
    assert matching_samples(80, 20) == 4 and matching_samples(5, 20) == 1
    rows = write(plain, parallel, tmp_path / "out")
    assert list(rows) == ["(a) plain", "(b) cons@3 of (a)", "(b) cons@4 of (a)", "(c) Parallel-R1"]
    # (a): 3/4 and 1/4 right; cons@3: problem 0's four subsets all vote 5, problem 1's vote 4, 4, 4 and 4 (5 4 3: a
    # tie, the first): 1 and 0; cons@4: 5 and 4; (c): 1 and 1/2
    assert [rows[label]["accuracy"] for label in rows] == [0.5, 0.5, 0.5, 0.75]
    assert rows["(b) cons@3 of (a)"]["latency_mean"] == 20 and rows["(b) cons@4 of (a)"]["tokens"] == 80
    table = arms_table(rows).splitlines()
    assert table[2] == "| (a) plain | 50.0 ± 25.0 | - | +0.0 ± 25.0 (+0.0 SE) | 20.0 | 20 | 20.0 |"
    assert table[5] == "| (c) Parallel-R1 | 75.0 ± 25.0 | +25.0 ± 0.0 | +25.0 ± 25.0 (+1.0 SE) | 30.0 | 30 | 80.0 |"
    assert (tmp_path / "out" / "arms.md").read_text() == "\n".join(table) + "\n"
    assert set(json.loads((tmp_path / "out" / "arms.json").read_text())["(b) cons@4 of (a)"]) == {
        "accuracy", "stderr", "latency_mean", "latency_p90", "tokens", "samples", "minus_plain", "minus_cons3"}  # fmt: skip
    near = evaluation_folder(tmp_path / "near", {0: ["5"] * 4, 1: ["5"] * 4}, 60, 30)
    assert list(write(plain, near, tmp_path / "out3")) == ["(a) plain", "(b) cons@3 of (a)", "(c) Parallel-R1"]


def test_the_seeds_table_has_a_row_per_run_with_every_arm_and_parallel_r1s_gaps(tmp_path):
    from parallel_r1.testing.demo.strong import seeds_table, table_rows, write

    plain = evaluation_folder(tmp_path / "plain", {0: ["5", "4", "5", "5"], 1: ["4", "4", "5", "3"]}, 20, 20)
    runs = {}
    for seed, tokens in ((0, 80), (1, 60)):  # cons@4 matches the first run's tokens, cons@3 the second's
        parallel = evaluation_folder(
            tmp_path / f"parallel-{seed}", {0: ["5"] * 4, 1: ["5", "4", "5", "4"]}, tokens, 30
        )
        results = tmp_path / f"run-{seed}" / "results" / "strong"
        write(plain, parallel, results)
        (results / "votes.md").write_text(vote_report({"parallel SFT": plain, "(c) Parallel-R1": parallel}) + "\n")
        runs[str(seed)] = tmp_path / f"run-{seed}"
    table = seeds_table(runs).splitlines()
    assert len(table) == 4 and table[0].startswith("| Run | (a) plain % | cons@3 of (a) % | cons@k of (a) % |")
    (tmp_path / "table.md").write_text(seeds_table(runs))
    rows = table_rows(tmp_path / "table.md")
    assert rows["0"]["cons@k of (a) %"] == "50.0 ± 50.0 (k=4)" and rows["1"]["cons@k of (a) %"] == "50.0 ± 50.0 (k=3)"
    assert rows["0"]["Parallel-R1 minus (a) (points)"] == "+25.0 ± 0.0"
    assert (
        rows["0"]["Critical path mean (p90), tokens: (a) / cons@3 / cons@k / Parallel-R1"]
        == "20 (20) / 20 (20) / 20 (20) / 30 (30)"
    )


def results_of(mean: float, parallel: float, stderr: float = 0.01) -> dict:
    """An evaluation's results.json, as much of it as the paper table reads."""
    metrics = {"samples": 4, "mean@4": mean, "mean@4_stderr": stderr, "pass@4": min(1.0, mean + 0.1),
               "pass@4_stderr": stderr, "parallel_ratio": parallel, "tokens_total": 50.0,
               "critical_over_total": 0.8}  # fmt: skip
    return {"benchmarks": {"test.jsonl": metrics}}


def trainer_state(path: Path, positions: list, ratio: float = 0.9) -> Path:
    history = [
        {"step": 5 * (i + 1), "parallel/block_position": p, "parallel/ratio": ratio} for i, p in enumerate(positions)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"log_history": [*history, {"step": 99, "train_runtime": 1.0}]}))
    return path


def test_drift_reads_the_logged_block_position_and_follows_a_run_continued_from_a_checkpoint(tmp_path):
    first = trainer_state(tmp_path / "a" / "trainer_state.json", [0.1, 0.1, 0.1, 0.2])
    second = trainer_state(tmp_path / "b" / "trainer_state.json", [0.5, 0.7, 0.7, 0.7])
    assert [s for s, _ in logged([first, second], "parallel/block_position")] == [5, 10, 15, 20, 25, 30, 35, 40]
    drifts = drift(
        {"mid": [first, second], "flat": [first], "none": [trainer_state(tmp_path / "c" / "t.json", [0.0, 0.0], 0.0)]}
    )
    assert drifts["mid"] == pytest.approx((0.1, 0.7)) and drifts["flat"] == pytest.approx(
        (0.1, 0.15)
    )  # two points each, of four
    assert "none" not in drifts  # no block opened: no position to follow


def records_right_on(problems) -> list:
    """Evaluation records of 100 problems, one sample each, right on `problems`."""
    return [{"benchmark": "test.jsonl", "problem_index": i, "correct": i in problems} for i in range(100)]


def test_the_paper_table_marks_each_finding_by_its_direction():
    results = {
        "base": results_of(0.80, 0.0), "sft-seen": results_of(0.50, 0.95), "sft-unseen": results_of(0.55, 0.90),
        "grpo-plain": results_of(0.85, 0.0), "r1-seen": results_of(0.88, 0.5), "r1-unseen-s1": results_of(0.90, 0.3),
        "r1-unseen-s2": results_of(0.89, 0.6), "r1-unseen-tiered": results_of(0.87, 0.95),
        "mid-training": results_of(0.86, 0.1),
    }  # fmt: skip
    # 2 is weighed by the error of the difference paired by problem. The best variant (s1) is right on 90 problems
    # and the baseline on 85; when the baseline's 85 are among the 90, the gap is +5 ± 2.2 points (2.3 SE); when 5
    # of them are not, the same +5 has 10 problems against and 5 for it: ± 3.9 points (1.3 SE).
    records = {"r1-unseen-s1": records_right_on(range(90)), "grpo-plain": records_right_on(range(85))}
    holds = {text[0]: ok for text, ok, _ in findings(results, {"r1-unseen-s2": (0.2, 0.5)}, records)}
    assert holds == {"1": True, "2": True, "3": True, "4": True, "5": True}
    crossed = {**records, "grpo-plain": records_right_on(range(10, 95))}
    numbers = {text[0]: (ok, said) for text, ok, said in findings(results, {}, crossed)}
    assert numbers["2"] == (False, "best variant r1-unseen-s1 90.0 against 85.0: +5.0 ± 3.9 points")
    assert not numbers["4"][0]  # no run moved its block later
    noise = {"r1-unseen-s1": (0.00001, 0.00118)}  # what make demo-paper logged: the block stays at the start
    assert not dict((t[0], ok) for t, ok, _ in findings(results, noise, records))["4"]
    flat = {**results, "r1-unseen-s1": results_of(0.90, 0.85)}  # accuracy-only kept its blocks
    assert not dict((t[0], ok) for t, ok, _ in findings(flat, {}, records))["3"]
    table = paper_table(results, {"r1-unseen-s2": (0.2, 0.5)}, records).splitlines()
    assert table[0].startswith("| Ours | Paper's row |") and len(table) == 2 + len(results) + 1 + 2 + 5
    assert "| r1-unseen-s2 | Parallel-R1-Unseen S2 (alternating) | 63.0 | 46.8 | 60.0 | 89.0 ± 1.0 |" in table[8]
    assert table[8].endswith("| 0.20 -> 0.50 |") and table[-1].endswith("| yes | 86.0 against 85.0 |")
    assert "+5.0 ± 2.2 points" in table[-4]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_shortened_demo_paper_writes_every_row_the_table_and_the_drift(quick_demos):
    """`scripts/demo.py --paper --quick`: every stage runs and writes its files, and the paper table parses (a row
    per run, five findings, each marked). Files, not findings: a quick run is a smoke test, not a result."""
    out, _ = quick_demo(quick_demos, "paper")
    for model, _, _ in PAPER_ROWS.values():
        assert (out / model / "config.json").exists(), model
    table = (out / "paper" / "paper_table.md").read_text().splitlines()
    rows = [line.split("|")[1].strip() for line in table[2 : 2 + len(PAPER_ROWS)]]
    assert rows == list(PAPER_ROWS)
    for line in table[2 : 2 + len(PAPER_ROWS)]:
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        assert 0 <= float(cells[4]) <= 100 and 0 <= float(cells[5].split("±")[0]) <= 100
    marks = [line.split("|")[2].strip() for line in table[-5:]]
    assert len(marks) == 5 and set(marks) <= {"yes", "no"}
    assert (out / "paper" / "block_position.png").exists() and (out / "paper" / "votes.md").exists()
    assert (out / "grpo" / "checkpoint-1" / "trainer_state.json").exists()  # mid-training starts from S2's half


def test_the_varied_width_teacher_writes_blocks_of_two_to_four_attempts_evenly():
    from parallel_r1.testing.demo.task import WIDTHS, varied_width_teacher

    messages = build_prompt("7*8+3*4", "none")
    assert varied_width_teacher(messages, 5) == varied_width_teacher(messages, 5)
    widths = [len(b.paths) for seed in range(3000) for b in parse(varied_width_teacher(messages, seed)).blocks]
    assert set(widths) == set(WIDTHS)
    for width in WIDTHS:
        assert abs(widths.count(width) / len(widths) - 1 / len(WIDTHS)) < 0.03


def test_the_width_table_shows_each_run_at_its_start_and_end(tmp_path):
    from parallel_r1.testing.demo.width import curve_table, plot_width, width_table

    def entry(step, width, accuracy):  # a width of 0: a step without blocks, logged so by the trainer
        per_block = {"parallel/paths_per_block": width, "parallel/openings_alike": 0.5 if width else 0.0}
        return {"step": step, "parallel/ratio": 0.5 if width else 0.0, **per_block, "rewards/accuracy/mean": accuracy}

    narrows = [3.0, 3.0, 2.9, 2.5, 2.2, 2.1]
    runs = {
        "narrows": [entry(5 * (i + 1), w, 0.1 * i) for i, w in enumerate(narrows)] + [entry(35, 0.0, 0.4)],
        "once": [entry(5, 2.5, 0.0)],
        "idle": [entry(5, 0.0, 0.0)],
    }
    states = {}
    for label, history in runs.items():
        states[label] = tmp_path / f"{label}.json"
        states[label].write_text(json.dumps({"log_history": history}))
    table = width_table(states).splitlines()
    # the blockless step 35 counts for the accuracy, not for the width (nor the alike openings)
    assert table[2].startswith("| narrows | 2.97 -> 2.27 | 50.00 -> 50.00 | 0.10 -> 0.43 |")
    assert table[3].startswith("| once | 2.50 -> 2.50 |") and table[4] == "| idle | - | - | 0.00 -> 0.00 |"
    curve = curve_table(states, every=10).splitlines()
    assert curve[0] == "| step | narrows | once | idle |"
    assert curve[2:] == [
        "| 5 | 3.00 | 2.50 | - |",
        "| 10 | 3.00 | - | - |",
        "| 20 | 2.50 | - | - |",
        "| 30 | 2.10 | - | - |",
    ]
    assert plot_width(states, tmp_path / "width.png").exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_shortened_width_demo_trains_the_choice_and_writes_its_table(quick_demos):
    """`scripts/demo.py --width --quick`: the varied cold start, SFT with min_paths 2 and max_paths 4, the three RL
    runs; the table has a row per run, the model records its widths. A run's width cell holds numbers within the
    widths when the run opened blocks at a logged step, else "-" (four SFT steps may leave a model that opens none);
    its accuracy cell always holds numbers."""
    from parallel_r1.testing.demo.width import WIDTH_RUNS

    out, _ = quick_demo(quick_demos, "width")
    recorded = json.loads((out / "sft-width" / "config.json").read_text())["parallel_r1"]
    assert (recorded["min_paths"], recorded["max_paths"]) == (2, 4)
    table = (out / "width" / "table.md").read_text().split("\n\n")[0].splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == list(WIDTH_RUNS)
    for line, (folder, _, _) in zip(table[2:], WIDTH_RUNS.values()):
        history = json.loads((out / folder / "trainer_state.json").read_text())["log_history"]
        opened = any(entry.get("parallel/ratio", 0) > 0 for entry in history)
        width, accuracy = line.split("|")[2].strip(), line.split("|")[4]
        if opened:
            start, end = (float(v) for v in width.split("->"))
            assert 2 <= start <= 4 and 2 <= end <= 4
        else:
            assert width == "-"
        assert all(-1 <= float(v) <= 1 for v in accuracy.split("->"))
    assert (out / "width" / "paths_per_block.png").exists()


# --------------------------------------------------------------------------- vote drills (make demo-vote)


@given(problems, st.integers(0, 10**6))
def test_a_vote_drill_is_a_well_formed_block_whose_summary_states_its_majority(problem, seed):
    import random

    trace = task.vote_drill(problem, random.Random(seed))
    parsed = parse(trace)
    assert parsed.well_formed and len(parsed.blocks) == 1 and trace.startswith("<Parallel>")
    (block,) = parsed.blocks
    results = [int(path.body.rsplit("=", 1)[1]) for path in block.paths]
    assert len(results) == NUM_PATHS
    assert final_answer(block.summary) == str(majority(results))
    assert Counter(results).most_common(1)[0][1] >= 2  # a drill always has a majority


def test_vote_drills_slip_one_path_two_alike_or_none_anywhere_in_the_working():
    import random

    problem = Problem(7, 8, 3, 4)
    kinds, places, sizes = Counter(), Counter(), set()
    for seed in range(3000):
        block = parse(task.vote_drill(problem, random.Random(seed))).blocks[0]
        bodies = [path.body for path in block.paths]
        right = problem.working()[0]
        slipped = [body for body in bodies if body != right]
        kinds[len(slipped)] += 1
        for body in slipped[:1]:
            lines, expected = body.split("\n"), right.split("\n")
            first_wrong = next(i for i in range(3) if lines[i] != expected[i])
            places[first_wrong] += 1
            sizes.add(int(body.rsplit("=", 1)[1]) - problem.answer)
    assert abs(kinds[1] / 3000 - 0.4) < 0.03 and abs(kinds[2] / 3000 - 0.3) < 0.03 and kinds[3] == 0
    assert all(abs(places[i] / sum(places.values()) - 1 / 3) < 0.04 for i in range(3))  # either product or the sum
    assert sizes == {*range(-10, 0), *range(1, 11)}


def test_the_vote_teacher_is_seeded_and_two_answers_in_three_are_drills():
    messages = build_prompt("7*8+3*4", "none")
    assert task.vote_teacher(messages, 11) == task.vote_teacher(messages, 11)
    answers = [task.vote_teacher(messages, seed) for seed in range(3000)]
    two_alike = sum(final_answer(a) not in (None, "68") and a.count("=68</Path>") == 1 for a in answers)
    plain = sum("<Parallel>" not in a for a in answers)
    assert abs(plain / 3000 - (1 - task.VOTE_DRILLS) * TEACHER_PLAIN) < 0.02  # the teacher's answers keep their mix
    assert abs(two_alike / 3000 - task.VOTE_DRILLS * 0.3) < 0.03  # a slipped majority is stated, not the answer


def test_a_slip_lands_on_the_line_it_names_and_nowhere_else():
    problem = Problem(7, 8, 3, 4)
    assert problem.working(2, "first") == ("7*8=58\n3*4=12\n58+12=70", 70)
    assert problem.working(-2, "second") == ("7*8=56\n3*4=10\n56+10=66", 66)
    assert problem.working(10, "sum") == ("7*8=56\n3*4=12\n56+12=78", 78)
    assert problem.working(3) == problem.working(3, "first")
    with pytest.raises(ValueError, match="a slip is at one of"):
        problem.working(1, "third")


def test_vote_changes_the_parallel_cold_start_and_sft_and_gives_the_plain_sft_as_many_steps(
    tmp_path, monkeypatch, capsys
):
    """`demo.py --vote --matched`, its commands recorded instead of run: the vote teacher keeps wrong answers, the
    SFT weighs summaries and trains no split path, the plain SFT takes as many steps, and --quick's flags come last."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo

    def commands(vote: bool, quick: bool = False) -> dict:
        ran = {}
        monkeypatch.setattr(demo.Demo, "stage", lambda self, title, name, command: ran.setdefault(name, command))
        run = demo.Demo(tmp_path, 0, quick, matched=True, vote=vote)
        run.prepare_parallel()
        run.plain_sft_control()
        return ran

    def value(command: list, flag: str) -> str:
        return command[len(command) - 1 - command[::-1].index(flag) + 1]  # the last one given wins

    vote, plain = commands(vote=True), commands(vote=False)
    assert value(vote["cold_start"], "--model_name_or_path").endswith("task:vote_teacher")
    assert value(vote["cold_start"], "--require_correct") == "false"
    assert "--require_correct" not in plain["cold_start"]
    assert value(vote["sft"], "--summary_loss_weight") == "10"
    assert value(vote["sft"], "--disagreeing_paths_in_loss") == "false"
    assert value(vote["sft"], "--max_steps") == value(vote["sft-plain"], "--max_steps") == str(demo.VOTE_SFT_STEPS)
    assert "--max_steps" not in plain["sft"] and "--max_steps" not in plain["sft-plain"]  # the recipe's
    assert value(commands(vote=True, quick=True)["sft"], "--max_steps") == "4"
    monkeypatch.setattr(demo.Demo, "paper", lambda self: pytest.fail("--vote --paper ran"))
    with pytest.raises(SystemExit):
        demo.main(["--vote", "--paper", "--output_dir", str(tmp_path / "refused")])
    assert "--vote changes the parallel SFT" in capsys.readouterr().err


def test_base_from_copies_the_data_and_the_base_and_makes_neither(tmp_path, monkeypatch, capsys):
    """`demo.py --base_from DIR`, its commands recorded instead of run: data/ and base-special/ come from DIR, no
    stage makes them, and a folder without them is refused at start."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo

    earlier = tmp_path / "earlier"
    for part, name in (("data", "test.jsonl"), ("base-special", "config.json")):
        (earlier / part).mkdir(parents=True)
        (earlier / part / name).write_text(f"{part} of the earlier run")
    ran = []
    monkeypatch.setattr(demo.Demo, "stage", lambda self, title, name, command: ran.append(name))
    demo.Demo(tmp_path / "new", 0, True, base_from=earlier).prepare_base()
    assert ran == []
    for part, name in (("data", "test.jsonl"), ("base-special", "config.json")):
        assert (tmp_path / "new" / part / name).read_text() == f"{part} of the earlier run"
    demo.Demo(tmp_path / "own", 0, True).prepare_base()
    assert ran == ["data", "base", "tags"]
    monkeypatch.setattr(demo.Demo, "strong", lambda self: pytest.fail("ran without a base"))
    with pytest.raises(SystemExit):
        demo.main(["--strong", "--base_from", str(tmp_path / "own"), "--output_dir", str(tmp_path / "refused")])
    assert "no data/ and base-special/ there" in capsys.readouterr().err
    for variant in VARIANTS:  # the copied data has its own variant, whichever is asked
        with pytest.raises(SystemExit):
            demo.main(["--strong", "--base_from", str(earlier), "--variant", variant, "--output_dir", str(tmp_path)])
        assert "--base_from takes the data of that run" in capsys.readouterr().err


def test_the_variant_is_the_data_stages_and_the_default_is_the_demos_task(tmp_path, monkeypatch):
    """`demo.py --variant two-digit`, its commands recorded instead of run: the data stage writes that variant's
    problems; every other stage is as without it. The data stage's arguments, given to the task's command line (the
    untrained base left out), write problems whose first factor has two digits."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo

    def commands(**variant) -> dict:
        ran = {}
        monkeypatch.setattr(demo.Demo, "stage", lambda self, title, name, command: ran.setdefault(name, command))
        demo.Demo(tmp_path, 0, True, **variant).prepare()
        return ran

    hard, default = commands(variant="two-digit"), commands()
    assert hard["data"][hard["data"].index("--variant") + 1] == "two-digit"
    assert default["data"][default["data"].index("--variant") + 1] == "one-digit"
    assert {name: command for name, command in hard.items() if name != "data"} == {
        name: command for name, command in default.items() if name != "data"
    }
    module = hard["data"].index("parallel_r1.testing.demo.task")
    monkeypatch.setattr(task, "write_untrained_base", lambda folder, seed: Path(folder))
    task.main(hard["data"][module + 1 :])
    assert all(
        Problem.parse(json.loads(line)["question"]).a >= 10 for line in (tmp_path / "data" / "test.jsonl").open()
    )


def test_strong_start_blocks_gives_arm_c_an_sft_as_long_on_the_same_solutions_in_blocks(tmp_path, monkeypatch, capsys):
    """`demo.py --strong --strong_start blocks`, its commands and what it tabulates recorded instead of run: arm (c)'s
    parallel SFT continues from an SFT on the plain teacher's solutions written as blocks, as long as arm (a)'s
    first plain SFT, and evaluated as a parallel model beside the other stages; arm (a), and the parallel SFT but for
    where it starts, are as without it. The flag without --strong is refused."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo

    def run(start: str | None) -> tuple[dict, dict]:
        ran, tables = {}, {}

        def record(name: str, value) -> str:  # a table's inputs kept, an empty table given back
            tables[name] = value
            return ""

        monkeypatch.setattr(demo.Demo, "stage", lambda self, title, name, command: ran.setdefault(name, command))
        monkeypatch.setattr(demo.strong, "write", lambda plain, parallel, out: out.mkdir(parents=True))
        monkeypatch.setattr(demo.strong, "stages_table", lambda folders: record("stages", list(folders)))
        monkeypatch.setattr(demo, "vote_report", lambda folders: record("votes", dict(folders)))
        monkeypatch.setattr(demo, "token_table", lambda runs: "")
        monkeypatch.setattr(demo.Demo, "summary", lambda self, table, models, timings: record("models", models))
        demo.Demo(tmp_path / str(start), 0, False, strong_start=start).strong()
        return ran, tables

    def value(command: list, flag: str) -> str:
        return command[command.index(flag) + 1]

    (blocks, blocks_tables), (plain, plain_tables) = run("blocks"), run(None)
    out = tmp_path / "blocks"
    assert value(blocks["cold_start_blocks"], "--model_name_or_path").endswith("task:block_teacher")
    assert value(blocks["sft-blocks"], "--model_name_or_path") == str(out / "base-special")
    assert value(blocks["sft-blocks"], "--dataset_name") == str(out / "cold-start-blocks" / "train.parquet")
    assert value(blocks["sft-blocks"], "--max_steps") == value(blocks["sft-plain"], "--max_steps")
    assert value(blocks["sft-parallel"], "--model_name_or_path") == str(out / "sft-blocks")
    assert value(plain["sft-parallel"], "--model_name_or_path") == str(tmp_path / "None" / "sft-plain")
    assert blocks.keys() - plain.keys() == {"cold_start_blocks", "sft-blocks", "eval-sft-blocks"}
    assert plain.keys() <= blocks.keys()
    relative = lambda command, root: [  # noqa: E731
        part.replace(str(root), "").replace("/sft-blocks", "/sft-plain") for part in command
    ]
    for name in plain:  # arm (a), the parallel SFT but for its start, RL and every evaluation alike
        assert relative(blocks[name], out) == relative(plain[name], tmp_path / "None"), name
    assert value(blocks["eval-sft-blocks"], "--model_name_or_path") == str(out / "sft-blocks")
    assert "--rollout_mode" not in blocks["eval-sft-blocks"]  # read as a parallel model, paths and all
    stages = ["plain SFT", "plain SFT, continued", "(a) plain", "parallel SFT", "(c) Parallel-R1"]
    assert plain_tables["stages"] == stages and blocks_tables["stages"] == [*stages[:3], "block SFT", *stages[3:]]
    assert list(plain_tables["votes"]) == ["parallel SFT", "(c) Parallel-R1"]
    assert blocks_tables["votes"] == {
        "block SFT": str(out / "eval" / "sft-blocks"), "parallel SFT": str(out / "eval" / "sft-parallel"),
        "(c) Parallel-R1": str(out / "eval" / "parallel-r1"),
    }  # fmt: skip
    arm_a = ["sft-plain", "sft-plain-more", "grpo-strong-plain"]
    assert blocks_tables["models"] == [*arm_a, "sft-blocks", "sft-parallel", "grpo"]
    assert plain_tables["models"] == [*arm_a, "sft-parallel", "grpo"]
    monkeypatch.setattr(demo.Demo, "run", lambda self: pytest.fail("ran make demo with --strong_start"))
    with pytest.raises(SystemExit):
        demo.main(["--strong_start", "plain", "--output_dir", str(tmp_path / "refused")])
    assert "give --strong too" in capsys.readouterr().err
