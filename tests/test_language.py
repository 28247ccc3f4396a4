"""The tag language: parsing, the validity rules with their reasons, serialization, stats."""

import json
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_r1.data import DATA_DIR
from parallel_r1.tags.language import (
    TAGS,
    Block,
    ParserState,
    TagVocab,
    Text,
    canonical_block,
    parse,
    parser_states,
    serialize,
    stats,
    strip_tags,
)
from parallel_r1.tags.tokens import tag_vocab

P, PC, A, AC, S, SC = TAGS
GOOD = f"Let x be 3.{P}{A}x+1=4{AC}{A}4-x=1{AC}{PC}\n{S}both give 4{SC} so Final Answer: 4"


def codes(text):
    return [e.code for e in parse(text).errors]


def test_well_formed_block_parses_into_its_parts():
    parsed = parse(GOOD)
    assert parsed.well_formed and parsed.reason is None
    text, block, tail = parsed.nodes
    assert isinstance(text, Text) and text.content == "Let x be 3."
    assert isinstance(block, Block) and [p.body for p in block.paths] == ["x+1=4", "4-x=1"]
    assert block.separator == "\n" and block.summary == "both give 4" and block.summary_closed
    assert GOOD[block.start : block.start + len(P)] == P
    assert GOOD[block.close_at : block.close_at + len(PC)] == PC
    assert GOOD[block.paths[1].open_at : block.paths[1].open_at + len(A)] == A
    assert tail.content == " so Final Answer: 4" and tail.start == block.end


def test_real_cold_start_traces_with_newlines_between_tags_are_well_formed():
    rows = [json.loads(line) for line in open(DATA_DIR / "parallel_gsm8k_sample.jsonl")]
    results = {row["index"]: parse(row["response"]) for row in rows}
    bad = {i: p.errors[0].code for i, p in results.items() if not p.well_formed}
    assert len(rows) == 341 and len(bad) == 3
    assert sorted(bad.values()) == ["missing_summary", "text_between_paths", "unclosed_summary"]


@pytest.mark.parametrize(
    "text, code",
    [
        (f"{P}{A}a{AC}{A}b", "unclosed_path"),
        (f"{P}{A}a{AC}{A}b{AC}", "unclosed_block"),
        (f"{P}{A}a{AC}{PC}\n{S}s{SC}", "too_few_paths"),
        (f"{P}{PC}\n{S}s{SC}", "too_few_paths"),
        (f"{P}{A}a{AC}{A}b{AC}{PC} then more", "missing_summary"),
        (f"{P}{A}a{AC}{A}b{AC}{PC}", "missing_summary"),
        (f"{P}{A}a{AC}{A}b{AC}{PC}{S}s{SC}\n{S}t{SC}", "duplicate_summary"),
        (f"{P}{A}a{AC}{A}b{AC}{PC}{S}s", "unclosed_summary"),
        (f"{P}{A}a{AC} words {A}b{AC}{PC}{S}s{SC}", "text_between_paths"),
        (f"{P}{A}a{P}{A}x{AC}{AC}{A}b{AC}{PC}{S}s{SC}", "nested_block"),
        (f"{P}{P}{A}a{AC}{A}b{AC}{PC}{S}s{SC}", "nested_block"),
        (f"{P}{A}a{S}{AC}{A}b{AC}{PC}{S}s{SC}", "tag_in_path"),
        (f"{P}{A}a{AC}{S}{A}b{AC}{PC}{S}s{SC}", "tag_between_paths"),
        (f"done{AC}", "stray_closing_tag"),
        (f"done{PC}", "stray_closing_tag"),
        (f"{A}a{AC}", "path_outside_block"),
        (f"text {S}s{SC}", "summary_outside_block"),
        (f"{P}{A}a{AC}{A}b{AC}{PC}{S}s{A}{SC}", "tag_in_summary"),
    ],
)
def test_each_rule_reports_its_reason(text, code):
    parsed = parse(text)
    assert not parsed.well_formed
    assert code in codes(text)
    assert parsed.reason and "(at " in parsed.reason


def test_stricter_than_the_official_checker_where_documented():
    # the official stack check accepts both of these; we do not (see the format module docstring)
    no_summary_close = f"{P}{A}a{AC}{A}b{AC}{PC}{S}merged"
    text_between = f"{P}{A}a{AC} and {A}b{AC}{PC}{S}s{SC}"
    assert codes(no_summary_close) == ["unclosed_summary"]
    assert codes(text_between) == ["text_between_paths"]


def test_no_tags_is_well_formed_and_has_no_blocks():
    for text in ["", "Just text.\nFinal Answer: 2", "   "]:
        parsed = parse(text)
        assert parsed.well_formed and parsed.blocks == []
        assert stats(parsed).num_blocks == 0 and not stats(parsed).has_parallel


def test_repeated_blocks_and_k_paths():
    text = "a" + canonical_block(["1", "2", "3"], "s") + "b" + canonical_block(["x", "y"], "t") + "c"
    parsed = parse(text)
    assert parsed.well_formed
    assert stats(parsed).paths_per_block == (3, 2)


def test_stats_total_and_critical_path():
    text = "ab" + canonical_block(["xxxx", "yy"], "ss") + "c"
    s = stats(parse(text))
    path_lengths = [len(A) + 4 + len(AC), len(A) + 2 + len(AC)]
    assert s.total == len(text)
    assert s.critical == len(text) - min(path_lengths)  # only the longest path counts on the critical path
    assert s.block_positions == (2 / len(text),)
    assert s.has_parallel and s.num_blocks == 1


def test_a_path_decoded_after_the_concurrent_ones_counts_in_full_on_the_critical_path():
    """D with `concurrent`: the first paths are decoded at once (only the longest counts), a path the model opened
    later is decoded alone (all of it counts). The share of blocks whose paths open alike compares 3 units."""
    text = "ab" + canonical_block(["xxxx", "yy", "zzz"], "ss") + canonical_block(["same", "samey"], "t")
    lengths = [len(A) + n + len(AC) for n in (4, 2, 3)]
    everything, first_two = stats(parse(text)), stats(parse(text), concurrent=2)
    second = 2 * (len(A) + len(AC)) + 4 + 5
    assert everything.critical == len(text) - (sum(lengths) - max(lengths)) - (second - (len(A) + len(AC) + 5))
    assert first_two.critical == len(text) - min(lengths[:2]) - (second - (len(A) + len(AC) + 5))
    assert first_two.total == everything.total == len(text)
    assert everything.alike_blocks == 1  # "sam" twice in the second block; x, y, z open differently


def test_strip_tags():
    assert strip_tags(GOOD) == "Let x be 3.x+1=44-x=1\nboth give 4 so Final Answer: 4"


# ---------------------------------------------------------------- token ids


def test_id_parse_agrees_with_text_parse(tiny_tokenizer):
    vocab = tag_vocab(tiny_tokenizer)
    rows = [json.loads(line) for line in open(DATA_DIR / "parallel_gsm8k_sample.jsonl")][:40]
    for text in [GOOD, f"{P}{A}a{AC}{A}b", f"x{AC}{P}{A}a{AC}\n\n{A}b{AC}{PC}\n{S}s{SC}"] + [
        r["response"] for r in rows
    ]:
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        by_ids, by_text = parse(ids, vocab), parse(text)
        assert codes(text) == [e.code for e in by_ids.errors]
        assert stats(by_ids).paths_per_block == stats(by_text).paths_per_block
        assert serialize(by_ids, vocab) == tuple(ids)
        assert stats(by_ids).total == len(ids)


def test_id_parse_needs_a_vocab():
    with pytest.raises(ValueError, match="TagVocab"):
        parse([1, 2, 3])


# ---------------------------------------------------------------- properties

tag_soup = st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=6), st.sampled_from(["\n", " ", "<", "Path>"])))


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_any_string_parses_and_round_trips(text):
    parsed = parse(text)
    assert serialize(parsed) == text
    assert stats(parsed).total == len(text)


@given(tag_soup)
@settings(max_examples=500, deadline=None)
def test_any_tag_soup_parses_and_round_trips(pieces):
    text = "".join(pieces)
    parsed = parse(text)
    assert serialize(parsed) == text
    s = stats(parsed)
    assert 0 <= s.critical <= s.total and all(0 <= x < 1 for x in s.block_positions)
    assert parsed.well_formed == (not parsed.errors)


plain = st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=8)
blank = st.sampled_from(["", "\n", " ", "\n\n"])


@st.composite
def well_formed(draw):
    out, shape = draw(plain), []
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(2, 4))
        shape.append(k)
        out += P + "".join(draw(blank) + A + draw(plain) + AC for _ in range(k)) + draw(blank) + PC
        out += draw(blank) + S + draw(plain) + SC + draw(plain)
    return out, tuple(shape)


@given(well_formed())
@settings(max_examples=300, deadline=None)
def test_well_formed_completions_are_recognised(case):
    text, shape = case
    parsed = parse(text)
    assert parsed.well_formed, parsed.reason
    assert serialize(parsed) == text
    assert stats(parsed).paths_per_block == shape


ID_VOCAB = TagVocab(ids={tag: i for i, tag in enumerate(TAGS)}, blank_ids=frozenset({6}))


@given(st.lists(st.integers(0, 12), max_size=40))
@settings(max_examples=300, deadline=None)
def test_any_id_sequence_parses_and_round_trips(ids):
    parsed = parse(ids, ID_VOCAB)
    assert serialize(parsed, ID_VOCAB) == tuple(ids)
    assert set(parser_states(ids, ID_VOCAB)) <= set(get_args(ParserState))  # no state but the named ones


def test_one_block_reaches_every_named_parser_state():
    """`ParserState` names no state the parser never reaches: a block with its summary goes through them all."""
    # x <Parallel> <Path> x </Path> <Path> x </Path> </Parallel> space <Summary> x </Summary> x
    ids = [7, 0, 2, 7, 3, 2, 7, 3, 1, 6, 4, 7, 5, 7]
    assert set(parser_states(ids, ID_VOCAB)) == set(get_args(ParserState))


SPACES = [" ", "\n", "\t", "\r\n", "\u00a0", "\u2003", "\u3000", "\u200b", " \u00a0 "]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list(TAGS) + SPACES + ["x", "7 ", "é"]), max_size=14))
def test_text_and_id_parsers_agree_on_whitespace(tiny_tokenizer, pieces):
    """Whitespace is ASCII whitespace in both parsers, so a multi-byte space (split into byte tokens or not) is
    text in both: the two parses report the same errors for the same completion."""
    text = "".join(pieces)
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text
    by_ids = parse(ids, tag_vocab(tiny_tokenizer))
    assert [e.code for e in by_ids.errors] == codes(text)
    assert stats(by_ids).paths_per_block == stats(parse(text)).paths_per_block


def test_a_non_breaking_space_between_paths_is_text():
    text = f"{P}{A}a{AC}\u00a0{A}b{AC}{PC}\n{S}s{SC}"
    assert codes(text) == ["text_between_paths"]
