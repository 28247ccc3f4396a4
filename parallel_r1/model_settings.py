"""The rollout settings a saved model carries, so that whoever loads it samples it as it was trained.

Training writes them into the model's config (`config.parallel_r1`, saved in config.json and in every checkpoint's)
and, for a PEFT adapter folder, which has no config.json, into `parallel_r1.json` beside it. Reading them back
gives `RolloutArguments`: what the model recorded, under the new name where a setting was renamed (a recorded
`num_paths: K` is `min_paths = max_paths = K`), and the defaults where it recorded nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from .rollout import RolloutArguments
from .rollout.arguments import RENAMED_KEYS, RENAMED_VALUES
from .tags.tokens import eos_ids

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
    """Each rollout setting as the model recorded it (under its new name, with its new value, where a setting or a
    value was renamed), else `RolloutArguments`' default; not checked."""
    recorded = _recorded(model_path, revision)
    if recorded is None:
        logger.warning(
            "%s records no parallel settings: sampling with the defaults %s", model_path, RolloutArguments()
        )
    values = asdict(RolloutArguments())
    for key, value in (recorded or {}).items():
        if key == "num_paths":  # a fixed width, recorded before the model could choose one
            values.update(min_paths=value, max_paths=value)
            continue
        name = RENAMED_KEYS.get(key, key)
        if name in values:
            values[name] = RENAMED_VALUES.get((name, value), value)
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


def saved_eos_ids(tokenizer, path: str, revision: str | None = None) -> frozenset:
    """The ids that end a completion of the model saved at `path` (a folder or a Hub id): the tokenizer's EOS and
    those of the generation config saved with it, if it has one (`tags.tokens.eos_ids`)."""
    from transformers import GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(path, revision=revision)
    except OSError:
        generation_config = None
    return eos_ids(tokenizer, generation_config)
