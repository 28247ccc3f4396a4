"""Sampling a trained model outside training, with the rollout it was trained with.

Training records its parallel settings in the saved model's config (`config.parallel_r1`: the attention variant,
the prompt template and, after GRPO, the rollout: mode, paths, block limit, budgets), so whoever loads the model
later samples it as it was trained:

    from parallel_r1.sampling import ParallelSampler
    sampler = ParallelSampler("outputs/tiny-grpo")            # settings read from the model's config
    for rollout in sampler.answer(["What is 2 + 3?"]):
        print(sampler.text(rollout))                          # tags kept whole

`scripts/generate.py` is the command line around it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from .data import build_prompt, prompt_ids
from .format import TAGS
from .rollout import ForkJoinEngine, RolloutArguments, Sampling, TransformersBackend, plain_rollouts
from .rollout.arguments import RENAMED_KEYS

CONFIG_KEY = "parallel_r1"
SETTINGS_FILE = "parallel_r1.json"
logger = logging.getLogger(__name__)


def record_settings(model, settings: RolloutArguments) -> None:
    """Write the settings into the model's config, which `save_pretrained` then saves in config.json (and in every
    checkpoint's)."""
    setattr(model.config, CONFIG_KEY, asdict(settings))


def write_settings(folder: str, settings: RolloutArguments) -> None:
    """The settings as `parallel_r1.json` next to a saved model: a PEFT adapter folder has no config.json."""
    (Path(folder) / SETTINGS_FILE).write_text(json.dumps(asdict(settings), indent=2) + "\n")


def read_settings(model_path: str, revision: str | None = None, **overrides) -> RolloutArguments:
    """The settings a saved model recorded (`recorded_settings`), then `overrides` (None values are ignored)."""
    values = recorded_settings(model_path, revision)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RolloutArguments(**values)


def recorded_settings(model_path: str, revision: str | None = None) -> dict:
    """Each rollout setting as the model recorded it (under its new name where a setting was renamed), else
    `RolloutArguments`' default; not checked."""
    recorded = _recorded(model_path, revision)
    if recorded is None:
        logger.warning(
            "%s records no parallel settings: sampling with the defaults %s", model_path, RolloutArguments()
        )
    values = asdict(RolloutArguments())
    values.update({RENAMED_KEYS.get(k, k): v for k, v in (recorded or {}).items() if RENAMED_KEYS.get(k, k) in values})
    return values


def _recorded(model_path: str, revision: str | None = None) -> dict | None:
    """What a model recorded (`record_settings`, `write_settings`), or None. A local folder is read as it is, with
    no network: its config.json, else its parallel_r1.json (a PEFT adapter folder has no config.json). Anything else
    is a Hub id, whose config transformers reads from its cache or the Hub (unreachable: an OSError, after
    transformers' retries)."""
    folder = Path(model_path).expanduser()
    if not folder.is_dir():
        from transformers import AutoConfig

        return getattr(AutoConfig.from_pretrained(model_path, revision=revision), CONFIG_KEY, None)
    config = folder / "config.json"
    recorded = json.loads(config.read_text()).get(CONFIG_KEY) if config.is_file() else None
    if recorded is None and (folder / SETTINGS_FILE).is_file():
        recorded = json.loads((folder / SETTINGS_FILE).read_text())
    return recorded


class ParallelSampler:
    """A saved model and its tokenizer, answering problems with the fork-join engine (transformers backend), or with
    one plain decode for a model trained without it (`rollout_mode: plain`)."""

    def __init__(self, model_path: str, temperature: float = 1.0, seed: int = 0, device: str | None = None,
                 **overrides):  # fmt: skip
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .cli import check_model_path
        from .tokens import eos_ids, tag_vocab

        check_model_path(model_path)
        self.settings = read_settings(model_path, **overrides)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path).to(device).eval()
        self.eos_ids = eos_ids(self.tokenizer, self.model.generation_config)
        self.backend = TransformersBackend(self.model, Sampling(temperature=temperature, seed=seed),
                                           pad_token_id=self.tokenizer.pad_token_id)  # fmt: skip
        self.engine = None
        if self.settings.rollout_mode != "plain":
            newline = self.tokenizer.encode("\n", add_special_tokens=False)
            self.engine = ForkJoinEngine(
                self.backend, tag_vocab(self.tokenizer), sorted(self.eos_ids), newline, self.settings
            )

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
