"""Key/value rows shared by reference: the cache of the transformers backend.

A row holds the keys and values of one completion, one slot per token read, in the order the tokens were read.
RoPE is applied at each token's own position before its key is stored, so where a slot sits in its row says
nothing about the token's position. Every stream of the completion reads the same row: its main text, the paths
of a block, the summary after them, a width decision's probe. Each stream reads it through its own set of
visible slots: a fork copies the set, a join unites the sets. So a fork or a join copies no key or value.

One model forward reads the pending tokens of many streams at once, flattened into one sequence of T tokens, each
with its row, its slot and the slots it may see. `fork_join_attention`, registered with transformers as the
attention implementation "parallel_r1_fork_join", writes the new keys and values into their slots and lets every
query attend to the slots it sees. The rows are attended as views of the pool: no key or value is gathered.

The pool grows its rows by half, or at once by what a batch of new completions needs, and doubles its slots (each a
copy of what it holds). A finished completion's row is free as soon as no stream refers to it, and a new row takes
its place. When most rows below the highest one in use are free, the live rows move down (`compact`). The pool
reports the bytes these moves and growths copy (`on_copy`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

ATTENTION = "parallel_r1_fork_join"
SMALL = 8  # a row with at most this many queries in a forward is attended with the others in one batched call


class Row:
    """One completion's slots in a pool: `index` (its place, which `KVPool.compact` may change) and `used`."""

    __slots__ = ("pool", "index", "used", "__weakref__")

    def __init__(self, pool: KVPool, index: int):
        self.pool, self.index, self.used = pool, index, 0


class KVPool:
    """Per layer, keys and values of shape [rows, kv_heads, slots, head_dim], in the model's dtype and device.
    `on_copy(bytes)` hears of every copy (growth, compaction)."""

    def __init__(self, model, rows: int, slots: int, on_copy=None):
        config = model.config.get_text_config()
        parameter = next(model.parameters())
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.layers = config.num_hidden_layers
        self.dtype, self.device = parameter.dtype, parameter.device
        self.keys = [self._empty(rows, slots) for _ in range(self.layers)]
        self.values = [self._empty(rows, slots) for _ in range(self.layers)]
        self._rows: list[weakref.ref] = []  # by index: the row there, if it is still referred to
        self._on_copy = on_copy or (lambda count: None)

    def _empty(self, rows: int, slots: int) -> torch.Tensor:
        return torch.zeros(rows, self.kv_heads, slots, self.head_dim, dtype=self.dtype, device=self.device)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot over every layer, keys and values."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.keys[0].element_size()

    @property
    def capacity(self) -> tuple[int, int]:
        return self.keys[0].shape[0], self.keys[0].shape[2]

    def live(self) -> list[Row]:
        return [row for row in (ref() for ref in self._rows) if row is not None]

    def new_row(self) -> Row:
        """A row with no slot used: the lowest free index, else a new one (the pool grows by half if it is full)."""
        index = next((i for i, ref in enumerate(self._rows) if ref() is None), len(self._rows))
        if index == len(self._rows):
            self._rows.append(None)
        if index >= self.capacity[0]:
            self._grow(rows=self.capacity[0] + max(1, self.capacity[0] // 2))
        row = Row(self, index)
        self._rows[index] = weakref.ref(row)
        return row

    def make_room(self, rows: int) -> None:
        """Room for `rows` more rows, in one growth if the free ones are too few (a batch starting at once), and a
        growth is by half at least."""
        free = self.capacity[0] - len(self._rows) + sum(ref() is None for ref in self._rows)
        if rows > free:
            self._grow(rows=self.capacity[0] + max(rows - free, self.capacity[0] // 2))

    def reserve(self, row: Row, count: int) -> int:
        """`count` new slots at the end of `row` (the pool doubles its slots if needed); the first one's index."""
        first, row.used = row.used, row.used + count
        if row.used > self.capacity[1]:
            slots = self.capacity[1]
            while slots < row.used:
                slots *= 2
            self._grow(slots=slots)
        return first

    def _grow(self, rows: int | None = None, slots: int | None = None) -> None:
        old_rows, old_slots = self.capacity
        rows, slots = rows or old_rows, slots or old_slots
        for tensors in (self.keys, self.values):
            for layer, old in enumerate(tensors):
                tensors[layer] = self._empty(rows, slots)
                tensors[layer][:old_rows, :, :old_slots] = old
        self._on_copy(old_rows * old_slots * self.slot_bytes)

    def compact(self) -> None:
        """Move the live rows to the lowest indices when they fill less than half of the span in use."""
        while self._rows and self._rows[-1]() is None:
            self._rows.pop()
        live = self.live()
        if len(self._rows) <= max(8, 2 * len(live)):
            return
        for target, row in enumerate(sorted(live, key=lambda row: row.index)):
            if row.index != target:
                for tensors in (self.keys, self.values):
                    for layer in tensors:
                        layer[target, :, : row.used] = layer[row.index, :, : row.used]
                self._on_copy(row.used * self.slot_bytes)
                row.index = target
        self._rows = [weakref.ref(row) for row in sorted(live, key=lambda row: row.index)]


@dataclass
class _Group:
    """Queries attended in one call: the rows `start:stop` of the pool, up to slot `length`, S queries a row."""

    tokens: torch.Tensor  # [n] positions in the forward's sequence
    rows: torch.Tensor  # [n] row - start
    queries: torch.Tensor  # [n] the query's place among its row's
    start: int
    stop: int
    width: int  # S
    length: int
    mask: torch.Tensor  # [stop - start, 1, S, length] bool: True where the query sees the slot


@dataclass
class ForwardPlan:
    """Where each of a forward's T tokens goes (`rows`, `slots`: [T]) and how its queries are attended."""

    pool: KVPool
    rows: torch.Tensor
    slots: torch.Tensor
    groups: list


def plan_forward(pool: KVPool, rows: list[Row], slots: list[int], visible: torch.Tensor) -> ForwardPlan:
    """The plan of a forward over tokens that go to `rows[t]`, slot `slots[t]`, and see the slots where
    `visible[t]` (bool [T, L], L at least every row's used slots) is True.

    Rows with at most SMALL queries are attended together in one call over the pool's rows between the lowest and
    the highest of them (the others get a query that sees slot 0, and nothing is read from it). A row with more
    (a prompt, a context read again) is attended alone, unless such rows are many and alike in size."""
    device = pool.device
    by_row: dict[int, list[int]] = {}
    for t, row in enumerate(rows):
        by_row.setdefault(row.index, []).append(t)
    used = {row.index: row.used for row in rows}
    small = [index for index, tokens in by_row.items() if len(tokens) <= SMALL]
    large = [index for index, tokens in by_row.items() if len(tokens) > SMALL]
    groups = [_group(small, by_row, used, visible, device)] if small else []
    if large:
        span = max(large) - min(large) + 1
        width = max(len(by_row[index]) for index in large)
        if len(large) * 2 >= span and width * len(large) <= 2 * sum(len(by_row[index]) for index in large):
            groups.append(_group(large, by_row, used, visible, device))
        else:
            groups += [_group([index], by_row, used, visible, device) for index in large]
    index = torch.tensor([row.index for row in rows], device=device)
    return ForwardPlan(pool, index, torch.tensor(slots, device=device), groups)


def _group(indices: list[int], by_row: dict, used: dict, visible: torch.Tensor, device) -> _Group:
    start, stop = min(indices), max(indices) + 1
    width = max(len(by_row[index]) for index in indices)
    length = max(used[index] for index in indices)
    tokens, rows, queries = [], [], []
    for index in indices:
        for query, t in enumerate(by_row[index]):
            tokens.append(t)
            rows.append(index - start)
            queries.append(query)
    tokens, rows, queries = (torch.tensor(values, device=device) for values in (tokens, rows, queries))
    mask = torch.zeros(stop - start, 1, width, length, dtype=torch.bool, device=device)
    mask[..., 0] = True  # a query that stands for nothing sees one slot, so that its row of weights is defined
    mask[rows, 0, queries] = visible[tokens.to(visible.device), :length].to(device)
    return _Group(tokens, rows, queries, start, stop, width, length, mask)


def fork_join_attention(module, query, key, value, attention_mask, scaling=None, fork_join=None, **kwargs):
    """Store the forward's keys and values in their slots, then attend each query to the slots it sees.

    query: [1, heads, T, head_dim]; key, value: [1, kv_heads, T, head_dim]. Returns [1, T, heads, head_dim]."""
    if fork_join is None:
        raise RuntimeError(f"attention {ATTENTION!r} needs the forward's plan (fork_join=...)")
    plan = fork_join
    keys, values = plan.pool.keys[module.layer_idx], plan.pool.values[module.layer_idx]
    keys[plan.rows, :, plan.slots] = key[0].transpose(0, 1).to(keys.dtype)
    values[plan.rows, :, plan.slots] = value[0].transpose(0, 1).to(values.dtype)
    queries = query[0].transpose(0, 1)  # [T, heads, head_dim]
    out = torch.empty_like(queries)
    for group in plan.groups:
        grid = queries.new_zeros(group.stop - group.start, queries.shape[1], group.width, queries.shape[2])
        grid[group.rows, :, group.queries] = queries[group.tokens]
        attended = torch.nn.functional.scaled_dot_product_attention(
            grid,
            keys[group.start : group.stop, :, : group.length],
            values[group.start : group.stop, :, : group.length],
            attn_mask=group.mask,
            scale=scaling,
            enable_gqa=True,
        )
        out[group.tokens] = attended[group.rows, :, group.queries]
    return out.unsqueeze(0), None


AttentionInterface.register(ATTENTION, fork_join_attention)
