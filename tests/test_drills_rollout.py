"""Reliability drill: adversarial rollouts of the tag-prone tiny model with tiny budgets (transformers backend).

The engine's budget rules (`parallel_r1.rollout.engine`), checked on every completion of a grid of
modes x widths (min_paths, max_paths) x max_blocks x completion caps x path/summary budgets:

- the completion holds at most `max_completion_length` tokens, inserted tokens included (a block that would
  overflow is cut there); it ends on its EOS or is exactly the cap long;
- a path samples at most `max_path_tokens` tokens (its closer included when sampled), shrunk to the room left
  before the cap less one for its closer, at least one; a path cut by that budget gets an inserted `</Path>`;
  a summary the same with `max_summary_tokens` and `</Summary>`;
- at most `max_blocks` blocks are opened; every closed block has between `min_paths` and `max_paths` paths; the
  runtime opens the first `min_paths` (an inserted `<Path>`), the model the others (a sampled `<Path>`), and the
  model writes `</Parallel>` when it closes a block below `max_paths`;
- the ids parse (losslessly) to a well-formed completion when it ended on EOS, else to a prefix of one
  (only the last block is unfinished, and it completes with closers and empty paths);
- the tag grammar holds on every token; inserted tokens carry env_mask 0 and log-prob 0.0, sampled ones 1.
"""

import math

import pytest
import torch
from rollout_helpers import engine, prompts, trainer_logprobs

from parallel_r1.rollout import RolloutArguments
from parallel_r1.tags.grammar import Grammar
from parallel_r1.tags.language import (
    PARALLEL_CLOSE,
    PATH_CLOSE,
    PATH_OPEN,
    SUMMARY_CLOSE,
    SUMMARY_OPEN,
    parse,
    serialize,
    stats,
)

MODES = [("fork", "isolated"), ("fork", "causal"), ("fork", "tree"), ("sequential", "causal")]
CAPS = (1, 2, 3, 4, 5, 8, 13, 40)
BUDGETS = ((1, 1), (2, 3), (3, 2))  # (max_path_tokens, max_summary_tokens)
CUT_ERRORS = {"unclosed_path", "unclosed_block", "missing_summary", "unclosed_summary"}


pytestmark = pytest.mark.usefixtures("one_thread")


def _budget(limit: int, room: int) -> int:
    """What a path or a summary may sample when `room` tokens are left before the cap (the engine's rule)."""
    return max(1, min(limit, room - 1))


def _completed(ids: list, parsed, vocab, k: int) -> list:
    """`ids` followed by what finishes its last block: closers, empty paths up to k, an empty summary."""
    tag, suffix = vocab.ids, []
    block = parsed.blocks[-1] if parsed.blocks else None
    if block is None or block.summary_closed:
        return list(ids)
    if not block.closed:
        if block.paths and not block.paths[-1].closed:
            suffix.append(tag[PATH_CLOSE])
        suffix += [tag[PATH_OPEN], tag[PATH_CLOSE]] * max(0, k - len(block.paths))
        suffix.append(tag[PARALLEL_CLOSE])
    if block.summary is None:
        suffix.append(tag[SUMMARY_OPEN])
    return list(ids) + suffix + [tag[SUMMARY_CLOSE]]


def check_rollout(rollout, prompt, config: RolloutArguments, tokenizer, vocab, separator) -> dict:
    """Assert every rule of the module docstring on one rollout; return what it exercised."""
    ids, mask, logprobs = rollout.completion_ids, rollout.env_mask, rollout.logprobs
    cap, eos = config.max_completion_length, tokenizer.eos_token_id
    low, high = config.min_paths, config.max_paths
    where = f"{config} prompt={prompt} ids={ids} mask={mask}"
    assert rollout.prompt_ids == prompt, where
    # the completion cap, inserted tokens included; a completion ends on its EOS or at the cap
    assert len(ids) == len(mask) == len(logprobs), where
    assert 1 <= len(ids) <= cap, where
    if rollout.finish == "eos":
        assert ids[-1] == eos and mask[-1] == 1, where
    else:
        assert rollout.finish == "length" and len(ids) == cap, where
    assert eos not in ids[:-1], where
    # masks and log-probs: inserted tokens 0 and 0.0, sampled tokens 1 and a finite log-prob <= 0
    for m, logprob in zip(mask, logprobs):
        assert m in (0, 1), where
        assert logprob == 0.0 if m == 0 else (math.isfinite(logprob) and logprob <= 0.0), where
    # the ids parse, losslessly, under the grammar the sampler used
    parsed = parse(ids, vocab)
    assert serialize(parsed, vocab) == tuple(ids), where
    grammar = Grammar(vocab, frozenset({eos}), config.max_blocks, low, high)
    assert grammar.violations(ids) == [], where
    if rollout.finish == "eos":
        assert parsed.well_formed, (parsed.errors, where)
    else:
        assert {e.code for e in parsed.errors} <= CUT_ERRORS, (parsed.errors, where)
        assert parse(_completed(ids, parsed, vocab, low), vocab).well_formed, where  # a valid prefix
    # blocks: at most max_blocks, min_paths..max_paths paths each, only the last one unfinished (and only at the cap)
    blocks = parsed.blocks
    closed = [b for b in blocks if b.closed]
    assert len(blocks) <= config.max_blocks, where
    assert len(closed) <= rollout.blocks <= len(blocks), where
    if config.max_blocks == 0:
        assert not set(ids) & set(vocab.ids.values()), where
    for block in blocks[:-1]:
        assert block.closed and block.summary_closed, where
    for block in blocks:
        assert low <= len(block.paths) <= high if block.closed else len(block.paths) <= high, where
        assert block.summary_closed or rollout.finish == "length", where
        assert block.tail == () and mask[block.start] == 1, where
    shape = stats(parsed)
    assert shape.num_blocks == len(blocks) and shape.total == len(ids), where
    assert shape.paths_per_block == tuple(len(b.paths) for b in blocks), where
    # budgets and masks inside each block
    seen = dict(blocks=len(blocks), cut_blocks=0, forced_paths=0, forced_summaries=0, eos=rollout.finish == "eos")
    seen["widths"] = {len(b.paths) for b in blocks if b.closed}
    inserted = set()
    for block in blocks:
        seen["cut_blocks"] += not block.summary_closed
        for p, path in enumerate(block.paths):
            chosen = p >= low  # the model opened it: its <Path> is a sampled width decision
            assert path.lead == () and mask[path.open_at] == int(chosen), where
            if not chosen:
                inserted.add(path.open_at)
            body = range(path.open_at + 1, path.end - path.closed)
            assert all(mask[i] == 1 for i in body), where  # nothing is inserted inside a path but its closer
            sampled = sum(mask[path.open_at + 1 : path.end])
            if chosen:  # decoded alone, after the decision that opened it
                room = cap - path.open_at - 1
            else:
                room = cap - (block.opener_end if config.rollout_mode == "fork" else path.open_at)
            budget = _budget(config.max_path_tokens, room)
            assert len(path.body) <= config.max_path_tokens and sampled <= budget, where
            if path.closed and mask[path.end - 1] == 0:  # a closer forced when the budget ran out
                assert sampled == budget, where
                seen["forced_paths"] += 1
        if block.closed:
            assert block.separator == tuple(separator)[: len(block.separator)], where
            model_closed = len(block.paths) < high  # the model's </Parallel>, a sampled width decision
            assert mask[block.close_at] == int(model_closed), where
            first = block.close_at + model_closed
            inserted |= set(range(first, min(block.close_at + 2 + len(separator), len(ids))))
        if block.summary is not None:
            opener = block.close_at + 1 + len(separator)
            assert ids[opener] == vocab.ids[SUMMARY_OPEN], where
            summary_end = block.end - block.summary_closed
            assert all(mask[i] == 1 for i in range(opener + 1, summary_end)), where
            sampled = sum(mask[opener + 1 : block.end])
            budget = _budget(config.max_summary_tokens, cap - opener - 1)
            assert len(block.summary) <= config.max_summary_tokens and sampled <= budget, where
            if block.summary_closed and mask[block.end - 1] == 0:
                assert sampled == budget, where
                seen["forced_summaries"] += 1
    # everything else (main text, <Parallel>, sampled closers) was sampled
    closers = {b.end - 1 for b in blocks if b.summary_closed} | {
        p.end - 1 for b in blocks for p in b.paths if p.closed
    }
    for i, m in enumerate(mask):
        if i not in closers:
            assert m == (0 if i in inserted else 1), (i, where)
    return seen


def run_and_check(tag_prone, kv_reuse="full", seed=0, **config) -> tuple:
    """Sample the helpers' prompts under `config`, check every rollout, sum what they exercised."""
    _, _, tokenizer, vocab = tag_prone
    batch = prompts(tokenizer)
    rollout_engine = engine(tag_prone, kv_reuse, 1.0, seed, **config)
    rollouts = rollout_engine.generate(batch)
    assert len(rollouts) == len(batch)
    totals = dict(blocks=0, cut_blocks=0, forced_paths=0, forced_summaries=0, eos=0, widths=set())
    for prompt, rollout in zip(batch, rollouts):
        seen = check_rollout(rollout, prompt, rollout_engine.config, tokenizer, vocab, rollout_engine.separator)
        for key, value in seen.items():
            totals[key] = totals[key] | value if key == "widths" else totals[key] + value
    return rollouts, totals


@pytest.mark.parametrize("max_blocks", [0, 1, 8])
@pytest.mark.parametrize("widths", [(2, 2), (3, 3), (8, 8), (2, 4)])
@pytest.mark.parametrize("mode, attention", MODES)
def test_tiny_budgets_hold_on_every_completion(tag_prone, mode, attention, widths, max_blocks):
    """Every cap in 1..5 (and 8, 13, 40) with path/summary budgets of 1-3: no exception, every rule holds."""
    totals = dict(blocks=0, cut_blocks=0, forced_paths=0, forced_summaries=0, eos=0, widths=set())
    for cap in CAPS:
        for max_path_tokens, max_summary_tokens in BUDGETS if max_blocks else BUDGETS[:1]:
            config = dict(
                rollout_mode=mode,
                attention=attention,
                min_paths=widths[0],
                max_paths=widths[1],
                max_blocks=max_blocks,
                max_completion_length=cap,
                max_path_tokens=max_path_tokens,
                max_summary_tokens=max_summary_tokens,
            )
            _, seen = run_and_check(tag_prone, seed=100 * cap + 10 * max_path_tokens + max_summary_tokens, **config)
            for key, value in seen.items():
                totals[key] = totals[key] | value if key == "widths" else totals[key] + value
    # the grid is adversarial: it opens blocks, cuts them at the cap, forces closers, and still ends on EOS
    assert totals["eos"] > 0
    if max_blocks:
        assert totals["blocks"] > 0 and totals["cut_blocks"] > 0 and totals["forced_paths"] > 0
        assert len(totals["widths"]) > 1 if widths[0] < widths[1] else totals["widths"] <= {widths[0]}
    else:
        assert totals["blocks"] == 0


@pytest.mark.parametrize("widths", [(2, 2), (8, 8), (2, 5)])
@pytest.mark.parametrize("mode, attention", MODES)
def test_kv_reuse_changes_nothing_under_tiny_budgets(tag_prone, mode, attention, widths):
    """Re-prefilling per request or at every token samples the same ids and masks, cut blocks included."""
    for cap in (1, 3, 5, 13, 40):
        config = dict(rollout_mode=mode, attention=attention, max_blocks=8, max_completion_length=cap)
        config.update(min_paths=widths[0], max_paths=widths[1])
        config.update(max_path_tokens=1, max_summary_tokens=1)
        runs = [run_and_check(tag_prone, reuse, seed=cap, **config)[0] for reuse in ("full", "per_request", "none")]
        for full, per_request, naive in zip(*runs):
            assert full.completion_ids == per_request.completion_ids == naive.completion_ids, (cap, config)
            assert full.env_mask == per_request.env_mask == naive.env_mask, (cap, config)


@pytest.mark.parametrize("mode, attention", [("fork", "isolated"), ("sequential", "causal"), ("fork", "tree")])
@pytest.mark.parametrize("widths", [(2, 2), (8, 8), (2, 4)])
def test_cut_completions_are_trained_as_sampled(tag_prone, mode, attention, widths):
    """The exact pairs on completions cut inside a block: the trainer's log-probs, recomputed from the ids (structure
    and grammar), are the sampler's on every sampled token."""
    cut = 0
    for cap, max_blocks in ((3, 8), (5, 1), (13, 8), (40, 1), (40, 8)):
        config = dict(rollout_mode=mode, attention=attention, max_blocks=max_blocks, max_completion_length=cap)
        config.update(min_paths=widths[0], max_paths=widths[1])
        config.update(max_path_tokens=2, max_summary_tokens=1)
        rollouts, seen = run_and_check(tag_prone, seed=cap + max_blocks, **config)
        cut += seen["cut_blocks"]
        for rollout in rollouts:
            sampled = torch.tensor(rollout.env_mask).bool()
            recomputed = trainer_logprobs(tag_prone, rollout, attention, max_blocks, widths=widths)
            expected = torch.tensor(rollout.logprobs)[sampled]
            torch.testing.assert_close(recomputed[sampled], expected, atol=1e-5, rtol=0)
    assert cut > 0


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("min_paths", 1, "min_paths"),
        ("min_paths", 0, "min_paths"),
        ("max_paths", 1, "max_paths"),
        ("max_blocks", -1, "max_blocks"),
        ("max_completion_length", 0, "max_completion_length"),
        ("max_path_tokens", 0, "max_path_tokens"),
        ("max_summary_tokens", 0, "max_summary_tokens"),
    ],
)
def test_budgets_below_the_minimum_are_refused(field, value, match):
    """A budget the engine cannot honour (no token, fewer than two paths, negative blocks) is refused up front."""
    with pytest.raises(ValueError, match=match):
        RolloutArguments(**{field: value})
