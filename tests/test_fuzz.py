"""The fuzz drill at a size that fits CI, the drill's own failure reports, and round trips of adversarial tag strings."""

import random
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parallel_r1.answers import extract_reference
from parallel_r1.rewards import REWARDS, get_reward_funcs
from parallel_r1.tags.language import TAGS, parse, serialize
from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.drills import fuzz
from parallel_r1.testing.drills.fuzz import HUGE_CHARS, KEEP_SLOWEST, KINDS, SCHEDULE_SPECS, draw_case, run_fuzz
from parallel_r1.testing.tiny import build_tokenizer

CI_SIZE = 300  # inputs, every kind drawn at seed 0; about 12 s on two cores
# (the full drill: `python -m parallel_r1.testing.drills.fuzz`)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def report(tokenizer):
    return run_fuzz(CI_SIZE, seed=0, tokenizer=tokenizer)


def reward_names() -> list[str]:
    names = [f"reward {r.__name__}" for r in get_reward_funcs(list(REWARDS) + list(SCHEDULE_SPECS))]
    return names + [f"{name} [ids]" for name in names]


def test_drill_raises_nothing_and_keeps_every_value_in_range(report):
    assert report.failures == []
    assert report.ok and report.no_exception
    assert set(report.kinds) == set(KINDS), "every kind of input was drawn"
    assert report.max_chars >= HUGE_CHARS[0]


def test_drill_calls_every_function_and_every_reward_once_per_input(report):
    expected = [f"language.{f}{s}" for f in ("parse", "serialize", "stats") for s in ("", " [ids]")]
    expected += ["answers.extract_answer", "answers.extract_reference", "answers.is_correct"] + reward_names()
    assert sorted(report.functions) == sorted(expected)
    assert all(f.calls == CI_SIZE for f in report.functions.values())
    assert report.calls == CI_SIZE * len(expected)


def test_drill_reports_the_slowest_calls_slowest_first(report):
    times = [c.seconds for c in report.slowest]
    assert len(times) == KEEP_SLOWEST and times == sorted(times, reverse=True)
    assert times[0] == max(f.slowest.seconds for f in report.functions.values())
    assert "[ids]" not in report.slowest[0].name or report.slowest[0].tokens is not None
    markdown = fuzz.to_markdown(report, "cmd")
    assert "No exception: yes" in markdown and report.slowest[0].name in markdown


def test_drill_reports_a_value_outside_the_declared_range(monkeypatch, tokenizer):
    monkeypatch.setitem(REWARDS, "well_formed", replace(REWARDS["well_formed"], rule=lambda c: 2.0))
    report = run_fuzz(5, seed=0, tokenizer=tokenizer)
    assert report.violations == 10 and report.exceptions == 0 and not report.ok
    assert {f.name for f in report.failures} == {"reward well_formed", "reward well_formed [ids]"}
    assert all("outside its declared range 0.0..1.0" in f.problem for f in report.failures)


def test_drill_reports_an_exception_the_library_caught_and_logged(monkeypatch, tokenizer):
    monkeypatch.setitem(REWARDS, "parallel", replace(REWARDS["parallel"], rule=lambda c: 1 / 0))
    report = run_fuzz(3, seed=0, tokenizer=tokenizer)
    assert report.exceptions == 6 and not report.no_exception
    assert any(f.exception and f.problem.startswith("logged: reward parallel failed") for f in report.failures)
    assert any(not f.exception and "None" in f.problem for f in report.failures), "the row came back None"


def test_drill_reports_a_raised_exception_and_a_lossy_round_trip(monkeypatch, tokenizer):
    def lossy(parsed, vocab=None):
        return serialize(parsed, vocab)[1:]

    monkeypatch.setattr(fuzz, "serialize", lossy)
    monkeypatch.setattr(fuzz, "extract_reference", lambda cell: 1 / 0)
    report = run_fuzz(20, seed=0, tokenizer=tokenizer)
    problems = {(f.name, f.problem) for f in report.failures}
    assert ("answers.extract_reference", "raised ZeroDivisionError: division by zero") in problems
    assert ("language.serialize", "serialize(parse(x)) != x") in problems
    assert report.exceptions == 20


def test_cases_are_reproducible_valid_text_and_huge_ones_are_huge():
    for index in range(300):
        case = draw_case(7, index)
        assert case == draw_case(7, index)
        case.text.encode("utf-8")  # no surrogate: a decoder never writes one
    for seed in range(10):
        assert HUGE_CHARS[0] <= len(KINDS["huge"][1](random.Random(seed), "7")) <= HUGE_CHARS[1]
    assert draw_case(7, 0) != draw_case(8, 0)


# ---------------------------------------------------------------- round trips

fragments = st.one_of(
    st.sampled_from(TAGS + fuzz.NEAR_TAGS + fuzz.LATEX + fuzz.WORDS + fuzz.BLANKS + fuzz.FINALS),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=5),
)


def assert_round_trips(text: str, tokenizer) -> None:
    """Text and ids survive parse -> serialize -> parse unchanged, and both parses report the same errors."""
    parsed = parse(text)
    assert serialize(parsed) == text
    assert parse(serialize(parsed)) == parsed
    vocab = tag_vocab(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False, verbose=False)
    by_ids = parse(ids, vocab)
    assert serialize(by_ids, vocab) == tuple(ids)
    assert parse(serialize(by_ids, vocab), vocab) == by_ids
    assert [e.code for e in by_ids.errors] == [e.code for e in parsed.errors]
    assert [len(b.paths) for b in by_ids.blocks] == [len(b.paths) for b in parsed.blocks]


@given(st.lists(fragments, max_size=60))
@settings(max_examples=300, deadline=None)
def test_adversarial_tag_strings_round_trip(tokenizer, pieces):
    assert_round_trips("".join(pieces), tokenizer)


@given(st.integers(0, 2**32 - 1), st.integers(0, 10**6))
@settings(max_examples=200, deadline=None)
def test_drill_inputs_round_trip(tokenizer, seed, index):
    text = draw_case(seed, index).text
    assume(len(text) <= 20_000)  # huge inputs are the drill's; tokenizing them here would be slow
    assert_round_trips(text, tokenizer)


@pytest.mark.parametrize(
    ("cell", "gold"),
    [(r"\boxed{\boxed{3}}", "3"), (r"#### \boxed{5}", "5"), (r"\boxed{#### 1,000}", "1000"), ("#### , 5", "5")],
)
def test_extract_reference_unwraps_until_nothing_changes(cell, gold):
    once = extract_reference(cell)
    assert once == gold and extract_reference(once) == once
