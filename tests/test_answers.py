"""Answers: extraction rules, references, verification on real benchmark rows, bounded time, never raising."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_r1.answers import (
    MAX_ANSWER_CHARS,
    MAX_SCAN_CHARS,
    _verifier,
    answers_match,
    extract_answer,
    extract_reference,
    is_correct,
    normalize,
)
from parallel_r1.data import DATA_DIR


def rows(name: str) -> list[dict]:
    with open(DATA_DIR / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def math500_answer(answer: str) -> str:
    """A MATH-500 gold answer, checked to be in the shipped file (so the tests use real items)."""
    assert any(row["answer"] == answer for row in rows("math500.jsonl")), answer
    return answer


# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("So the total is 18.\nFinal Answer: 18", "18"),
        ("**Final Answer:** 42.", "42"),
        ("final answer: $4", "$4"),
        ("Final Answer:\n\n  7  \nThanks", "7"),
        ("We get $\\boxed{\\frac{1}{\\sqrt{2}}}$.", "\\frac{1}{\\sqrt{2}}"),
        ("Final Answer: $\\boxed{5}$", "5"),  # a box inside the line gives its content
        ("**Final Answer**\n\\[\\boxed{12}\\]", "12"),  # no colon: the box decides
        ("\\boxed{3} looks wrong.\nFinal Answer: 4", "4"),  # the later marker wins
        ("Final Answer: 4\nOn second thought \\boxed{5}", "5"),
        ("The roots are $\\boxed{2}$ and $\\boxed{-3}$.", "2, -3"),  # boxes of one line are one answer
        ("First \\boxed{1}\nthen \\boxed{2}", "2"),  # boxes on different lines: the last
        ("\\boxed{5} and then \\boxed{6", "5"),  # a box cut open by truncation is ignored
        ("<Parallel><Path>Final Answer: 1</Path><Path>x</Path></Parallel>\n<Summary>s</Summary>Final Answer: 2", "2"),
        ("Final Answer: 12</Summary>", "12"),  # tags are removed before reading
        ("no answer in this text", None),
        ("Final Answer:   ", None),
        ("", None),
        ("Final Answer: " + "9" * (MAX_ANSWER_CHARS + 1), None),  # too long to be an answer
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize("completion", [None, 5, b"Final Answer: 3", ["Final Answer: 3"]])
def test_extract_answer_of_a_non_string_is_none(completion):
    assert extract_answer(completion) is None


def test_giant_completion_reads_its_tail():
    assert extract_answer("{" * 1_000_000 + "\\boxed{" * 10_000 + "\nFinal Answer: 3") == "3"
    assert extract_answer("Final Answer: 3" + "x" * (MAX_SCAN_CHARS + 10)) is None  # beyond the scanned tail


# --------------------------------------------------------------------------- references


def test_gsm8k_references_drop_thousands_commas():
    with_commas = [r for r in rows("gsm8k_test.jsonl") if "," in r["answer"].rsplit("####", 1)[1]]
    assert with_commas, "the shipped GSM8K test set has answers with commas"
    for row in with_commas:
        number = row["answer"].rsplit("####", 1)[1].strip()
        assert extract_reference(row["answer"]) == number.replace(",", "")


def test_extract_reference_keeps_plain_answers_and_is_idempotent():
    cells = [r["answer"] for name in ("math500.jsonl", "aime24.jsonl", "gsm8k_test.jsonl") for r in rows(name)]
    for cell in cells:
        once = extract_reference(cell)
        assert extract_reference(once) == once
    assert extract_reference("\\frac{14}{3}") == "\\frac{14}{3}"
    assert extract_reference("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_reference("\\boxed{1} and \\boxed{2}") == "\\boxed{1} and \\boxed{2}"  # not one box
    assert extract_reference(70) == "70"
    assert extract_reference(None) == ""


# --------------------------------------------------------------------------- verification on real rows


def test_cold_start_sample_is_all_correct_and_wrong_against_other_rows():
    """The 341 shipped traces end with a right `Final Answer:` ($21.00, 36.00, $90,000 ... included)."""
    sample = rows("parallel_gsm8k_sample.jsonl")
    assert all(is_correct(r["response"], r["answer"]) for r in sample)
    for row, other in zip(sample[:40], sample[1:41]):
        if float(row["answer"]) != float(other["answer"]):
            assert not is_correct(row["response"], other["answer"])


@pytest.mark.parametrize("name", ["aime24.jsonl", "aime25.jsonl", "amc23.jsonl"])
def test_integer_benchmarks(name):
    for row in rows(name):
        assert is_correct(f"Final Answer: {row['answer']}", row["answer"])
        assert is_correct(f"so \\boxed{{{row['answer']}}}.", row["answer"])
        assert not is_correct(f"Final Answer: {int(row['answer']) + 1}", row["answer"])


def test_gsm8k_answers_with_commas_dollars_and_units():
    row = next(r for r in rows("gsm8k_test.jsonl") if r["answer"].endswith("#### 114,200"))
    for written in ("114200", "114,200", "$114,200", "$114,200.00", "114200 dollars", "\\boxed{114{,}200}"):
        assert is_correct(f"Final Answer: {written}", row["answer"]), written
    assert not is_correct("Final Answer: 114,201", row["answer"])


@pytest.mark.parametrize(
    "written, gold",
    [
        ("14/3", "\\frac{14}{3}"),
        ("\\dfrac{14}{3}", "\\frac{14}{3}"),
        ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("10080", "10,\\!080"),
        ("$32,348", "\\$32,\\!348"),
        ("90", "90^\\circ"),
        ("Evelyn", "\\text{Evelyn}"),
        ("(C)", "\\text{(C)}"),
        ("5.4", "5.4 \\text{ cents}"),
        ("-2, 1", "1,-2"),  # a set of solutions, in another order
        ("\\boxed{1} and \\boxed{-2}", "1,-2"),  # several boxes on one line
    ],
)
def test_math500_equivalent_spellings(written, gold):
    gold = math500_answer(gold)
    completion = written if "\\boxed" in written else f"Final Answer: {written}"
    assert is_correct(completion, gold)


@pytest.mark.parametrize(
    "written, gold",
    [
        ("4.67", "\\frac{14}{3}"),
        ("(3, \\pi)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\boxed{1}", "1,-2"),  # one of two solutions
        ("Evelyn and Navin", "\\text{Evelyn}"),
    ],
)
def test_math500_wrong_answers(written, gold):
    gold = math500_answer(gold)
    assert not is_correct(written if "\\boxed" in written else f"Final Answer: {written}", gold)


@pytest.mark.parametrize(
    "answer, reference, expected",
    [
        ("18 dollars", "18", True),  # a unit word: read again as plain text
        ("x = 5", "5", True),
        ("2x+3", "3+2x", True),
        ("3", "2x+3", False),
        ("0.5", "\\frac12", True),
        ("", "5", False),
        ("5", "", False),
    ],
)
def test_answers_match(answer, reference, expected):
    assert answers_match(answer, reference) is expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\$1,234.", "1234"),
        ("\\text{ Evelyn }", "evelyn"),
        ("\\left( 3, \\dfrac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("90^{\\circ}", "90"),
        ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
        ("1,-2", "1,-2"),
        ("50\\%", "50"),
    ],
)
def test_normalize(text, expected):
    assert normalize(text) == expected


# --------------------------------------------------------------------------- bounded time, any thread

SLOW = "\\boxed{9^{9^{9}}}"  # math-verify compares this with 5 for minutes without a timeout


def test_bound_holds_off_the_main_thread_and_the_checker_recovers():
    result = {}

    def check():
        start = time.monotonic()
        result["verdict"] = is_correct(SLOW, "5", timeout=0.5)
        result["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=check)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert result["verdict"] is False
    assert result["seconds"] < 30  # bounded (the unbounded check runs for minutes)
    assert is_correct("Final Answer: 14/3", "\\frac{14}{3}")  # the restarted checker works


def test_default_bound_from_a_thread():
    result = {}
    thread = threading.Thread(target=lambda: result.update(verdict=is_correct(SLOW, "5")))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and result["verdict"] is False


def test_threads_share_the_checker():
    cases = [("14/3", "\\frac{14}{3}", True), ("4.67", "\\frac{14}{3}", False), ("0.5", "\\frac12", True)] * 4
    results = [None] * len(cases)

    def check(i, answer, gold):
        results[i] = is_correct(f"Final Answer: {answer}", gold)

    threads = [threading.Thread(target=check, args=(i, a, g)) for i, (a, g, _) in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [expected for _, _, expected in cases]


# --------------------------------------------------------------------------- never raises

FRAGMENTS = st.sampled_from(
    ["\\boxed{", "{", "}", "Final Answer:", "final answer: ", "\n", "$", "\\frac", "{1}{2}", "9^{9^{9}}", "<Parallel>",
     "</Path>", "<Summary>", "12", ",", "x", "\\", "**", " ", "\\text{", "\\left(", "é", "\x00", "\ud800"]
)  # fmt: skip
TEXTS = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(FRAGMENTS, st.sampled_from(["####", "\\boxed{", "}"])), max_size=40).map("".join),
)


@settings(max_examples=150, deadline=None)
@given(completion=TEXTS, reference=st.one_of(TEXTS, st.integers(), st.none()))
def test_arbitrary_input_never_raises(completion, reference):
    answer = extract_answer(completion)
    assert answer is None or (isinstance(answer, str) and 0 < len(answer) <= MAX_ANSWER_CHARS)
    gold = extract_reference(reference)
    assert isinstance(gold, str) and extract_reference(gold) == gold  # idempotent
    assert isinstance(is_correct(completion, reference, timeout=2.0), bool)


@settings(max_examples=100, deadline=None)
@given(answer=st.from_regex(r"-?[1-9][0-9]{0,8}", fullmatch=True))
def test_an_integer_matches_itself_with_commas_and_dollars(answer):
    with_commas = f"{int(answer):,}"
    assert is_correct(f"Final Answer: ${with_commas}", answer)
    assert is_correct(f"\\boxed{{{answer}}}", f"Solution...\n#### {with_commas}")


def _check_in_fork(queue):
    queue.put((is_correct("Final Answer: 14/3", "\\frac{14}{3}"), _verifier._proc.pid))


def test_a_forked_process_gets_its_own_checker():
    """A fork (a DataLoader worker, say) must not talk to its parent's math-verify process."""
    assert is_correct("Final Answer: 0.5", "\\frac12")  # the parent's checker is running
    parent_checker = _verifier._proc.pid
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_check_in_fork, args=(queue,))
    process.start()
    verdict, fork_checker = queue.get(timeout=60)
    process.join(timeout=60)
    assert verdict is True and fork_checker != parent_checker
    assert is_correct("Final Answer: 0.5", "\\frac12") and _verifier._proc.pid == parent_checker
