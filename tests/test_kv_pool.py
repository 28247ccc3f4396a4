"""The transformers backend's cache and schedule: rows shared by reference, freed and compacted; each completion
decoded on its own critical path."""

import gc

import pytest
import torch
from rollout_helpers import engine, prompts

from parallel_r1.rollout import Segment
from parallel_r1.rollout.kv_pool import KVPool
from parallel_r1.tags.language import parse


def decode(backend, segments: list) -> dict:
    """Submit `segments` and step until every one has ended."""
    backend.submit(segments)
    done = {}
    while len(done) < len(segments):
        done.update(backend.step())
    return done


def test_a_freed_row_is_reused_and_compaction_keeps_every_live_rows_slots(tag_prone):
    _, model, _, _ = tag_prone
    copied = []
    pool = KVPool(model, 2, 4, on_copy=copied.append)
    rows = [pool.new_row() for _ in range(20)]  # 2, 3, 4, 6, 9, 13, 19, 28 rows: a copy each time
    assert pool.capacity[0] == 28 and len(copied) == 7
    for row in rows:
        first = pool.reserve(row, 3)
        for layer in pool.keys:
            layer[row.index, :, first : first + 3] = row.index  # a row's slots hold its own index
    kept = [rows[3], rows[17]]
    del rows, row
    gc.collect()
    new = pool.new_row()
    assert new.index == 0  # the lowest free index
    copied.clear()
    pool.compact()  # 3 live rows (two kept, one new) in a span of 20: the kept ones move down
    assert [new.index, kept[0].index, kept[1].index] == [0, 1, 2]
    assert copied == [3 * pool.slot_bytes, 3 * pool.slot_bytes]  # each moved row's used slots, nothing else
    for kept_row, value in zip(kept, (3, 17)):
        assert all((layer[kept_row.index, :, :3] == value).all() for layer in pool.keys)


def test_slots_grow_by_doubling_and_keep_what_they_hold(tag_prone):
    _, model, _, _ = tag_prone
    pool = KVPool(model, 2, 4)
    row = pool.new_row()
    pool.reserve(row, 3)
    pool.keys[0][row.index, :, :3] = 7.0
    assert pool.reserve(row, 10) == 3 and pool.capacity[1] == 16 and row.used == 13
    assert (pool.keys[0][row.index, :, :3] == 7.0).all()


def test_a_batch_of_new_completions_grows_the_pool_once(tag_prone):
    """Rows one at a time grow the pool by half again and again (each growth a copy of all it holds); the backend
    makes room for a submitted batch's new completions in one growth, and a later batch uses the freed rows."""
    _, model, tokenizer, _ = tag_prone
    from parallel_r1.rollout import Sampling, TransformersBackend

    copied = []
    pool = KVPool(model, 2, 4, on_copy=copied.append)
    pool.make_room(30)
    assert pool.capacity[0] == 30 and len(copied) == 1
    pool.make_room(30)  # there is room already
    assert len(copied) == 1
    backend = TransformersBackend(model, Sampling(temperature=1.0))
    streams = backend.start([tokenizer.encode(f"What is {i}+{i}?") for i in range(40)], seeds=list(range(40)))
    decode(backend, [Segment(stream, max_new=2) for stream in streams])
    pool = streams[0].row.pool
    assert pool.capacity == (40, 256)  # from its first row to 40, once: that row's slots were the only copy
    assert backend.copied_bytes == 256 * pool.slot_bytes
    rows = {stream.row.index for stream in streams}
    for stream in streams:
        backend.release(stream)
    del streams, stream
    gc.collect()
    again = backend.start([tokenizer.encode("What is 1+1?")] * 40, seeds=list(range(40)))
    decode(backend, [Segment(stream, max_new=2) for stream in again])
    assert {stream.row.index for stream in again} == rows  # the freed rows
    assert backend.copied_bytes == 256 * pool.slot_bytes  # and no growth


def test_forks_and_joins_share_the_completions_row(tag_prone):
    """No key or value is copied by a fork or a join: every stream of a completion reads the same row through
    its own set of visible slots."""
    _, model, tokenizer, _ = tag_prone
    from parallel_r1.rollout import Sampling, TransformersBackend

    backend = TransformersBackend(model, Sampling(temperature=1.0))
    (parent,) = backend.start([tokenizer.encode("What is 2+2?")], seeds=[0])
    decode(backend, [Segment(parent, max_new=3)])
    children = backend.fork(parent, 2, isolated=True)
    for child in children:
        backend.append(child, [5])
    decode(backend, [Segment(child, max_new=4) for child in children])
    merged = backend.join(parent, children, isolated=True)
    assert parent.row is children[0].row is children[1].row is merged.row
    own = [set(c.sees.nonzero().flatten().tolist()) - set(parent.sees.nonzero().flatten().tolist()) for c in children]
    assert own[0] and own[1] and not own[0] & own[1]  # each path sees its own slots, not its sibling's
    assert set(merged.sees.nonzero().flatten().tolist()) >= own[0] | own[1]  # the summary sees both


def test_every_query_attends_to_exactly_the_slots_it_sees(tag_prone):
    """A forward mixing single decoding steps, a block's paths (2 and 3 queries in rows far apart), a row that reads
    nothing and a long read (12 queries): whichever call attends a query, its output is the softmax over exactly the
    slots it sees, and its key and value are stored in its slot."""
    from types import SimpleNamespace

    from parallel_r1.rollout.kv_pool import fork_join_attention, plan_forward

    _, model, _, _ = tag_prone
    torch.manual_seed(0)
    pool = KVPool(model, 2, 8)
    rows = [pool.new_row() for _ in range(40)]
    counts = {index: 1 for index in range(40)} | {3: 2, 31: 3, 17: 12, 20: 0}
    tokens, slots = [], []
    for row in rows:
        pool.reserve(row, 30 + row.index)  # what each row held before, of unequal lengths
        first = pool.reserve(row, counts[row.index])
        tokens += [row] * counts[row.index]
        slots += range(first, first + counts[row.index])
    for layer in pool.keys + pool.values:
        layer.normal_()
    length = max(row.used for row in rows)
    visible = torch.rand(len(tokens), length) < 0.6
    visible[torch.arange(len(tokens)), torch.tensor(slots)] = True  # a token sees itself
    for t, row in enumerate(tokens):
        visible[t, row.used :] = False
    plan = plan_forward(pool, tokens, slots, visible)
    assert sorted(group.width for group in plan.groups) == [3, 12]  # the long read alone

    heads, kv_heads, dim = 4, pool.kv_heads, pool.head_dim
    query, key, value = (torch.randn(1, n, len(tokens), dim) for n in (heads, kv_heads, kv_heads))
    out, _ = fork_join_attention(SimpleNamespace(layer_idx=0), query, key, value, None, scaling=0.125, fork_join=plan)
    for t, row in enumerate(tokens):
        assert torch.equal(pool.keys[0][row.index, :, slots[t]], key[0, :, t])  # the new key is in its slot
        seen = visible[t].nonzero().flatten()
        keys = pool.keys[0][row.index][:, seen].repeat_interleave(heads // kv_heads, 0)  # [heads, seen, dim]
        values = pool.values[0][row.index][:, seen].repeat_interleave(heads // kv_heads, 0)
        weights = torch.softmax(torch.einsum("hd,hsd->hs", query[0, :, t], keys) * 0.125, -1)
        torch.testing.assert_close(out[0, t], torch.einsum("hs,hsd->hd", weights, values), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["fork", "sequential"])
def test_each_completion_is_decoded_on_its_own_critical_path(tag_prone, mode):
    """Per-completion scheduling makes about as many forwards as the longest critical path (sampled tokens one
    after another, the first paths of a block at once), and fewer than batch-wide rounds."""
    _, _, tokenizer, vocab = tag_prone
    settings = dict(attention="isolated" if mode == "fork" else "causal", rollout_mode=mode)
    settings.update(max_completion_length=300, max_path_tokens=40, max_blocks=3)
    batch = prompts(tokenizer) * 4
    seeds = list(range(len(batch)))
    forwards = {}
    for schedule in ("per_completion", "rounds"):
        rollout_engine = engine(tag_prone, schedule=schedule, **settings)
        rollouts = rollout_engine.generate(batch, seeds)
        forwards[schedule] = rollout_engine.backend.forwards
    assert sum(r.blocks for r in rollouts) >= 6
    longest = max(critical_steps(r, vocab, concurrent=mode == "fork") for r in rollouts)
    assert longest <= forwards["per_completion"] <= longest + 2
    assert forwards["rounds"] > 1.25 * forwards["per_completion"]


def critical_steps(rollout, vocab, concurrent: bool) -> int:
    """Sampled tokens one after another: in fork mode a block's paths are decoded at once."""
    sampled, saved = rollout.env_mask, 0
    if concurrent:
        for block in parse(rollout.completion_ids, vocab).blocks:
            counts = [sum(sampled[p.start : p.end]) for p in block.paths]
            saved += sum(counts) - max(counts, default=0)
    return sum(sampled) - saved


def test_a_long_prompt_is_read_over_several_forwards_with_the_same_result(tag_prone):
    """`max_step_tokens` splits a read; what is sampled does not change."""
    _, model, tokenizer, _ = tag_prone
    from parallel_r1.rollout import EngineTokens, ForkJoinEngine, RolloutArguments, Sampling, TransformersBackend

    tokens = EngineTokens.of(tokenizer, [tokenizer.eos_token_id], tag_prone[3])
    config = RolloutArguments(max_completion_length=60, max_path_tokens=12)
    batch = [tokenizer.encode(" count the apples" * 12)] * 3 + prompts(tokenizer)
    runs = {}
    for budget in (8192, 7):
        backend = TransformersBackend(model, Sampling(temperature=1.0), max_step_tokens=budget)
        engine = ForkJoinEngine(backend, tokens, tokens.grammar(config), config)
        runs[budget] = engine.generate(batch, list(range(len(batch))))
    assert [r.completion_ids for r in runs[7]] == [r.completion_ids for r in runs[8192]]
    with pytest.raises(ValueError, match="max_step_tokens"):
        TransformersBackend(model, max_step_tokens=0)


def test_a_window_bounds_the_rows_of_a_plain_decode(tag_prone):
    """`plain_decode(window=w)` decodes at most w of its 48 prompts at once, and the cache holds rows for at most 2w
    (the w decoding, and those that ended in the last step until they are let go), not one per prompt."""
    _, model, tokenizer, _ = tag_prone
    from parallel_r1.rollout import Sampling, TransformersBackend, plain_decode

    backend = TransformersBackend(model, Sampling(temperature=1.0))
    live, capacity = 0, 0
    for _ in plain_decode(backend, prompts(tokenizer) * 4, 12, [tokenizer.eos_token_id], window=3):
        assert len(backend._active) <= 3
        live = max(live, len(backend._pool_ref().live()))
        capacity = max(capacity, backend._pool_ref().capacity[0])
    assert live <= 6 and capacity <= 9  # rows grow by half: 1, 2, 3, 4, 6, 9


def test_a_call_that_fails_leaves_nothing_behind(tag_prone):
    """A forward that raises (an out-of-memory, say) ends the call; the backend keeps no segment, read or row of it,
    and the next call samples as a fresh backend would."""
    _, model, tokenizer, _ = tag_prone
    rollout_engine = engine(tag_prone, max_completion_length=60)
    calls = {"n": 0}

    def fail_on_the_tenth(module, args, kwargs):
        calls["n"] += 1
        if calls["n"] == 10:
            raise RuntimeError("out of memory (simulated)")

    hook = model.register_forward_pre_hook(fail_on_the_tenth, with_kwargs=True)
    try:
        with pytest.raises(RuntimeError, match="simulated"):
            rollout_engine.generate(prompts(tokenizer), list(range(12)))
    finally:
        hook.remove()
    backend = rollout_engine.backend
    gc.collect()
    assert not backend._active and not backend._reads and backend._pool_ref() is None
    again = rollout_engine.generate(prompts(tokenizer), list(range(12)))
    fresh = engine(tag_prone, max_completion_length=60).generate(prompts(tokenizer), list(range(12)))
    assert [r.completion_ids for r in again] == [r.completion_ids for r in fresh]
