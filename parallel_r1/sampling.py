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
from .policy import ParallelPolicy
from .rollout.arguments import BackendArguments, SamplingArguments
from .tags.language import TAGS


class ParallelSampler:
    """A saved model's policy (`ParallelPolicy.from_pretrained`: the settings it recorded, then `overrides`) and a
    backend over it (`backend`: transformers on `device` by default, an offline vLLM or a vLLM server), answering problems with
    the fork-join engine, or with one plain decode for a model trained without it (`rollout_mode: plain`)."""

    def __init__(
        self,
        model_path: str,
        temperature: float = 1.0,
        seed: int = 0,
        device: str | None = None,
        top_p: float = 1.0,
        backend: BackendArguments | None = None,
        **overrides,
    ):
        from .cli import check_model_path

        check_model_path(model_path)
        sampling = SamplingArguments(temperature=temperature, top_p=top_p, seed=seed)
        self.policy = ParallelPolicy.from_pretrained(model_path, sampling=sampling, **overrides)
        backend_args = backend or BackendArguments()
        self.backend = self.policy.open_backend(model_path, backend_args, self.policy.sampling(seed), device=device)

    def answer(self, problems: list[str], progress: bool = False) -> list:
        """One rollout (`rollout.Rollout`) per problem, its prompt built with the recorded template; `progress`
        shows a bar of the completions done."""
        import torch

        tokenizer, template = self.policy.tokenizer, self.policy.settings.prompt_template
        prompts = [prompt_ids(tokenizer, build_prompt(p, template)) for p in problems]
        with torch.no_grad():
            return self.policy.rollouts(self.backend, prompts, progress=progress)

    def text(self, rollout, color: bool = False) -> str:
        """The completion as text with its tags kept whole (and coloured for a terminal when asked)."""
        text = self.policy.tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)
        return highlight(text) if color else text


def highlight(text: str) -> str:
    """The six tags in bold cyan (ANSI), the rest as it is."""
    for tag in TAGS:
        text = text.replace(tag, f"\033[1;36m{tag}\033[0m")
    return text
