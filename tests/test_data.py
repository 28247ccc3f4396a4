"""The data module: prompt templates, problem loaders, cold-start trace loader (all offline)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from datasets import Dataset
from hypothesis import assume, given
from hypothesis import strategies as st
from trl.data_utils import apply_chat_template, is_conversational

from parallel_r1.answers import final_answer
from parallel_r1.data import (
    DATA_DIR,
    FINAL_ANSWER,
    DataArguments,
    SFTDataArguments,
    build_prompt,
    load_problems,
    load_sft_traces,
    problem_text,
    to_problems,
    to_sft_traces,
    trace_problem,
)
from parallel_r1.data.loaders import DAPO_PREFIX, DAPO_SUFFIX
from parallel_r1.tags.language import TAGS, parse, strip_tags

# Rows as the Hub serves them (see the loaders' layout tables for the sources).
DAPO_CHAT = "{prefix}\n\n{problem}\n\n{suffix}"


def dapo_row(problem: str, answer: str, index: str) -> dict:
    """A row of BytedTsinghua-SIA/DAPO-Math-17k: chat prompt with DAPO's wrapper, answer in reward_model."""
    content = DAPO_CHAT.format(prefix=DAPO_PREFIX, problem=problem, suffix=DAPO_SUFFIX)
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": content, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index},
    }


def read_jsonl(name: str) -> list[dict]:
    with open(DATA_DIR / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def user_text(row: dict) -> str:
    (turn,) = row["prompt"]
    assert turn["role"] == "user"
    return turn["content"]


# --------------------------------------------------------------------------- templates


def test_parallel_prompt_is_one_user_turn_with_every_tag_and_the_final_answer_line():
    prompt = build_prompt("What is 2 + 3?")
    assert len(prompt) == 1 and prompt[0]["role"] == "user"
    content = prompt[0]["content"]
    assert all(tag in content for tag in TAGS)
    assert FINAL_ANSWER in content
    assert content.endswith("What is 2 + 3?")


def test_plain_prompt_has_no_tags_but_asks_for_the_same_final_answer_line():
    content = build_prompt("What is 2 + 3?", "plain")[0]["content"]
    assert strip_tags(content) == content
    assert FINAL_ANSWER in content and content.endswith("What is 2 + 3?")


def test_unknown_template_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="parallel.*plain"):
        build_prompt("1 + 1?", "sequential")


@pytest.mark.parametrize("problem", ["", "   \n", None])
def test_an_empty_problem_is_refused(problem):
    with pytest.raises(ValueError, match="non-empty"):
        build_prompt(problem)


def test_package_import_stays_light():
    code = (
        "import sys, parallel_r1.data; assert not {'datasets', 'trl'} & set(sys.modules), 'datasets or trl imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_data_arguments_choose_the_source_columns_and_the_rows_kept(tmp_path):
    rows = [{"q": f"What is {i} + 1?", "a": str(i + 1)} for i in range(5)]
    data = DataArguments(
        dataset_name=write_jsonl(tmp_path / "p.jsonl", rows),
        question_column="q",
        answer_column="a",
        max_train_samples=2,
    )
    assert (data.row_limit("train"), data.row_limit("test")) == (2, None)
    problems = load_problems(data)  # the training split, max_train_samples rows
    assert list(problems["answer"]) == ["1", "2"] and "What is 1 + 1?" in problems["prompt"][1][0]["content"]
    for bad, message in [
        ({}, "dataset_name is required"),
        ({"dataset_name": "gsm8k", "dataset_streaming": True}, "dataset_streaming is not supported"),
        ({"dataset_name": "gsm8k", "max_train_samples": 0}, "max_train_samples must be at least 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            DataArguments(**bad)


# --------------------------------------------------------------------------- shipped problem sets


@pytest.mark.parametrize(
    "name, split, file, rows, question",
    [
        ("gsm8k", "train", "gsm8k_train.jsonl", 7473, "question"),
        ("gsm8k", "test", "gsm8k_test.jsonl", 1319, "question"),
        ("math500", "test", "math500.jsonl", 500, "problem"),
        ("aime24", "test", "aime24.jsonl", 30, "problem"),
        ("aime25", "test", "aime25.jsonl", 30, "problem"),
        ("amc23", "test", "amc23.jsonl", 40, "problem"),
    ],
)
def test_shipped_sets_load_every_row_with_their_problem_and_answer(name, split, file, rows, question):
    data = load_problems(DataArguments(dataset_name=name), split)
    raw = read_jsonl(file)
    assert data.column_names == ["prompt", "answer", "id"]
    assert len(data) == len(raw) == rows
    for position in (0, rows // 2, rows - 1):
        row = data[position]
        assert user_text(row) == build_prompt(raw[position][question])[0]["content"]
        assert row["answer"] == str(raw[position]["answer"]).strip()
        assert row["id"] == str(raw[position].get("id", raw[position].get("unique_id", position)))


def test_ids_come_from_the_dataset_when_it_has_them():
    assert list(load_problems(DataArguments(dataset_name="aime25"), "test")["id"][:2]) == ["2025-I-1", "2025-I-2"]
    assert load_problems(DataArguments(dataset_name="aime24"), "test")["id"][0] == "60"
    assert load_problems(DataArguments(dataset_name="math500"), "test")["id"][0] == "test/precalculus/807.json"
    assert list(load_problems(DataArguments(dataset_name="gsm8k"), "test", limit=3)["id"]) == ["0", "1", "2"]


def test_gsm8k_answer_is_kept_as_the_dataset_has_it():
    answer = load_problems(DataArguments(dataset_name="gsm8k"), "train", limit=1)["answer"][0]
    assert answer.endswith("#### 72") and "<<48/2=24>>" in answer


def test_plain_template_reaches_the_loaded_prompts():
    data = load_problems(DataArguments(dataset_name="amc23"), "test", template="plain", limit=4)
    assert all(strip_tags(user_text(row)) == user_text(row) for row in data)


@pytest.mark.parametrize(
    "source, split, message",
    [
        ("math500", "train", "no split 'train'.*test"),
        ("gsm9k", "train", "unknown data source 'gsm9k'.*gsm8k"),
    ],
)
def test_bad_shipped_name_or_split_is_refused(source, split, message):
    with pytest.raises(ValueError, match=message):
        load_problems(DataArguments(dataset_name=source), split)


def test_limit_keeps_the_first_rows_and_rejects_nonsense():
    assert list(load_problems(DataArguments(dataset_name="gsm8k"), "test", limit=5)["answer"]) == [
        r["answer"] for r in read_jsonl("gsm8k_test.jsonl")[:5]
    ]
    assert len(load_problems(DataArguments(dataset_name="aime24"), "test", limit=1000)) == 30
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="limit"):
            load_problems(DataArguments(dataset_name="aime24"), "test", limit=bad)


# --------------------------------------------------------------------------- local files


def test_local_jsonl_in_the_gsm8k_layout(tmp_path):
    rows = [{"question": "Tom has 3 apples and eats one. How many are left?", "answer": "3 - 1 = 2\n#### 2"}]
    data = load_problems(DataArguments(dataset_name=write_jsonl(tmp_path / "gsm.jsonl", rows)))
    assert data.to_list() == [{"prompt": build_prompt(rows[0]["question"]), "answer": rows[0]["answer"], "id": "0"}]


def test_local_json_array(tmp_path):
    path = tmp_path / "probs.json"
    path.write_text(json.dumps([{"problem": "Find $x$ if $2x = 6$.", "answer": 3}]), encoding="utf-8")
    data = load_problems(DataArguments(dataset_name=str(path)))
    assert list(data["answer"]) == ["3"] and user_text(data[0]).endswith("Find $x$ if $2x = 6$.")


def test_local_parquet_in_the_dapo_chat_layout_is_unwrapped_and_deduplicated(tmp_path):
    problems = [("Let $n$ be the least prime above $10$. Find $n$.", "11"), ("Compute $7 \\cdot 6$.", "42")]
    raw = [dapo_row(p, a, f"uuid-{k}") for k, (p, a) in enumerate(problems)] * 3  # the raw file repeats rows
    path = tmp_path / "dapo.parquet"
    Dataset.from_list(raw).to_parquet(str(path))
    data = load_problems(DataArguments(dataset_name=str(path)))
    assert list(data["answer"]) == ["11", "42"]
    assert list(data["id"]) == ["uuid-0", "uuid-1"]
    for row, (problem, _) in zip(data, problems):
        assert user_text(row) == build_prompt(problem)[0]["content"]
        assert "Answer: $Answer" not in user_text(row) and "Remember to put" not in user_text(row)


def test_local_parquet_in_the_open_r1_processed_layout(tmp_path):
    rows = [
        {"prompt": "How many positive divisors does $36$ have?", "solution": "9", "data_source": "math_dapo"},
        {"prompt": "What is $3^4$?", "solution": "81", "data_source": "math_dapo"},
    ]
    path = tmp_path / "processed.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    data = load_problems(DataArguments(dataset_name=str(path)))
    assert list(data["answer"]) == ["9", "81"]
    assert user_text(data[1]) == build_prompt("What is $3^4$?")[0]["content"]


def test_missing_empty_or_unsupported_files_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_problems(DataArguments(dataset_name=str(tmp_path / "nowhere.jsonl")))
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.jsonl has no rows"):
        load_problems(DataArguments(dataset_name=str(tmp_path / "empty.jsonl")))
    (tmp_path / "rows.csv").write_text("question,answer\n1+1?,2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unsupported data file type '.csv'"):
        load_problems(DataArguments(dataset_name=str(tmp_path / "rows.csv")))


# --------------------------------------------------------------------------- mapping (shared with the Hub path)


def test_dapo_hub_layout_maps_through_the_same_code():
    rows = [dapo_row("Find $1+1$.", "2", "a"), dapo_row("Find $1+1$.", "2", "a"), dapo_row("Find $2+2$.", "4", "b")]
    data = to_problems(Dataset.from_list(rows))
    assert data.to_list() == [
        {"prompt": build_prompt("Find $1+1$."), "answer": "2", "id": "a"},
        {"prompt": build_prompt("Find $2+2$."), "answer": "4", "id": "b"},
    ]


def test_repeats_are_keyed_on_the_index_when_there_is_one():
    # the paper's 17,917 DAPO prompts are the distinct indices: equal texts under two indices stay
    rows = [dapo_row("Find $x$.", "2", "a"), dapo_row("Find $x$.", "2", "b"), dapo_row("Find $x$.", "2", "a")]
    assert list(to_problems(Dataset.from_list(rows))["id"]) == ["a", "b"]


def test_without_an_index_repeats_are_equal_problem_and_answer():
    rows = [{"problem": "Find $x$.", "answer": a} for a in ("2", "3", "2")]
    assert list(to_problems(Dataset.from_list(rows))["answer"]) == ["2", "3"]


def test_limit_counts_problems_after_deduplication():
    rows = [dapo_row(f"Problem {k}.", str(k), str(k)) for k in range(4)] * 5
    assert list(to_problems(Dataset.from_list(rows), limit=3)["answer"]) == ["0", "1", "2"]


def test_explicit_columns_override_and_reach_nested_fields():
    rows = [{"q": "What is $5-2$?", "meta": {"gold": 3, "source": "x"}}]
    data = to_problems(Dataset.from_list(rows), question_column="q", answer_column="meta.gold")
    assert list(data["answer"]) == ["3"] and user_text(data[0]).endswith("What is $5-2$?")


@pytest.mark.parametrize(
    "rows, options, message",
    [
        (
            [{"question": "1+1?", "label": "2"}],
            {},
            r"no answer column: expected one of answer.*columns present.*label",
        ),
        ([{"text": "1+1?", "answer": "2"}], {}, r"no question column: expected one of question, problem, prompt"),
        ([{"question": "1+1?", "solution": "2"}], {}, r"match no known layout.*question, solution"),
        ([{"question": "1+1?", "answer": "2"}], {"answer_column": "gold"}, r"answer_column 'gold' not found.*answer"),
        (
            [{"problem": "1+1?", "meta": {"gold": "2"}}],
            {"answer_column": "meta.answer"},
            r"'meta.answer' not found.*meta\.gold",
        ),
    ],
)
def test_a_missing_column_is_named_with_the_columns_present(rows, options, message):
    with pytest.raises(ValueError, match=message):
        to_problems(Dataset.from_list(rows), **options)


def test_missing_column_fails_at_load_from_a_file(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "1+1?", "gold": "2"}])
    with pytest.raises(ValueError, match="no answer column.*gold"):
        load_problems(DataArguments(dataset_name=path))


def test_an_empty_dataset_is_refused():
    empty = Dataset.from_dict({"question": [], "answer": []})
    with pytest.raises(ValueError, match="no rows"):
        to_problems(empty)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": None}], r"row 1 has an empty 'answer'"),
        ([{"question": "  ", "answer": "2"}], r"row 0 has an empty 'question'"),
        ([{"prompt": [{"role": "system", "content": "hi"}], "solution": "2"}], r"row 0.*no user turn"),
    ],
)
def test_an_empty_cell_is_named_by_row_and_column(rows, message):
    with pytest.raises(ValueError, match=message):
        to_problems(Dataset.from_list(rows))


# --------------------------------------------------------------------------- problem_text

problems = st.text(min_size=1).map(str.strip).filter(bool)


@given(problems)
def test_dapo_wrapper_is_removed_from_chat_and_text_cells(problem):
    wrapped = DAPO_CHAT.format(prefix=DAPO_PREFIX, problem=problem, suffix=DAPO_SUFFIX)
    assert problem_text(wrapped) == problem
    assert problem_text([{"role": "user", "content": wrapped}]) == problem


@given(problems)
def test_a_bare_problem_is_left_as_it_is(problem):
    assume(not problem.startswith(DAPO_PREFIX))
    assert problem_text(problem) == problem
    assert problem_text("\n" + problem + "  ") == problem


def test_parallel_r1_chat_prompt_gives_the_text_after_its_problem_marker():
    cell = [{"role": "user", "content": "Think in parallel. End with Final Answer:.\n\nProblem: Is 7 prime?"}]
    assert problem_text(cell) == "Is 7 prime?"
    assert problem_text("Intro.\n\nProblem: Is 7 prime?") == "Intro.\n\nProblem: Is 7 prime?"  # text is never cut


def test_the_last_user_turn_of_a_chat_is_the_problem():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Find $2^3$."}]
    assert problem_text(chat) == "Find $2^3$."


@pytest.mark.parametrize("cell", [42, [{"role": "assistant", "content": "x"}], [{"role": "user", "content": 3}]])
def test_an_unreadable_problem_cell_is_refused(cell):
    with pytest.raises(ValueError):
        problem_text(cell)


# --------------------------------------------------------------------------- SFT traces

SAMPLE = read_jsonl("parallel_gsm8k_sample.jsonl")


def test_sft_loader_drops_exactly_the_malformed_traces_of_the_sample(caplog):
    malformed = {str(r["index"]) for r in SAMPLE if not parse(r["response"]).well_formed}
    assert malformed == {"127", "178", "475"}  # the sample's three broken traces (see the data README)
    with caplog.at_level(logging.INFO, logger="parallel_r1.data.loaders"):
        data = load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"))
    assert len(SAMPLE) == 341 and len(data) == 338
    assert set(data["id"]) == {str(r["index"]) for r in SAMPLE} - malformed
    assert "dropped 3 (missing_summary: 1, text_between_paths: 1, unclosed_summary: 1)" in caplog.text


def test_sft_loader_keeps_well_formed_traces_without_a_block():
    no_block = {str(r["index"]) for r in SAMPLE if not parse(r["response"]).blocks}
    assert len(no_block) == 3 and no_block <= set(
        load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"))["id"]
    )


def test_sft_loader_keeps_everything_when_asked():
    assert len(load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample", only_well_formed=False))) == 341


def test_sft_rows_are_trl_prompt_completion_with_the_rl_prompt():
    data = load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"), limit=4)
    assert data.column_names == ["prompt", "completion", "answer", "id"] and len(data) == 4
    for row, raw in zip(data, SAMPLE):
        assert is_conversational(row)
        assert row["prompt"] == build_prompt(raw["question"])
        assert row["completion"] == [{"role": "assistant", "content": raw["response"]}]
        assert row["answer"] == raw["answer"]


def test_sft_rows_render_through_trl_chat_template_with_tags_as_single_tokens(tiny_tokenizer):
    row = load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"), limit=1)[0]
    rendered = apply_chat_template(row, tiny_tokenizer)
    assert rendered["prompt"].endswith("<|im_start|>assistant\n")
    assert rendered["completion"].startswith(row["completion"][0]["content"])
    ids = tiny_tokenizer.encode(rendered["completion"], add_special_tokens=False)
    tag_ids = set(tiny_tokenizer.convert_tokens_to_ids(list(TAGS)))
    assert tag_ids <= set(ids)


def test_sft_in_the_parallel_r1_verl_layout():
    question = "A farmer has 5 cows and buys 3 more. How many cows?"
    response = (
        "5 + 3 = 8.\n<Parallel><Path>5+3=8</Path><Path>3+5=8</Path></Parallel>\n<Summary>8</Summary>\nFinal Answer: 8"
    )
    row = {
        "prompt": [{"role": "user", "content": f"Their instruction.\n\nProblem: {question}"}],
        "output": response,
        "reward_model": {"ground_truth": "8", "style": "rule"},
        "index": 7,
    }
    data = to_sft_traces(Dataset.from_list([row]))
    assert data.to_list() == [
        {
            "prompt": build_prompt(question),
            "completion": [{"role": "assistant", "content": response}],
            "answer": "8",
            "id": "7",
        }
    ]


def test_sft_in_the_official_training_layout_trains_on_extra_info_answer():
    """The official SFT trains on extra_info.answer (the teacher's output with its tag whitespace normalised), not on
    `output`: a row of that layout, with or without `output`, gives that text."""
    question = "A farmer has 5 cows and buys 3 more. How many cows?"
    raw = "5 + 3 = 8.\n<Parallel>\n<Path>5+3=8</Path>\n<Path>3+5=8</Path>\n</Parallel>\n<Summary>8</Summary>\nFinal Answer: 8"
    trained = raw.replace(">\n<P", "><P").replace("</Path>\n</Parallel>", "</Path></Parallel>")
    prompt = [{"role": "user", "content": f"Their instruction.\n\nProblem: {question}"}]
    extra = {"question": prompt[0]["content"], "answer": trained, "index": 3, "split": "train"}
    row = {"prompt": prompt, "output": raw, "reward_model": {"ground_truth": "8"}, "extra_info": extra}
    for layout in (row, {k: v for k, v in row.items() if k != "output"}):
        data = to_sft_traces(Dataset.from_list([layout])).to_list()
        assert data == [{"prompt": build_prompt(question), "completion": [{"role": "assistant", "content": trained}],
                         "answer": "8", "id": "3"}]  # fmt: skip


@pytest.mark.parametrize("chat", [True, False])
def test_sft_in_a_prompt_completion_layout(chat):
    """Plain prompt/completion columns (text or chat), with or without an answer column; a prompt built by our own
    template gives back its problem, so the instruction is not wrapped twice."""
    trace = "<Parallel><Path>6*7=42</Path><Path>7*6=42</Path></Parallel>\n<Summary>42</Summary>\nFinal Answer: 42"
    prompt = build_prompt("What is 6 times 7?")
    rows = [
        {"prompt": prompt if chat else prompt[0]["content"],
         "completion": [{"role": "assistant", "content": trace}] if chat else trace}
    ]  # fmt: skip
    data = to_sft_traces(Dataset.from_list(rows)).to_list()
    assert data[0]["prompt"] == prompt and data[0]["completion"][0]["content"] == trace and data[0]["answer"] == "42"
    with_answer = to_sft_traces(Dataset.from_list([{**rows[0], "answer": "forty-two"}]))
    assert with_answer[0]["answer"] == "forty-two"


def test_sft_in_an_unknown_layout_names_the_columns():
    with pytest.raises(ValueError, match="no question column.*columns present in dataset: messages, source"):
        to_sft_traces(Dataset.from_list([{"messages": "hi", "source": "x"}]))


def test_sft_in_the_hub_cold_start_layout_takes_the_answer_from_the_final_answer_line():
    rows = [
        {"problem": "What is 6 times 7?", "text": "6 * 7 = 42.\n\nFinal Answer: 42"},
        {"problem": "What is 1 + 1?", "text": "It is 2."},
    ]
    data = to_sft_traces(Dataset.from_list(rows))
    assert list(data["answer"]) == ["42"] and list(data["id"]) == ["0"]
    assert list(to_sft_traces(Dataset.from_list(rows), only_well_formed=False)["answer"]) == ["42", ""]


def test_sft_with_no_usable_trace_is_refused_saying_why():
    rows = [{"question": "1+1?", "answer": "2", "response": "It is 2."}]
    with pytest.raises(ValueError, match=r"no usable traces.*dropped 1 \(no_final_answer: 1\)"):
        to_sft_traces(Dataset.from_list(rows))


def test_sft_missing_response_column_is_named():
    with pytest.raises(
        ValueError, match="no response column: expected one of response, extra_info.answer, output, text, completion"
    ):
        to_sft_traces(Dataset.from_list([{"question": "1+1?", "answer": "2", "reply": "2"}]))
    data = to_sft_traces(
        Dataset.from_list([{"question": "1+1?", "answer": "2", "reply": "1+1=2\nFinal Answer: 2"}]),
        response_column="reply",
    )
    assert list(data["completion"]) == [[{"role": "assistant", "content": "1+1=2\nFinal Answer: 2"}]]


@pytest.mark.parametrize(
    "response, reason",
    [
        ("<Parallel><Path>a</Path><Path>b</Path></Parallel>\n<Summary>ab</Summary>\nFinal Answer: 3", None),
        ("Plain reasoning.\nFinal Answer: 3", None),
        ("Final Answer: 3\nBut wait, let me check again.", "no_final_answer"),
        ("<Parallel><Path>a</Path></Parallel>\n<Summary>a</Summary>\nFinal Answer: 3", "too_few_paths"),
        ("<Parallel><Path>a</Path><Path>b</Path></Parallel>\nFinal Answer: 3", "missing_summary"),
        ("The answer is 3.", "no_final_answer"),
        ("Final Answer:   ", "no_final_answer"),
        ("", "no_final_answer"),
    ],
)
def test_trace_problem_is_the_papers_filter(response, reason):
    assert trace_problem(response) == reason


@given(
    st.text().filter(lambda t: not any(tag in t for tag in TAGS)),
    st.text(alphabet=st.characters(exclude_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), min_size=1)
    .map(str.strip)
    .filter(lambda a: a and not any(tag in a for tag in TAGS)),
)
def test_final_answer_reads_the_last_line(reasoning, answer):
    assert final_answer(f"{reasoning}\n{FINAL_ANSWER} {answer}\n\n") == answer
    assert final_answer(f"{reasoning}\n{FINAL_ANSWER} {answer}</Summary>") == answer


def test_traces_longer_than_max_length_are_dropped_not_cut(tiny_tokenizer):
    from parallel_r1.data import drop_long_traces

    traces = load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"), limit=20)
    lengths = [
        len(tiny_tokenizer.apply_chat_template(r["prompt"] + r["completion"], return_dict=False)) for r in traces
    ]
    limit = sorted(lengths)[10]
    kept = drop_long_traces(traces, tiny_tokenizer, limit)
    assert list(kept["id"]) == [r["id"] for r, n in zip(traces, lengths) if n <= limit] and 0 < len(kept) < 20
    with pytest.raises(ValueError, match="no trace of dataset fits max_length=10"):
        drop_long_traces(traces, tiny_tokenizer, 10)
