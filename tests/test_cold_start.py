"""Cold-start data: the filters and the normalisation on the 341 real traces, the resumable run with the tiny teacher
(transformers in-process, a SIGKILLed script, an offline vLLM and a real OpenAI-compatible server), and SFT on the
result."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_r1.cold_start import (
    ColdStartConfig,
    clean_answer,
    generate_cold_start,
    judge,
    normalize_trace,
    pipeline,
    select,
)
from parallel_r1.cold_start.report import build_report
from parallel_r1.data import DATA_DIR, build_prompt
from parallel_r1.durable import read_lines
from parallel_r1.tags.language import parse, stats, strip_tags
from parallel_r1.testing.tiny import save_tiny_teacher, teacher_trace
from parallel_r1.testing.vllm_server import free_port, vllm_server

ROOT = Path(__file__).resolve().parents[1]
# sha256 of json.dumps([extra_info.answer of each row]) of the official SFT parquet the 341 traces come from
# (zhengkid/Parallel-R1 @ 7c3a8f33: verl/data_preprocess_scripts/data/gsm8k/adaptive_parallel_thinking_v2/sft/
# train.parquet): the text its SFT trains on, the teacher's `output` with the tag whitespace normalised and the
# Final Answer line spelled as the reference.
OFFICIAL_TRAINING_TEXT_SHA256 = "d574d7a5ca9905a775ae61a2bdc27794beb614fb0be3d4663407222d4f4be108"
MALFORMED = {"127": "text_between_paths", "178": "missing_summary", "475": "unclosed_summary"}


def real_traces() -> list[dict]:
    """The shipped traces as samples.jsonl records (one answer per problem)."""
    with open(DATA_DIR / "parallel_gsm8k_sample.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [
        {"question_id": str(r["index"]), "sample": 0, "problem": r["question"], "reference": r["answer"],
         "text": r["response"], "finish": "stop", "tokens": None}
        for r in rows
    ]  # fmt: skip


def config(tmp_path=None, **overrides) -> ColdStartConfig:
    values = {"output_dir": str(tmp_path or "unused"), "model_name_or_path": "teacher", "dataset_name": "gsm8k"}
    values.update(overrides)
    return ColdStartConfig(**values)


# --------------------------------------------------------------------------- filters on the real traces


def test_the_real_traces_normalise_to_the_official_training_text():
    verdicts = [judge(r, config()) for r in real_traces()]
    digest = hashlib.sha256(json.dumps([v.trace for v in verdicts]).encode()).hexdigest()
    assert digest == OFFICIAL_TRAINING_TEXT_SHA256
    first = verdicts[0].trace
    assert "<Parallel><Path>" in first and "</Path><Path>" in first and "</Path></Parallel>\n<Summary>" in first


def test_the_paper_filters_on_the_real_traces_keep_338_and_say_why_3_go():
    verdicts = [judge(r, config()) for r in real_traces()]
    assert Counter(v.reason for v in verdicts) == {None: 338, "malformed": 3}
    assert {v.question_id: v.detail for v in verdicts if v.reason} == MALFORMED
    assert all(v.checks["correct"] and v.checks["final_answer"] for v in verdicts)  # the pilot's answers are right
    assert sum(not v.checks["has_block"] for v in verdicts) == 3  # kept: the paper does not ask for a block
    blockless = config(require_block=True)
    assert Counter(judge(r, blockless).reason for r in real_traces())["no_block"] == 3
    lenient = config(require_well_formed=False)
    assert all(judge(r, lenient).reason is None for r in real_traces())
    report = build_report(verdicts, config(), num_problems=341)
    assert report["kept"] == 338 and report["rejected"]["malformed"] == 3 and sum(report["rejected"].values()) == 3
    assert report["problem_rates"]["valid_format"] == pytest.approx(338 / 341)  # the paper's figure: 83.7%
    assert report["correctness"] == {"paper_filter_passes": 338, "of_which_wrong": 0, "wrong_share": 0.0}
    assert report["shape"]["blocks_per_trace"][0] == 3 and report["length"]["unit"] == "characters"


def test_the_token_budget_counts_the_student_tokens_of_prompt_and_trace(tiny_tokenizer):
    records = real_traces()
    lengths = {}
    for record in records:
        verdict = judge(record, config(student_tokenizer="tiny", max_length=10**6), tiny_tokenizer)
        lengths[record["question_id"]] = verdict.checks["num_tokens"]
    budget = sorted(lengths.values())[len(lengths) // 2]  # the median: about half are too long
    verdicts = [judge(r, config(student_tokenizer="tiny", max_length=budget), tiny_tokenizer) for r in records]
    too_long = {v.question_id for v in verdicts if v.reason == "too_long"}
    expected = {q for q, n in lengths.items() if n > budget and q not in MALFORMED}
    assert too_long == expected and 100 < len(too_long) < 241
    row = records[0]
    chat = [*build_prompt(row["problem"]), {"role": "assistant", "content": verdicts[0].trace}]
    assert lengths[row["question_id"]] == len(
        tiny_tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)
    )


def test_a_wrong_answer_is_rejected_by_default_and_kept_unrewritten_without_the_check():
    record = {**real_traces()[0], "reference": "20"}  # its trace says 19
    assert judge(record, config()).reason == "wrong_answer"
    verdict = judge(record, config(require_correct=False))
    assert verdict.reason is None and verdict.trace.endswith("Final Answer: 19")


def test_a_correct_final_answer_is_spelled_as_the_reference():
    text = "So it costs $18.\n<Parallel><Path>a</Path><Path>b</Path></Parallel>\n<Summary>c</Summary>\nFinal Answer: $18.00"
    record = {"question_id": "q", "sample": 0, "problem": "p", "reference": "18", "text": text, "finish": "stop"}
    assert judge(record, config()).trace.endswith("\nFinal Answer: 18")
    assert judge(record, config(rewrite_final_answer=False)).trace.endswith("Final Answer: $18.00")
    bold = {**record, "text": text.replace("Final Answer:", "  **Final Answer:**")}  # read as the scorer reads it
    assert judge(bold, config()).trace.endswith("\nFinal Answer: 18") and judge(bold, config()).reason is None


def test_reasoning_truncation_and_blank_answers():
    trace = real_traces()[0]["text"]
    record = {**real_traces()[0], "text": f"<think>\nLet me think. </Path> oops\n</think>\n\n{trace}\n"}
    assert judge(record, config()).reason is None
    assert judge(record, config(drop_reasoning=False)).reason == "malformed"
    assert clean_answer("no thinking here ") == "no thinking here"
    assert judge({**record, "finish": "length"}, config()).reason == "truncated"
    assert judge({**record, "finish": "length"}, config(require_finished=False)).reason is None
    assert judge({**record, "text": ""}, config()).reason == "no_final_answer"


def test_duplicates_and_the_cap_per_problem():
    base = real_traces()[0]
    trace = base["text"]
    near = trace.replace("The total number of pets is 19.", "So the total number of pets is 19.")
    other = real_traces()[1]["text"].replace(real_traces()[1]["reference"], base["reference"])
    texts = [trace, trace.replace("\n", "\n\n", 1), near, other, trace + " "]
    records = [{**base, "sample": s, "text": t} for s, t in enumerate(texts)]

    def reasons(**overrides):
        return [v.reason for v in select([judge(r, config(**overrides)) for r in records], config(**overrides))]

    assert reasons() == [None, "exact_duplicate", "near_duplicate", None, "exact_duplicate"]
    assert reasons(near_duplicate_threshold=None) == [None, "exact_duplicate", None, None, "exact_duplicate"]
    assert reasons(drop_exact_duplicates=False, near_duplicate_threshold=None) == [None] * 5
    assert reasons(max_traces_per_question=1) == [
        None,
        "exact_duplicate",
        "near_duplicate",
        "over_cap",
        "exact_duplicate",
    ]


_PIECE = st.sampled_from(["a", "b c", " ", "\n", "\n\n", "<Parallel>", "</Parallel>", "<Path>", "</Path>",
                          "<Summary>", "</Summary>", "x\n"])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECE, max_size=25))
def test_normalising_is_idempotent_and_moves_only_whitespace_between_block_tags(pieces):
    text = "".join(pieces)
    normal = normalize_trace(text)
    assert normalize_trace(normal) == normal
    assert "".join(strip_tags(normal).split()) == "".join(strip_tags(text).split())
    before, after = stats(parse(text)), stats(parse(normal))
    assert (before.well_formed, before.num_blocks, before.paths_per_block) == (
        after.well_formed, after.num_blocks, after.paths_per_block)  # fmt: skip


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(backend="tgi"), "backend"),
        (dict(num_samples=0), "num_samples"),
        (dict(max_length=4096), "student_tokenizer"),
        (dict(near_duplicate_threshold=1.5), "near_duplicate_threshold"),
        (dict(push_to_hub=True), "hub_dataset_id"),
        (dict(prompt_template="fancy"), "template"),
        (dict(top_p=0.0), "top_p"),
        (dict(max_traces_per_question=0), "max_traces_per_question"),
    ],
)
def test_bad_settings_fail_at_once(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(**overrides)


def test_run_json_keeps_the_split_under_the_name_earlier_runs_wrote():
    """A folder started before the cold start took `DataArguments` resumes: its run.json says dataset_split."""
    recorded = config(dataset_train_split="validation", max_train_samples=3).generation_settings()
    assert recorded["dataset_split"] == "validation" and "dataset_train_split" not in recorded
    assert "max_train_samples" not in recorded  # raising it extends a run in place


# --------------------------------------------------------------------------- runs with the tiny teacher


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory):
    """The tiny stand-in teacher: it knows the traces of the first 3 GSM8K train problems."""
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher") / "model")


def tiny_run(teacher_dir, out, **overrides) -> ColdStartConfig:
    values = dict(output_dir=str(out), model_name_or_path=str(teacher_dir), dtype="float32", dataset_name="gsm8k",
                  max_train_samples=5, num_samples=3, max_new_tokens=80, student_tokenizer=str(teacher_dir),
                  max_length=1024)  # fmt: skip
    return ColdStartConfig(**{**values, **overrides})


def rows_of(folder: Path) -> list[dict]:
    from datasets import load_dataset

    return load_dataset("parquet", data_files=str(folder / "train.parquet"), split="train").to_list()


def samples_of(folder: Path) -> dict:
    records = read_lines(folder / "samples.jsonl")
    keys = [(r["question_id"], r["sample"]) for r in records]
    assert len(keys) == len(set(keys)), "an answer was written twice"
    return dict(zip(keys, records))


def test_a_run_keeps_the_known_traces_and_reports_every_answer(teacher_dir, tmp_path):
    """At temperature 0.5: at 1 the tiny teacher writes its taught trace only about 60% of the time, so a taught
    problem could lose all three samples, and a slip that keeps the right answer could pass the filters."""
    out = tmp_path / "run"
    report = generate_cold_start(tiny_run(teacher_dir, out, temperature=0.5))
    samples, rows = samples_of(out), rows_of(out)
    assert set(samples) == {(str(q), s) for q in range(5) for s in range(3)}
    assert {r["id"] for r in rows} >= {"0", "1", "2"}  # the problems it was taught
    for row in rows:
        trace = row["completion"][0]["content"]
        assert parse(trace).well_formed and trace.endswith(f"Final Answer: {row['answer']}")
        assert trace == normalize_trace(teacher_trace(row["answer"]))  # what it was taught, tags spaced as official
        assert row["blocks"] == 1 and row["paths_per_block"] == [2] and row["num_tokens"] < 1024
    assert report["kept"] == len(rows) and report["answers"] == 15
    assert report["kept"] + sum(report["rejected"].values()) == 15
    assert report["rejected"]["wrong_answer"] >= 1  # on problems 3 and 4 it writes a trace it knows: wrong
    rejected = read_lines(out / "rejected.jsonl")
    assert len(rejected) == 15 - len(rows) and all(r["reason"] for r in rejected)
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report))
    assert "83.7%" in (out / "report.md").read_text() and (out / "report.png").stat().st_size > 10_000


def test_a_restart_asks_nothing_new_and_other_settings_are_refused(teacher_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises((OSError, ValueError)):  # a mistyped teacher fails before any answer...
        generate_cold_start(tiny_run(tmp_path / "not-a-model", out, max_train_samples=2, num_samples=2))
    # ...and does not lock the folder
    generate_cold_start(tiny_run(teacher_dir, out, max_train_samples=2, num_samples=2))
    before = (out / "samples.jsonl").read_bytes()

    def no_teacher(config):
        raise AssertionError("the teacher was asked again")

    monkeypatch.setattr(pipeline, "make_teacher", no_teacher)
    report = generate_cold_start(
        tiny_run(teacher_dir, out, max_train_samples=2, num_samples=2, max_traces_per_question=1)
    )
    assert (out / "samples.jsonl").read_bytes() == before and report["kept"] <= 2  # filters changed freely
    with pytest.raises(ValueError, match=r"other settings \(temperature\)"):
        generate_cold_start(tiny_run(teacher_dir, out, max_train_samples=2, num_samples=2, temperature=0.7))


@pytest.mark.slow  # measured: 10-27 s with its setup (make test-quick leaves it out)
def test_a_run_killed_mid_way_restarts_to_the_rows_of_an_uninterrupted_one(teacher_dir, tmp_path):
    same = dict(max_train_samples=24, num_samples=2, max_new_tokens=64)
    reference = tmp_path / "whole"
    generate_cold_start(tiny_run(teacher_dir, reference, **same))

    killed = tmp_path / "killed"
    command = [sys.executable, "scripts/generate_cold_start.py", "--config", "recipes/tiny/cold_start.yaml",
               "--model_name_or_path", str(teacher_dir), "--student_tokenizer", str(teacher_dir),
               "--output_dir", str(killed), "--max_train_samples", "24", "--num_samples", "2",
               "--max_new_tokens", "64", "--max_length", "1024"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    samples = killed / "samples.jsonl"
    deadline = time.time() + 300
    while not (samples.exists() and samples.read_bytes().count(b"\n") >= 6):
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.time() < deadline, "the script wrote nothing in 300 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = samples.read_bytes().count(b"\n")
    assert 6 <= written < 48, f"the kill did not land mid-way ({written} of 48 answers written)"
    with samples.open("ab") as f:  # a kill can also cut a line in the middle
        f.write(b'{"question_id": "23", "sample": 1, "problem": "Wh')

    generate_cold_start(tiny_run(teacher_dir, killed, **same))
    assert samples_of(killed) == samples_of(reference)
    assert rows_of(killed) == rows_of(reference)

    lines = samples.read_bytes().split(b"\n")  # a kill between the two answers of a problem: 7 lines kept
    samples.write_bytes(b"\n".join(lines[:7]) + b"\n")
    generate_cold_start(tiny_run(teacher_dir, killed, **same))
    assert samples_of(killed) == samples_of(reference)


@pytest.mark.slow  # measured: 10-27 s with its setup (make test-quick leaves it out)
def test_the_generated_set_trains_a_step_in_the_sft_script(teacher_dir, tmp_path):
    out = tmp_path / "run"
    generate_cold_start(tiny_run(teacher_dir, out))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu.yaml",
               "--num_cpu_threads_per_process", "1", "scripts/sft.py", "--config", "recipes/tiny/sft.yaml",
               "--model_name_or_path", str(teacher_dir), "--dataset_name", str(out / "train.parquet"),
               "--output_dir", str(tmp_path / "sft"), "--max_steps", "1", "--max_length", "640",
               "--save_strategy", "steps", "--save_steps", "1"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"kept {len(rows_of(out))} traces, dropped 0" in result.stderr
    state = json.loads((tmp_path / "sft" / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["global_step"] == 1


def test_a_server_that_is_not_there_fails_the_run_at_its_first_request(teacher_dir, tmp_path):
    port = free_port()  # nothing listens there
    run = tiny_run(teacher_dir, tmp_path / "run", backend="openai", base_url=f"http://127.0.0.1:{port}/v1",
                   max_train_samples=2, num_samples=1, max_retries=1, request_timeout=5)  # fmt: skip
    with pytest.raises(RuntimeError, match="did not answer a first request"):
        generate_cold_start(run)
    assert read_lines(tmp_path / "run" / "samples.jsonl") == []


# --------------------------------------------------------------------------- vLLM: offline, and a real server


def greedy(teacher_dir, out, **overrides) -> dict:
    generate_cold_start(tiny_run(teacher_dir, out, temperature=0.0, max_train_samples=4, num_samples=2, **overrides))
    return {key: r["text"] for key, r in samples_of(out).items()}


@pytest.mark.vllm
def test_offline_vllm_answers_as_transformers_does(teacher_dir, tmp_path):
    ours = greedy(teacher_dir, tmp_path / "hf")
    theirs = greedy(teacher_dir, tmp_path / "vllm", backend="vllm", vllm_max_model_length=1024,
                    vllm_enforce_eager=True, chunk_size=3)  # fmt: skip
    assert theirs == ours
    assert rows_of(tmp_path / "vllm") == rows_of(tmp_path / "hf")


@pytest.mark.slow  # measured: 10-27 s with its setup (make test-quick leaves it out)
@pytest.mark.vllm
def test_an_openai_compatible_server_answers_as_transformers_does(teacher_dir, tmp_path):
    with vllm_server(teacher_dir, "--served-model-name", "tiny-teacher", "--max-model-len", "1024") as url:
        theirs = greedy(teacher_dir, tmp_path / "server", backend="openai", served_model_name="tiny-teacher",
                        base_url=f"{url}/v1", concurrency=4)  # fmt: skip
    assert theirs == greedy(teacher_dir, tmp_path / "hf")
    assert rows_of(tmp_path / "server") == rows_of(tmp_path / "hf")
    assert [r["reason"] for r in read_lines(tmp_path / "server" / "rejected.jsonl")].count("exact_duplicate") >= 3


def test_push_to_hub_uses_datasets_own_push_and_sends_the_report(teacher_dir, tmp_path, monkeypatch):
    """No Hub here: the two client calls are recorded instead of sent."""
    from datasets import Dataset
    from huggingface_hub import HfApi

    calls = []
    monkeypatch.setattr(
        Dataset, "push_to_hub", lambda self, repo, **kw: calls.append(("dataset", repo, len(self), kw))
    )
    monkeypatch.setattr(
        HfApi, "upload_file", lambda self, **kw: calls.append(("file", kw["path_in_repo"], kw["repo_id"]))
    )
    run = tiny_run(
        teacher_dir,
        tmp_path / "run",
        max_train_samples=3,
        push_to_hub=True,
        hub_dataset_id="me/cold",
        hub_private=True,
    )
    generate_cold_start(run)
    assert calls[0] == ("dataset", "me/cold", len(rows_of(tmp_path / "run")), {"private": True})
    assert {c[1] for c in calls[1:]} == {"cold_start/report.md", "cold_start/report.json", "cold_start/report.png"}


def test_answers_cut_by_the_token_budget_are_truncated(teacher_dir, tmp_path):
    report = generate_cold_start(tiny_run(teacher_dir, tmp_path / "run", max_train_samples=2, max_new_tokens=8,
                                          require_finished=False, require_well_formed=False,
                                          require_final_answer=False, require_correct=False))  # fmt: skip
    assert {r["finish"] for r in read_lines(tmp_path / "run" / "samples.jsonl")} == {"length"}
    assert report["answer_rates"]["finished"] == 0.0
    with pytest.raises(ValueError, match="no answer passed the filters"):
        generate_cold_start(tiny_run(teacher_dir, tmp_path / "run", max_train_samples=2, max_new_tokens=8))
    assert not (tmp_path / "run" / "train.parquet").exists()  # the earlier set is not left to contradict the report
    assert read_lines(tmp_path / "run" / "rejected.jsonl")[0]["reason"] == "truncated"


class FlakyServer(http.server.ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint that refuses its first call (503), stalls its second past the client's
    timeout, then answers every call with the trace of problem 0 (answer 72)."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FlakyHandler)
        self.calls = 0


class FlakyHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.calls += 1
        if self.server.calls == 1:
            self.send_response(503)
            self.end_headers()
            return
        if self.server.calls == 2:
            time.sleep(2)
        body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": teacher_trace("72")}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 40, "total_tokens": 41}}  # fmt: skip
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_refused_and_stalled_requests_are_retried(teacher_dir, tmp_path):
    server = FlakyServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = tiny_run(teacher_dir, tmp_path / "run", backend="openai", max_train_samples=2, num_samples=1,
                       base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", concurrency=1,
                       request_timeout=1, max_retries=2)  # fmt: skip
        report = generate_cold_start(run)
    finally:
        server.shutdown()
    assert server.calls == 4  # 503, then a retry that stalls past the timeout, a retry, then the second request
    assert len(read_lines(tmp_path / "run" / "samples.jsonl")) == 2
    assert (
        report["kept"] == 1 and report["rejected"]["wrong_answer"] == 1
    )  # problem 0's answer is 72, problem 1's is not
