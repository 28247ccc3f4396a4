"""Shared by the rollout tests: drive the engine on the tag-prone tiny model, recompute log-probs."""

import torch

from parallel_r1.rollout import EngineTokens, ForkJoinEngine, RolloutArguments, Sampling, TransformersBackend
from parallel_r1.structure import IsolatedForward, TreeForward
from parallel_r1.tags.grammar import Grammar, GrammarForward

QUESTIONS = [
    "What is 2+2?",
    "A farmer has 3 cows and 4 hens. How many legs are there?",
    "x",
    "Compute 17*3 please.",
    "Tell me.",
    "a b c d e f",
    "If a train leaves at 3 and arrives at 7, how long is the trip?",
    "Sum the first ten odd numbers.",
    "Why?",
    "There are 12 apples and 5 pears in a basket; 4 apples are eaten.",
    "9 * 8 - 7",
    "Which is larger, 2/3 or 3/5?",
]


def engine(setup, kv_reuse="full", temperature=1.0, seed=0, schedule="per_completion", **config):
    _, model, tokenizer, vocab = setup
    config = {"max_completion_length": 120, "max_path_tokens": 24, "max_summary_tokens": 16, **config}
    backend = TransformersBackend(model, Sampling(temperature=temperature, seed=seed), kv_reuse)
    tokens = EngineTokens.of(tokenizer, [tokenizer.eos_token_id], vocab)
    settings = RolloutArguments(**config)
    return ForkJoinEngine(backend, tokens, tokens.grammar(settings), settings, schedule)


def prompts(tokenizer):
    return [tokenizer.encode(q, add_special_tokens=False) for q in QUESTIONS]


def trainer_logprobs(
    setup, rollout, attention, max_blocks=4, grammar=True, widths=(2, 2), temperature=1.0, summary_temperature=None
):
    """The log-probs the trainer computes from the ids alone, with the trainer's own forward: structure (for
    `attention`: "isolated", "tree", "causal"; True and False mean "isolated" and "causal") and grammar (for this
    `max_blocks` and `widths`, min and max paths) recomputed from the ids, at `temperature` (a summary's tokens at
    `summary_temperature`, when set). `grammar=False`: the raw model distribution."""
    _, model, tokenizer, vocab = setup
    attention = {True: "isolated", False: "causal"}.get(attention, attention)
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids], device=model.device)
    start = len(rollout.prompt_ids)
    forward = {"isolated": IsolatedForward, "tree": TreeForward}.get(attention)
    rule = Grammar(vocab, frozenset({tokenizer.eos_token_id}), max_blocks, *widths)  # the widths a forward reads too
    forward = model if forward is None else forward(model, vocab, start, rule)
    with torch.no_grad():
        if grammar:
            scored = GrammarForward(forward, rule, start, temperature, summary_temperature)
            return scored(ids, torch.ones_like(ids)).log_probs[0]
        logits = forward(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    logprobs = torch.log_softmax(logits[start - 1 : -1], -1)
    return logprobs.gather(-1, torch.tensor(rollout.completion_ids, device=model.device)[:, None]).squeeze(-1)
