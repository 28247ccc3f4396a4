"""Sampling a trained model outside training, with the rollout it was trained with.

Training records its rollout settings in the saved model (`model_settings`: the attention variant, the prompt
template and, after GRPO, the rollout: mode, paths, block limit, budgets), so whoever loads the model later samples
it as it was trained:

    from parallel_r1.sampling import ParallelSampler
    sampler = ParallelSampler("outputs/tiny-grpo")            # settings read from the model's config
    for rollout in sampler.answer(["What is 2 + 3?"]):
        print(sampler.text(rollout))                          # tags kept whole

`scripts/generate.py` is the command line around it.
"""

from __future__ import annotations

from .data import build_prompt, prompt_ids
from .model_settings import read_settings
from .rollout import EngineTokens, ForkJoinEngine, Sampling, TransformersBackend, plain_rollouts
from .tags.language import TAGS


class ParallelSampler:
    """A saved model and its tokenizer, answering problems with the fork-join engine (transformers backend), or with
    one plain decode for a model trained without it (`rollout_mode: plain`)."""

    def __init__(
        self,
        model_path: str,
        temperature: float = 1.0,
        seed: int = 0,
        device: str | None = None,
        top_p: float = 1.0,
        **overrides,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .cli import check_model_path
        from .tags.tokens import eos_ids

        check_model_path(model_path)
        self.settings = read_settings(model_path, **overrides)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path).to(device).eval()
        self.eos_ids = eos_ids(self.tokenizer, self.model.generation_config)
        self.backend = TransformersBackend(self.model, Sampling(temperature=temperature, top_p=top_p, seed=seed))
        self.engine = None
        if self.settings.rollout_mode != "plain":
            tokens = EngineTokens.of(self.tokenizer, self.eos_ids)
            self.engine = ForkJoinEngine(self.backend, tokens, self.settings)

    def answer(self, problems: list[str]) -> list:
        """One rollout (`rollout.Rollout`) per problem, its prompt built with the recorded template."""
        import torch

        prompts = [prompt_ids(self.tokenizer, build_prompt(p, self.settings.prompt_template)) for p in problems]
        with torch.no_grad():
            if self.engine is not None:
                return self.engine.generate(prompts)
            return plain_rollouts(self.backend, prompts, self.settings.max_completion_length, self.eos_ids)

    def text(self, rollout, color: bool = False) -> str:
        """The completion as text with its tags kept whole (and coloured for a terminal when asked)."""
        text = self.tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)
        return highlight(text) if color else text


def highlight(text: str) -> str:
    """The six tags in bold cyan (ANSI), the rest as it is."""
    for tag in TAGS:
        text = text.replace(tag, f"\033[1;36m{tag}\033[0m")
    return text
