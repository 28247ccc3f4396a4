"""Shared by the rollout tests: drive the engine on the tag-prone tiny model, recompute log-probs."""

import torch

from parallel_r1.rollout import ForkJoinEngine, RolloutConfig, Sampling, TransformersBackend
from parallel_r1.structure import isolated_inputs

QUESTIONS = [
    "What is 2+2?",
    "A farmer has 3 cows and 4 hens. How many legs are there?",
    "x",
    "Compute 17*3 please.",
    "Tell me.",
    "a b c d e f",
]


def engine(setup, kv_reuse="full", temperature=1.0, seed=0, **config):
    _, model, tokenizer, vocab = setup
    config = {"max_completion_tokens": 120, "max_path_tokens": 24, "max_summary_tokens": 16, **config}
    backend = TransformersBackend(
        model, Sampling(temperature=temperature, seed=seed), kv_reuse, tokenizer.pad_token_id
    )
    newline = tokenizer.encode("\n", add_special_tokens=False)
    return ForkJoinEngine(backend, vocab, [tokenizer.eos_token_id], newline, RolloutConfig(**config))


def prompts(tokenizer):
    return [tokenizer.encode(q, add_special_tokens=False) for q in QUESTIONS]


def trainer_logprobs(model, rollout, vocab, isolated):
    """The log-probs the trainer computes from the ids alone (structure recomputed from the ids)."""
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids])
    inputs = {"attention_mask": torch.ones_like(ids)}
    if isolated:
        inputs = isolated_inputs(ids, inputs["attention_mask"], len(rollout.prompt_ids), vocab)
    with torch.no_grad():
        logits = model(input_ids=ids, **inputs).logits[0].float()
    start = len(rollout.prompt_ids)
    logprobs = torch.log_softmax(logits[start - 1 : -1], -1)
    return logprobs.gather(-1, torch.tensor(rollout.completion_ids)[:, None]).squeeze(-1)
