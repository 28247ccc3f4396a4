"""Reward functions by name, as recipes write them.

A recipe lists reward specs, each a registered name or a schedule call whose arguments are specs and whose
keywords are integer literals, e.g.

    reward_funcs: [accuracy, parallel_bonus]
    reward_funcs: ["alternating(accuracy, tiered, window=10, a_steps=8)"]
    reward_funcs: ["switch(alternating(accuracy, tiered), accuracy, at_step=200)"]

Specs are read with `ast` (never evaluated); anything else is a ValueError that names the problem.
"""

from __future__ import annotations

import ast
import functools
from types import SimpleNamespace

from ..tags.language import MIN_PATHS
from ..tags.tokens import has_parallel_tokens, tag_vocab
from .schedules import alternating, switch
from .variants import REWARDS

SCHEDULES = {"alternating": alternating, "switch": switch}
NO_RUN = SimpleNamespace(min_paths=MIN_PATHS, optimizer_steps_per_generation=1)  # rewards built outside a run


def get_reward_funcs(specs: list, tokenizer=None, args=NO_RUN) -> list:
    """The reward functions for `specs` (names or schedule calls; callables pass through unchanged).

    With a `tokenizer` that has the six tags, rewards read each completion's structure from the ids TRL
    passes (`completion_ids`); without one (or without the tags) from its text.
    `args` is the run's config (`ParallelGRPOConfig`): schedules count its generations, each
    `optimizer_steps_per_generation` optimizer steps (see `schedules`), and `path_cost` charges the paths past its
    `min_paths`. Without it (`NO_RUN`: rewards outside a run) a generation is one step and `min_paths` is `MIN_PATHS`,
    the least a block holds.
    """
    tags = (None, None)
    if tokenizer is not None and has_parallel_tokens(tokenizer):
        tags = (tag_vocab(tokenizer), functools.partial(tokenizer.decode, skip_special_tokens=True))
    return [spec if callable(spec) else _build_spec(spec, tags, args) for spec in specs]


def _build_spec(spec, tags, args):
    if not isinstance(spec, str):
        raise ValueError(f"a reward spec must be a name or a schedule call, got {spec!r}")
    try:
        tree = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"reward spec {spec!r} does not parse: {error.msg}") from None
    return _build(tree, spec, tags, args)


def _build(node, spec, tags, args):
    if isinstance(node, ast.Name):
        if node.id not in REWARDS:
            raise ValueError(f"unknown reward {node.id!r} in {spec!r}; known rewards: {', '.join(REWARDS)}")
        return REWARDS[node.id].bound(*tags, args.min_paths)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SCHEDULES:
        rewards = [_build(arg, spec, tags, args) for arg in node.args]
        options = {}
        for keyword in node.keywords:
            try:
                options[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                raise ValueError(f"schedule options must be written name=integer, in {spec!r}") from None
            if keyword.arg is None:
                raise ValueError(f"schedule options must be written name=integer, in {spec!r}")
        if len(rewards) != 2:
            raise ValueError(f"{node.func.id} takes two rewards, got {len(rewards)} in {spec!r}")
        try:
            return SCHEDULES[node.func.id](*rewards, **options, steps_per_batch=args.optimizer_steps_per_generation)
        except TypeError as error:
            raise ValueError(f"bad options for {node.func.id} in {spec!r}: {error}") from None
    raise ValueError(
        f"reward spec {spec!r}: expected a reward name or a call of {', '.join(SCHEDULES)}; "
        f"known rewards: {', '.join(REWARDS)}"
    )
