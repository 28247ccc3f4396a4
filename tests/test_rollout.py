"""The fork-join engine on the transformers backend: exact, masked, budgeted, any K."""

import gc
from typing import get_args

import pytest
import torch
from rollout_helpers import engine, prompts, trainer_logprobs

from parallel_r1.rollout import EngineTokens, RolloutArguments, Sampling, Segment, TransformersBackend
from parallel_r1.rollout.arguments import ParallelArguments
from parallel_r1.rollout.backend import SegmentFinish, finish_segment
from parallel_r1.tags.language import PARALLEL_OPEN, parse


@pytest.mark.parametrize("attention, mode", [("isolated", "fork"), ("causal", "fork"), ("causal", "sequential")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("widths", [(2, 2), (2, 4)])
def test_kv_reuse_samples_what_the_naive_reference_samples(tag_prone, attention, mode, temperature, widths):
    """Same tokens, same log-probs: KV reuse vs re-prefill per request vs re-encoding at every token (with chosen
    widths, the probe too is read from the stream's KV, re-read, or re-encoded)."""
    settings = dict(attention=attention, rollout_mode=mode, max_completion_length=64)
    settings.update(min_paths=widths[0], max_paths=widths[1])
    runs = {
        reuse: engine(tag_prone, reuse, temperature, **settings).generate(prompts(tag_prone[2]))
        for reuse in ("full", "per_request", "none")
    }
    assert any(r.blocks for r in runs["full"])
    for full, per_request, naive in zip(*runs.values()):
        assert full.completion_ids == per_request.completion_ids == naive.completion_ids
        assert full.env_mask == naive.env_mask
        torch.testing.assert_close(torch.tensor(full.logprobs), torch.tensor(naive.logprobs), atol=2e-5, rtol=0)


EXACT_PAIRS = [("isolated", "fork"), ("causal", "sequential")]


@pytest.mark.parametrize("attention, mode", EXACT_PAIRS)
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("max_blocks, max_path_tokens", [(100, 24), (1, 24), (2, 3)])
def test_what_is_trained_is_what_was_sampled(tag_prone, attention, mode, k, max_blocks, max_path_tokens):
    """The exact pairs: the trainer's forward (structure and grammar from the ids) gives the sampler's log-probs on
    every sampled token, also after the block limit (a banned <Parallel>) and on paths cut by their budget."""
    _, _, tokenizer, vocab = tag_prone
    config = dict(
        attention=attention,
        rollout_mode=mode,
        min_paths=k,
        max_paths=k,
        max_blocks=max_blocks,
        max_path_tokens=max_path_tokens,
    )
    rollouts = engine(tag_prone, **config).generate(prompts(tokenizer))
    assert sum(r.blocks for r in rollouts) >= 3
    if max_blocks == 1:
        assert any(r.blocks == 1 and len(r.completion_ids) > 0 for r in rollouts)  # the limit is reached
    for rollout in rollouts:
        sampled = torch.tensor(rollout.env_mask).bool()
        recomputed = trainer_logprobs(tag_prone, rollout, attention == "isolated", max_blocks)
        torch.testing.assert_close(recomputed[sampled], torch.tensor(rollout.logprobs)[sampled], atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention, mode", EXACT_PAIRS)
def test_a_summary_temperature_is_trained_as_sampled(tag_prone, attention, mode):
    """`summary_temperature`: the summary's tokens (its closer included) are drawn at it, the rest at the sampling
    temperature, and the trainer's forward scores each token at the temperature it was drawn at; scored at the
    sampling temperature alone, exactly the summary's tokens would be off."""
    _, _, tokenizer, vocab = tag_prone
    config = dict(attention=attention, rollout_mode=mode, summary_temperature=0.4)
    rollouts = engine(tag_prone, temperature=0.8, **config).generate(prompts(tokenizer))
    summaries = 0
    for rollout in rollouts:
        sampled = torch.tensor(rollout.env_mask).bool()
        in_summary = torch.tensor([phase == "summary" for phase, _ in engine(tag_prone).grammar.phases(
            rollout.completion_ids)])  # fmt: skip
        exact = trainer_logprobs(tag_prone, rollout, attention, temperature=0.8, summary_temperature=0.4)
        torch.testing.assert_close(exact[sampled], torch.tensor(rollout.logprobs)[sampled], atol=1e-5, rtol=0)
        one = trainer_logprobs(tag_prone, rollout, attention, temperature=0.8)
        gap = (one - exact).abs()
        assert gap[~in_summary].max() == 0  # outside summaries nothing changes
        summaries += int(in_summary.sum())
        assert (gap[in_summary & sampled] > 0).all()  # every summary token is scored at its own temperature
    assert summaries >= 10


def test_a_greedy_run_ignores_the_summary_temperature(tag_prone):
    _, _, tokenizer, _ = tag_prone
    runs = [
        engine(tag_prone, temperature=0.0, summary_temperature=t).generate(prompts(tokenizer)) for t in (None, 3.0)
    ]
    assert any(r.blocks for r in runs[0])
    assert [r.completion_ids for r in runs[0]] == [r.completion_ids for r in runs[1]]


def test_without_the_grammar_the_trainer_would_train_another_policy(tag_prone):
    """The hole the grammar closes: scored without the bans, the same rollouts are off by nats after the limit."""
    _, _, tokenizer, _ = tag_prone
    rollouts = engine(tag_prone, max_blocks=1, max_completion_length=200).generate(prompts(tokenizer))
    gaps = []
    for rollout in rollouts:
        sampled = torch.tensor(rollout.env_mask).bool()
        plain = trainer_logprobs(tag_prone, rollout, "isolated", max_blocks=1, grammar=False)
        gaps.append((plain[sampled] - torch.tensor(rollout.logprobs)[sampled]).abs().max().item())
    assert max(gaps) > 1.0


def test_causal_training_of_forked_paths_is_a_measured_mismatch(tag_prone):
    """Seen + fork (the paper's Seen rollout) is not exact: later paths and the summary differ."""
    _, _, tokenizer, _ = tag_prone
    rollouts = engine(tag_prone, attention="causal", rollout_mode="fork").generate(prompts(tokenizer))
    assert sum(r.blocks for r in rollouts) >= 3
    gaps = []
    for rollout in rollouts:
        sampled = torch.tensor(rollout.env_mask).bool()
        recomputed = trainer_logprobs(tag_prone, rollout, "causal")
        gaps.append((recomputed[sampled] - torch.tensor(rollout.logprobs)[sampled]).abs().max().item())
    assert max(gaps) > 1e-2  # large enough to see: this is what the importance-sampling correction covers


def test_inserted_tokens_are_masked_and_sampled_tokens_are_not(tag_prone):
    _, _, tokenizer, vocab = tag_prone
    rollouts = engine(tag_prone, max_path_tokens=6).generate(prompts(tokenizer))
    forced_closers = 0
    for r in rollouts:
        assert len(r.completion_ids) == len(r.logprobs) == len(r.env_mask)
        inserted = set()
        for block in parse(r.completion_ids, vocab).blocks:
            inserted |= {path.open_at for path in block.paths}  # every <Path>
            for path in block.paths:
                if path.closed and r.env_mask[path.end - 1] == 0:  # a closer forced on a cut path
                    inserted.add(path.end - 1)
                    forced_closers += 1
            if block.closed:  # </Parallel>, the separator and <Summary> are inserted by the join
                inserted |= set(range(block.close_at, block.close_at + 1 + len(block.separator) + 1))
            if block.summary_closed and r.env_mask[block.end - 1] == 0:
                inserted.add(block.end - 1)
        assert {i for i, m in enumerate(r.env_mask) if m == 0} == inserted & set(range(len(r.completion_ids)))
        for mask, logprob in zip(r.env_mask, r.logprobs):
            assert (logprob == 0.0) if mask == 0 else (logprob < 0.0)
    assert forced_closers > 0  # max_path_tokens=6 cuts some paths


@pytest.mark.parametrize("k", [2, 3, 4])
def test_every_block_has_k_paths_and_paths_respect_their_budget(tag_prone, k):
    _, _, tokenizer, vocab = tag_prone
    rollouts = engine(tag_prone, min_paths=k, max_paths=k, max_path_tokens=8, max_completion_length=400).generate(
        prompts(tokenizer)
    )
    blocks = 0
    for r in rollouts:
        for block in parse(r.completion_ids, vocab).blocks:
            if not block.closed:
                continue  # cut by the completion cap
            blocks += 1
            assert len(block.paths) == k
            for path in block.paths:
                assert path.closed
                assert len(path.body) <= 8  # sampled tokens of a path, its closer excluded
    assert blocks > 0


def test_block_limit_bans_new_blocks_instead_of_cutting(tag_prone):
    _, _, tokenizer, vocab = tag_prone
    unlimited = engine(tag_prone, max_blocks=10, max_completion_length=300).generate(prompts(tokenizer))
    limited = engine(tag_prone, max_blocks=1, max_completion_length=300).generate(prompts(tokenizer))
    assert max(r.blocks for r in unlimited) > 1
    for r in limited:
        assert r.blocks <= 1
        opened = r.completion_ids.count(vocab.ids[PARALLEL_OPEN])
        main_opens = len(parse(r.completion_ids, vocab).blocks)
        assert main_opens <= 1 and opened >= main_opens
    # completions that reached the limit still ended on their own EOS, not at the limit
    assert any(r.blocks == 1 and r.finish == "eos" for r in limited)
    none = engine(tag_prone, max_blocks=0).generate(prompts(tokenizer))
    assert all(parse(r.completion_ids, vocab).blocks == [] for r in none)


def test_completion_cap_holds(tag_prone):
    _, _, tokenizer, _ = tag_prone
    for cap in (1, 7, 50):
        for r in engine(tag_prone, max_completion_length=cap, max_path_tokens=30).generate(prompts(tokenizer)):
            assert len(r.completion_ids) <= cap
            assert r.finish == "eos" or len(r.completion_ids) == cap
            assert (r.finish == "eos") == (r.completion_ids[-1] == tokenizer.eos_token_id)


def test_eos_appears_only_at_the_end(tag_prone):
    _, _, tokenizer, _ = tag_prone
    for r in engine(tag_prone, max_completion_length=300).generate(prompts(tokenizer)):
        assert tokenizer.eos_token_id not in r.completion_ids[:-1]


def test_config_is_checked():
    with pytest.raises(ValueError, match="mode"):
        RolloutArguments(rollout_mode="tree")
    with pytest.raises(ValueError, match="isolated"):
        RolloutArguments(rollout_mode="sequential", attention="isolated")
    with pytest.raises(ValueError, match="min_paths must be at least 2"):
        RolloutArguments(min_paths=1, max_paths=1)
    with pytest.raises(ValueError, match="summary_temperature must be > 0"):
        RolloutArguments(summary_temperature=0.0)
    with pytest.raises(ValueError, match="summary_temperature needs the fork-join engine"):
        RolloutArguments(summary_temperature=0.5, rollout_mode="plain")


@pytest.mark.parametrize(
    "sampled, segment, tokens, finish, forced",
    [
        ([5, 6, 9], dict(stop_ids={9}), [5, 6, 9], "stop", False),
        ([5, 2], dict(end_ids={2}), [5, 2], "eos", False),
        ([5, 2], dict(end_ids={2}, closer=9), [5, 2], "eos", False),
        ([5, 6, 7], dict(closer=9), [5, 6, 7, 9], "length", True),
        ([5, 6, 7], dict(), [5, 6, 7], "length", False),
    ],
)
def test_segment_rules(sampled, segment, tokens, finish, forced):
    spec = Segment(
        stream=None, max_new=3, **{k: frozenset(v) if isinstance(v, set) else v for k, v in segment.items()}
    )
    out = finish_segment(spec, sampled, [-0.5] * len(sampled))
    assert out.tokens == tokens and out.finish == finish and finish in get_args(SegmentFinish)
    assert out.sampled[-1] is (not forced) and len(out.logprobs) == len(tokens)


def test_the_transformers_backend_ends_a_segment_with_a_segment_finish(tag_prone):
    """The transformers backend's finishes are `SegmentFinish`'s spelling: "eos" on an end id, "stop" on a stop id,
    "length" when the budget runs out (each first token forced by an allow-list)."""
    _, model, tokenizer, _ = tag_prone
    backend = TransformersBackend(model, Sampling(seed=0))
    eos, stop = tokenizer.eos_token_id, 7
    streams = backend.start(prompts(tokenizer)[:3])
    segments = [
        Segment(streams[0], max_new=4, end_ids=frozenset({eos}), only=frozenset({eos})),
        Segment(streams[1], max_new=4, stop_ids=frozenset({stop}), only=frozenset({stop})),
        Segment(streams[2], max_new=2),
    ]
    backend.submit(segments)
    ended = {}
    while len(ended) < len(segments):
        ended.update(backend.step())
    assert [ended[s].finish for s in segments] == ["eos", "stop", "length"]
    assert {decoded.finish for decoded in ended.values()} <= set(get_args(SegmentFinish))


def test_a_separator_that_is_not_whitespace_is_refused(tag_prone):
    _, _, tokenizer, vocab = tag_prone
    with pytest.raises(ValueError, match="whitespace"):
        EngineTokens(vocab, frozenset([tokenizer.eos_token_id]), tuple(tokenizer.encode("--")))
    tokens = EngineTokens.of(tokenizer, [tokenizer.eos_token_id], vocab)
    assert tokenizer.decode(tokens.separator_ids) == "\n" and tokens.vocab is vocab


RUNS = {
    "isolated-fork-2": dict(attention="isolated", rollout_mode="fork"),
    "isolated-fork-3": dict(attention="isolated", rollout_mode="fork", min_paths=3, max_paths=3),
    "tree-fork-2": dict(attention="tree", rollout_mode="fork"),
    "causal-sequential-3": dict(attention="causal", rollout_mode="sequential", min_paths=3, max_paths=3),
    "isolated-fork-2..4": dict(attention="isolated", rollout_mode="fork", min_paths=2, max_paths=4),
    "tree-fork-2..4": dict(attention="tree", rollout_mode="fork", min_paths=2, max_paths=4),
}


@pytest.mark.parametrize("name", RUNS)
def test_a_completion_does_not_depend_on_its_batch_or_schedule(tag_prone, name):
    """A completion's tokens are a function of its prompt and its seed: the same when it is decoded alone, in a
    batch in another order, or in batch-wide rounds (each stream draws from its own random numbers)."""
    _, _, tokenizer, _ = tag_prone
    batch = prompts(tokenizer)
    seeds = [1000 + i for i in range(len(batch))]
    config = dict(max_completion_length=200, max_path_tokens=16, **RUNS[name])
    together = engine(tag_prone, **config).generate(batch, seeds=seeds)
    assert sum(r.blocks for r in together) >= 3
    order = list(reversed(range(len(batch))))
    reordered = engine(tag_prone, **config).generate([batch[i] for i in order], seeds=[seeds[i] for i in order])
    rounds = engine(tag_prone, schedule="rounds", **config).generate(batch, seeds=seeds)
    for i, rollout in enumerate(together):
        (alone,) = engine(tag_prone, **config).generate([batch[i]], seeds=[seeds[i]])
        for other in (alone, reordered[order.index(i)], rounds[i]):
            assert other.completion_ids == rollout.completion_ids and other.env_mask == rollout.env_mask
            torch.testing.assert_close(torch.tensor(other.logprobs), torch.tensor(rollout.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", ["isolated", "causal"])
def test_paths_that_can_only_add_tokens_past_the_cap_end_and_no_completion_changes(tag_prone, attention, monkeypatch):
    """A block's first paths share the room left before the cap (`Room`): a path ends once all it could still add
    lies past the cap. Every completion is the same token for token as when each path runs to its own budget (its
    log-probs to 1e-5: other streams share its forwards), and fewer tokens are sampled."""
    from parallel_r1.rollout.backend import Room

    _, _, tokenizer, _ = tag_prone
    batch = prompts(tokenizer) * 2
    seeds = list(range(300, 300 + len(batch)))
    config = dict(attention=attention, rollout_mode="fork", min_paths=3, max_paths=3, max_path_tokens=80)
    config.update(max_completion_length=90)
    runs, sampled = {}, {}
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr(Room, "update", lambda room, place, produced: False)
        rollout_engine = engine(tag_prone, **config)
        counted = {"tokens": 0}
        choose = rollout_engine.backend._choose

        def counting(logits, segments, choose=choose, counted=counted):
            counted["tokens"] += len(segments)
            return choose(logits, segments)

        monkeypatch.setattr(rollout_engine.backend, "_choose", counting)
        gc.disable()  # the room refers to no segment: once the call is over, nothing holds the cache
        try:
            runs[shared], sampled[shared] = rollout_engine.generate(batch, seeds), counted["tokens"]
            assert rollout_engine.backend._pool_ref() is None
        finally:
            gc.enable()
    cut = [r for r in runs[True] if r.blocks and r.finish == "length"]
    assert len(cut) >= 3  # blocks that overflow the cap
    for with_room, without in zip(runs[True], runs[False]):
        assert with_room.completion_ids == without.completion_ids and with_room.env_mask == without.env_mask
        torch.testing.assert_close(torch.tensor(with_room.logprobs), torch.tensor(without.logprobs), atol=1e-5, rtol=0)
    assert sampled[True] < 0.9 * sampled[False]


def test_a_room_is_full_once_the_tokens_before_a_segment_and_its_own_fill_it():
    from parallel_r1.rollout.backend import Room

    room = Room(10, openers=1, produced=[0, 0, 0])
    assert not room.update(0, 3) and not room.update(1, 4)  # [<Path> 3 tokens] [<Path> 4 tokens]: 9 of 10
    assert room.update(2, 0)  # [<Path>] of the third path fills the room: nothing it writes is kept
    assert room.update(0, 9)  # the first path alone fills it
    assert room.update(1, 4) and room.update(2, 0)  # and so the later ones, whatever they have written


def test_seeds_decide_the_completions(tag_prone):
    """Other seeds, other completions; the backend's own seed (Sampling.seed) gives each call new seeds."""
    _, _, tokenizer, _ = tag_prone
    batch = prompts(tokenizer)
    first = engine(tag_prone, seed=3).generate(batch, seeds=list(range(len(batch))))
    other = engine(tag_prone, seed=3).generate(batch, seeds=list(range(100, 100 + len(batch))))
    assert [r.completion_ids for r in first] != [r.completion_ids for r in other]
    backend_engine = engine(tag_prone, seed=3)
    call_1, call_2 = backend_engine.generate(batch), backend_engine.generate(batch)
    assert [r.completion_ids for r in call_1] != [r.completion_ids for r in call_2]
    again = engine(tag_prone, seed=3).generate(batch)
    assert [r.completion_ids for r in again] == [r.completion_ids for r in call_1]


def _decisions(rollouts, vocab, widths) -> dict:
    """How often the model chose one more path and how often it closed a block, over these rollouts."""
    from parallel_r1.tags.language import PATH_OPEN, decision_points

    counts = {"more": 0, "close": 0}
    for r in rollouts:
        for i in decision_points(r.completion_ids, vocab, ParallelArguments(min_paths=widths[0], max_paths=widths[1])):
            assert r.env_mask[i] == 1 and r.logprobs[i] < 0.0  # sampled, scored
            counts["more" if r.completion_ids[i] == vocab.ids[PATH_OPEN] else "close"] += 1
    return counts


@pytest.mark.parametrize("attention, mode", [*EXACT_PAIRS, ("tree", "fork")])
@pytest.mark.parametrize("widths", [(2, 4), (3, 5)])
@pytest.mark.parametrize("max_blocks, cap", [(100, 300), (1, 300), (100, 40)])
def test_chosen_widths_are_trained_as_sampled(tag_prone, attention, mode, widths, max_blocks, cap):
    """With min_paths < max_paths the model writes each block's width (<Path> or </Parallel>); the trainer's forward
    (probe, grammar and structure from the ids) gives the sampler's log-probs on every sampled token, decisions
    included, also at the block limit and with completions cut by the cap."""
    _, _, tokenizer, vocab = tag_prone
    config = dict(attention=attention, rollout_mode=mode, min_paths=widths[0], max_paths=widths[1])
    config.update(max_blocks=max_blocks, max_completion_length=cap, max_path_tokens=12)
    rollouts = engine(tag_prone, seed=sum(widths), **config).generate(prompts(tokenizer) * 2)
    counts = _decisions(rollouts, vocab, widths)
    if cap < 100:  # cut inside blocks, with decisions made before the cut
        assert any(not parse(r.completion_ids, vocab).well_formed for r in rollouts) and sum(counts.values()) > 0
    else:
        assert counts["more"] > 0 and counts["close"] > 0, counts
    for rollout in rollouts:
        sampled = torch.tensor(rollout.env_mask).bool()
        recomputed = trainer_logprobs(tag_prone, rollout, attention, max_blocks, widths=widths)
        torch.testing.assert_close(recomputed[sampled], torch.tensor(rollout.logprobs)[sampled], atol=1e-5, rtol=0)
        for block in parse(rollout.completion_ids, vocab).blocks:
            assert len(block.paths) <= widths[1] and (not block.closed or len(block.paths) >= widths[0])


def test_an_isolated_decision_reads_every_path_and_a_late_path_reads_none(tag_prone):
    """Under the isolated structure a width decision is read by its probe, which sees every path so far: changing
    the first path changes the decision's log-prob. A path the model opened stays blind to its siblings: its
    tokens' log-probs do not move."""
    _, model, tokenizer, vocab = tag_prone
    widths = (2, 4)
    config = dict(attention="isolated", rollout_mode="fork", min_paths=2, max_paths=4, max_path_tokens=12)
    rollouts = engine(tag_prone, seed=6, max_completion_length=300, **config).generate(prompts(tokenizer) * 2)
    checked = 0
    for rollout in rollouts:
        blocks = [b for b in parse(rollout.completion_ids, vocab).blocks if b.closed and len(b.paths) > 2]
        if not blocks or len(blocks[0].paths[0].body) < 2:
            continue
        block, ids = blocks[0], list(rollout.completion_ids)
        first = block.paths[0]
        ids[first.open_at + 1] = (ids[first.open_at + 1] + 7) % 100 + 10  # another first token of path 0
        changed = type(rollout)(rollout.prompt_ids, ids, rollout.logprobs, rollout.env_mask)
        before = trainer_logprobs(tag_prone, rollout, "isolated", widths=widths)
        after = trainer_logprobs(tag_prone, changed, "isolated", widths=widths)
        decision, late = block.paths[2].open_at, block.paths[2]
        assert (before[decision] - after[decision]).abs() > 1e-4  # the probe read path 0
        in_late = slice(late.open_at + 1, late.end)  # after its <Path>, the decision
        torch.testing.assert_close(before[in_late], after[in_late], atol=1e-6, rtol=0)  # path 2 did not
        checked += 1
    assert checked > 0
