"""The tag grammar: its table, its per-token bans, the masked log-probs, and what the engine samples under it."""

from dataclasses import dataclass
from typing import get_args

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rollout_helpers import engine, prompts

from parallel_r1.rollout.arguments import ParallelArguments
from parallel_r1.rollout.engine import EnginePhase
from parallel_r1.tags.grammar import Grammar, Phase, SampledPhase, masked_logps
from parallel_r1.tags.language import TAGS, TagVocab, parse

P, PC, A, AC, S, SC = TAGS
VOCAB = TagVocab(ids={P: 1, PC: 2, A: 3, AC: 4, S: 5, SC: 6}, blank_ids=frozenset({9}))
EOS = 0
TEXT = 7  # any ordinary token
ALL = frozenset({0, 1, 2, 3, 4, 5, 6})


def grammar(max_blocks=4):
    return Grammar(VOCAB, frozenset({EOS}), max_blocks, 2, 2)


def test_the_table():
    g = grammar(max_blocks=2)
    assert g.controlled == (0, 1, 2, 3, 4, 5, 6)
    assert g.allowed("main", 0) == {EOS, 1} and g.allowed("main", 1) == {EOS, 1}
    assert g.allowed("main", 2) == {EOS}  # the block limit: no more <Parallel>
    assert g.allowed("path", 0) == {4}  # only </Path>, no EOS
    assert g.allowed("summary", 0) == {6}  # only </Summary>, no EOS
    assert g.allowed("block", 0) == g.allowed("after_block", 1) == ALL  # inserted by the runtime
    assert g.banned("path", 0) == ALL - {4}


def test_the_sampled_phases_are_the_phases_with_a_rule():
    """`SampledPhase` names exactly the phases of `Phase` where the grammar bans something; in the others the
    runtime writes the tokens."""
    g = grammar()
    ruled = {phase for phase in get_args(Phase) if g.allowed(phase, 0) != frozenset(g.controlled)}
    assert ruled == set(get_args(SampledPhase))


@dataclass(frozen=True)
class _Recording:
    """A grammar that records the phases it is asked about."""

    grammar: Grammar
    asked: set

    def __getattr__(self, name):
        return getattr(self.grammar, name)

    def allowed(self, phase, blocks):
        self.asked.add(phase)
        return self.grammar.allowed(phase, blocks)


def test_the_engine_samples_in_every_sampled_phase_and_no_other(tag_prone):
    """The engine's phases are the grammar's sampled phases and "done": a run with width decisions segments in each
    of the sampled phases, under its own spelling, and in nothing else."""
    assert get_args(EnginePhase) == (*get_args(SampledPhase), "done")
    sampler = engine(tag_prone, min_paths=2, max_paths=3, max_completion_length=200)
    sampler.grammar = _Recording(sampler.grammar, set())
    rollouts = sampler.generate(prompts(tag_prone[2]))
    assert any(r.blocks for r in rollouts)
    assert sampler.grammar.asked == set(get_args(SampledPhase))


def test_phases_follow_the_engine_layout():
    ids = [TEXT, 1, 3, TEXT, 4, 3, TEXT, 4, 2, 9, 5, TEXT, 6, TEXT, 1, 3]
    phases = [phase for phase, _ in grammar().phases(ids)]
    assert phases == [
        "main", "main", "block", "path", "path", "block", "path", "path", "block", "after_block",
        "after_block", "summary", "summary", "main", "main", "block",
    ]  # fmt: skip
    blocks = [b for _, b in grammar().phases(ids)]
    assert blocks[:2] == [0, 0] and blocks[2] == 1 and blocks[-1] == 2


def test_the_ban_mask_and_violations():
    g = grammar(max_blocks=1)
    ids = [TEXT, 1, 3, TEXT, 5, 4, 3, EOS, 4, 2, 9, 5, TEXT, 6, 1, EOS]
    bans, _, _ = g.masks(ids)
    assert bans.shape == (len(ids), len(g.controlled))
    column = {token: j for j, token in enumerate(g.controlled)}
    assert not bans[0, column[1]]  # <Parallel> allowed before the first block
    assert bans[14, column[1]] and not bans[15, column[EOS]]  # after the limit: banned; EOS still allowed
    assert bans[4, column[5]] and bans[7, column[EOS]]  # <Summary> and EOS inside a path
    assert not bans[2].any() and not bans[10].any()  # runtime-written positions
    # the tags that stand where the rule bans them: <Summary> and EOS in the paths, the second <Parallel>
    assert g.violations(ids) == [4, 7, 14]


def test_width_decisions_allow_exactly_a_new_path_or_the_close():
    """With min_paths 2 and max_paths 3: the token after the 2nd </Path> is the model's (<Path> or </Parallel>, nothing
    else of the vocabulary); after the 1st and the 3rd the runtime writes, so nothing is banned there."""
    g = Grammar(VOCAB, frozenset({EOS}), 4, min_paths=2, max_paths=3)
    wide = [TEXT, 1, 3, TEXT, 4, 3, TEXT, 4, 3, TEXT, 4, 2, 9, 5, TEXT, 6]  # three paths: the model opened the 3rd
    narrow = [TEXT, 1, 3, TEXT, 4, 3, TEXT, 4, 2, 9, 5, TEXT, 6]  # two: the model closed the block
    for ids, decision in ((wide, 8), (narrow, 8)):
        phases = [phase for phase, _ in g.phases(ids)]
        assert [i for i, p in enumerate(phases) if p == "decide"] == [decision]
        assert g.masks(ids)[1].nonzero().flatten().tolist() == [decision]
        assert g.violations(ids) == []
    assert g.allowed("decide", 0) == g.only("decide") == {3, 2} and g.only("block") is None
    assert g.violations(narrow[:8] + [TEXT]) == [8]  # text where the width is decided
    assert g.violations(narrow[:8] + [EOS]) == [8]
    # a block straight after one without its summary counts its own paths, from none
    missing = [TEXT, 1, 3, TEXT, 4, 3, TEXT, 4, 2, 1, 3, TEXT, 4, 3, TEXT, 4, 2, 9, 5, TEXT, 6]
    assert [i for i, (p, _) in enumerate(g.phases(missing)) if p == "decide"] == [8, 16]
    fixed = Grammar(VOCAB, frozenset({EOS}), 4, min_paths=2, max_paths=2)
    assert "decide" not in [phase for phase, _ in fixed.phases(wide)] and not fixed.masks(wide)[1].any()


def test_masked_logps_renormalise_a_decision_over_its_two_ids():
    logits = torch.randn(1, 3, 12)
    targets = torch.tensor([[3, 2, 7]])
    bans = torch.zeros(1, 3, 7, dtype=torch.bool)
    only = torch.tensor([[True, True, False]])
    logps, entropy = masked_logps(logits, targets, bans, tuple(range(7)), 1.0, only, (2, 3))
    pair = torch.log_softmax(logits[0, :2, [2, 3]], -1)
    torch.testing.assert_close(logps[0, :2], torch.stack([pair[0, 1], pair[1, 0]]))
    torch.testing.assert_close(logps[0, 2], torch.log_softmax(logits[0, 2], -1)[7])
    assert entropy[0, :2].max() <= torch.log(torch.tensor(2.0)) + 1e-6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=40), st.integers(0, 3))
def test_violations_are_the_banned_entries_of_the_matrix(ids, max_blocks):
    g = grammar(max_blocks)
    bans, _, _ = g.masks(ids)
    column = {token: j for j, token in enumerate(g.controlled)}
    expected = [i for i, t in enumerate(ids) if t in column and bool(bans[i, column[t]])]
    assert g.violations(ids) == expected


def test_masked_logps_renormalise_over_what_is_allowed():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 12, requires_grad=True)
    targets = torch.randint(7, 12, (2, 5))
    controlled = (0, 1, 2, 3)
    bans = torch.rand(2, 5, 4) < 0.5
    logps, entropy = masked_logps(logits, targets, bans, controlled, temperature=0.7)
    reference = (logits.detach() / 0.7).clone()
    for b in range(2):
        for n in range(5):
            reference[b, n, [c for c, banned in zip(controlled, bans[b, n]) if banned]] = float("-inf")
    expected = torch.log_softmax(reference, -1)
    torch.testing.assert_close(logps, expected.gather(-1, targets[..., None]).squeeze(-1))
    probs = expected.exp()
    torch.testing.assert_close(entropy, -(probs * expected.nan_to_num(neginf=0.0)).sum(-1))
    (logps.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()
    banned_grads = logits.grad[..., list(controlled)][bans]
    assert banned_grads.abs().max() == 0.0  # a banned logit has no say in the masked distribution


def _only_the_last_segment_is_open(parsed) -> bool:
    """A completion cut by the cap: every error is about the one segment still open at the end."""
    open_codes = {"unclosed_path", "unclosed_block", "missing_summary", "unclosed_summary"}
    return all(e.code in open_codes for e in parsed.errors) and len(parsed.errors) <= 2


@pytest.mark.parametrize("mode, attention", [("fork", "isolated"), ("fork", "causal"), ("sequential", "causal")])
def test_every_sampled_completion_obeys_the_grammar(tag_prone, mode, attention):
    """Many seeded rollouts of a tag-prone model: no tag where the grammar bans it, and well-formed from the ids
    (or cut by the completion cap, with only the last segment open)."""
    _, _, tokenizer, vocab = tag_prone
    eos = tokenizer.eos_token_id
    seen = {"blocks": 0, "cut": 0, "limit": 0}
    for seed in range(6):
        width = 2 + seed % 3
        config = dict(rollout_mode=mode, attention=attention, min_paths=width, max_paths=width, max_blocks=seed % 3)
        config.update(
            max_path_tokens=2 + 5 * seed, max_summary_tokens=1 + 3 * seed, max_completion_length=40 + 30 * seed
        )
        for r in engine(tag_prone, seed=seed, **config).generate(prompts(tokenizer)):
            rule = Grammar(vocab, frozenset({eos}), config["max_blocks"], width, width)
            assert rule.violations(r.completion_ids) == []
            parsed = parse(r.completion_ids, vocab)
            assert parsed.well_formed or (r.finish == "length" and _only_the_last_segment_is_open(parsed))
            assert eos not in r.completion_ids[:-1]
            seen["blocks"] += r.blocks
            seen["cut"] += not parsed.well_formed
            seen["limit"] += r.blocks == config["max_blocks"]
    assert all(seen.values()), seen  # the run saw blocks, cut completions and completions at the block limit


@pytest.mark.parametrize("k", [2, 3])
def test_sequential_mode_keeps_the_budgets(tag_prone, k):
    """Sequential paths and summaries are cut at their budgets with an inserted closer, like forked ones."""
    _, _, tokenizer, vocab = tag_prone
    config = dict(
        rollout_mode="sequential",
        attention="causal",
        min_paths=k,
        max_paths=k,
        max_path_tokens=3,
        max_summary_tokens=2,
    )
    rollouts = engine(tag_prone, max_completion_length=300, **config).generate(prompts(tokenizer))
    cut = 0
    for r in rollouts:
        for block in parse(r.completion_ids, vocab).blocks:
            if not block.summary_closed:
                continue  # cut by the completion cap
            assert len(block.paths) == k
            for path in block.paths:
                assert path.closed and len(path.body) <= 3
                inserted_closer = r.env_mask[path.end - 1] == 0
                cut += inserted_closer
                assert inserted_closer == (len(path.body) == 3 and r.completion_ids[path.end - 1] == vocab.ids[AC])
            assert len(block.summary) <= 2
            assert all(r.env_mask[p.open_at] == 0 for p in block.paths)  # <Path> is written by the runtime
    assert cut > 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([TEXT, 1, 2, 3, 4, 5, 6, 9, EOS]), max_size=40), st.integers(2, 4), st.integers(0, 2))
def test_a_decision_follows_a_path_closer_of_a_block_within_its_widths(ids, low, extra):
    """Property: a decision point is the first token but whitespace after a `</Path>` that closes a block's k-th path,
    min <= k < max, where the parser is between paths; fixed widths have none."""
    from parallel_r1.tags.language import decision_points, parser_states

    high = low + extra
    points = decision_points(ids, VOCAB, ParallelArguments(min_paths=low, max_paths=high))
    states = parser_states(ids, VOCAB)
    expected = []
    for i in range(1, len(ids)):
        if ids[i - 1] == 4 and states[i - 1] == "path":
            paths = len(parse(ids[:i], VOCAB).blocks[-1].paths)
            while i < len(ids) and ids[i] == 9 and states[i] == "block":  # whitespace between the tags
                i += 1
            if low <= paths < high and i < len(ids) and states[i] == "block":
                expected.append(i)
    assert points == expected
    assert all(states[i] == "block" and ids[i] != 9 for i in points)
    if extra == 0:
        assert points == []
