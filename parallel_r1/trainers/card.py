"""The model card (README.md) saved with a trained model: what it is, how it was trained, how to sample it.

TRL writes a card through `create_model_card` at every checkpoint save and on `push_to_hub`; `ModelCardMixin`
replaces its generic card with this one, built with huggingface_hub's `ModelCard` and `ModelCardData`. It reads the
run from the trainer: the base model (`config.name_or_path`), the stage, the attention variant, the tags' ids, the
rollout settings recorded in the model's config (`model_settings.record_settings`), GRPO's rewards, the main training
arguments and the last logged metrics. `training.train_and_save` tells it the recipe and the dataset, and writes the
card once more after the final save.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id

from ..model_settings import CONFIG_KEY
from ..tags.tokens import INIT_KEY, TAG_INIT_RULES
from ..versions import versions

CARD_TAGS = ["parallel-r1", "parallel-thinking"]
ATTENTION_NOTES = {
    "causal": "Seen: plain causal attention, each path reads the paths before it",
    "isolated": "Unseen: the paths of a block cannot see each other and restart their positions at the block's "
    "opener; the summary reads them all",
    "tree": "the paths isolated as in Unseen, what follows them reads them one after the other (what vLLM samples "
    "in fork mode)",
}
TRAINING_ARGS = ("learning_rate", "tag_lr_multiplier", "lr_scheduler_type", "per_device_train_batch_size",
                 "gradient_accumulation_steps", "loss_type", "seed")  # fmt: skip
STAGE_ARGS = {
    "SFT": ("max_length", "summary_loss_weight", "disagreeing_paths_in_loss"),
    "GRPO": ("num_generations", "max_completion_length", "temperature", "beta", "epsilon", "epsilon_high"),
}
CARD_METRICS = ("loss", "reward", "reward_std", "parallel/ratio", "parallel/format_valid",
                "parallel/blocks_per_completion", "parallel/critical_over_total", "completions/mean_length",
                "mean_token_accuracy", "entropy", "grad_norm", "learning_rate", "tag_learning_rate")  # fmt: skip
PAPER_EVAL = "recipes/Qwen3-4B-Base/eval/paper.yaml"
EXAMPLE = "What is 17 * 23?"

TEMPLATE = """---
{{ card_data }}
---

# {{ model_name }}

A parallel-thinking model in the style of Parallel-R1 ([arXiv 2509.07980](https://arxiv.org/abs/2509.07980)): where
it chooses to, it opens a `<Parallel>` block, writes two or more independent `<Path>`s, merges them in a
`<Summary>`, and goes on. This is the {{ stage }} stage, trained with [TRL](https://github.com/huggingface/trl)
and parallel-r1.

{{ overview }}

## Tags

{{ tag_table }}

## Rollout settings

{{ rollout }}
{% if rewards %}
## Rewards

{{ rewards }}
{% endif %}
## Training

{{ training }}

## Last logged metrics

{{ metrics }}

## Sampling it

With parallel-r1 installed (`pip install -e .` in its repository), the fork-join engine samples the model with the
settings above, read from its config:

```python
from parallel_r1.sampling import ParallelSampler

sampler = ParallelSampler("{{ location }}")
for rollout in sampler.answer(["{{ example }}"]):
    print(sampler.text(rollout))  # tags kept whole
```

or from the command line, then evaluated (the settings above given as flags, since an evaluation recipe sets its
own):

```bash
python scripts/generate.py --model_name_or_path {{ location }} --prompt "{{ example }}"
{{ eval_command }}
```

## Framework versions

{{ versions }}
"""


class ModelCardMixin:
    """Put before TRL's trainer class: `create_model_card` writes the parallel-thinking card to
    output_dir/README.md (on the main process only), wherever TRL or transformers ask for a card."""

    recipe: str | None = None  # the recipe file of the run, set by training.train_and_save
    dataset_name: str | None = None  # the training data, set by training.train_and_save

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None):
        if not self.is_world_process_zero():
            return
        card = model_card(self, model_name, dataset_name or self.dataset_name, tags)
        card.save(os.path.join(self.args.output_dir, "README.md"))


def model_card(trainer, model_name: str | None = None, dataset_name: str | None = None, tags=None) -> ModelCard:
    """The card of `trainer`'s model, as it stands now."""
    args, config = trainer.args, trainer.model.config
    stage = trainer._name  # TRL's name of the trainer: "SFT" or "GRPO"
    base = getattr(config, "name_or_path", "") or None
    location = (args.hub_model_id or trainer.hub_model_id) if args.push_to_hub else args.output_dir
    model_name = model_name or location.rstrip("/").split("/")[-1]
    extra_tags = [tags] if isinstance(tags, str) else list(tags or [])  # push_to_hub passes the model's tags
    dataset = hub_id(dataset_name)
    data = ModelCardData(
        model_name=model_name,
        base_model=hub_id(base),
        datasets=[dataset] if dataset else None,
        library_name="transformers",
        tags=list(dict.fromkeys([*trainer._tag_names, *CARD_TAGS, *extra_tags])),
    )
    overview = [
        ("Stage", stage),
        ("Base model", _model_link(base)),
        ("Recipe", f"`{trainer.recipe}`" if trainer.recipe else "not recorded"),
        ("Data", f"`{dataset_name}`" if dataset_name else "not recorded"),
        ("Attention", f"`{args.attention}`: {ATTENTION_NOTES[args.attention]}"),
    ]
    return ModelCard.from_template(
        data,
        template_str=TEMPLATE,
        model_name=model_name,
        stage=stage,
        overview=_table(("", ""), overview),
        tag_table=_tags_table(trainer.policy.vocab, getattr(config, INIT_KEY, None)),
        rollout=_rollout_table(getattr(config, CONFIG_KEY, None)),
        rewards=_rewards_table(trainer) if stage == "GRPO" else None,
        training=_training_table(trainer, stage),
        metrics=_metrics_table(trainer.state.log_history),
        location=location,
        example=EXAMPLE,
        eval_command=eval_command(trainer.recipe, location, getattr(config, CONFIG_KEY, None)),
        versions="\n".join(f"- {name}: {version}" for name, version in versions().items()),
    )


def hub_id(name: str | None) -> str | None:
    """`name` when it is a Hub id (owner/name) and no local file or folder, else None."""
    if not name or name.count("/") != 1 or Path(name).expanduser().exists():
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def eval_command(recipe: str | None, location: str, settings: dict | None) -> str:
    """`scripts/evaluate.py` on an evaluation recipe of the training recipe's model (`eval_recipe`), with the recorded
    sampling settings as flags (those that are set): the recipe's own would otherwise sample, say, a Seen model as
    Unseen."""
    flags = "".join(f" --{name} {value}" for name, value in (settings or {}).items() if value is not None)
    return f"python scripts/evaluate.py --config {eval_recipe(recipe)} --model_name_or_path {location}{flags}"


def eval_recipe(recipe: str | None) -> str:
    """An evaluation recipe of the training recipe's model (`eval.yaml` or `eval/*.yaml` next to the recipe or one
    folder up), else the paper's."""
    if recipe:
        for folder in (Path(recipe).parent, Path(recipe).parent.parent):
            found = sorted([*folder.glob("eval.yaml"), *folder.glob("eval/*.yaml")])
            if found:
                return str(found[0])
    return PAPER_EVAL


def _model_link(name: str | None) -> str:
    if hub_id(name):
        return f"[{name}](https://huggingface.co/{name})"
    return f"`{name}` (a local folder)" if name else "not recorded"


def _table(header: tuple, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _tags_table(vocab, init: str | None) -> str:
    """The tags' ids, and the rule their embedding rows started from (`tokens.INIT_KEY` in the model's config)."""
    if vocab is None:
        return "The tokenizer has no parallel-thinking tags: this model decodes plain text (a sequential baseline)."
    rows = [(f"`{tag}`", token_id) for tag, token_id in vocab.ids.items()]
    start = (
        f"Their embedding rows started from the rule `{init}`: {TAG_INIT_RULES[init]}."
        if init in TAG_INIT_RULES
        else "How their embedding rows started is not recorded."
    )
    return f"Each tag is one token of the tokenizer. {start}\n\n" + _table(("Tag", "Token id"), rows)


def _rollout_table(settings: dict | None) -> str:
    if settings is None:
        return "None recorded in the model's config: samplers fall back to their defaults."
    rows = [(f"`{name}`", f"`{value}`") for name, value in settings.items()]
    note = (
        f"Recorded in `config.json` (`{CONFIG_KEY}`; in `parallel_r1.json` too next to the final model): the sampler, "
        "`scripts/generate.py` and `scripts/evaluate.py` use them unless told otherwise.\n\n"
    )
    return note + _table(("Setting", "Value"), rows)


def _rewards_table(trainer) -> str:
    weights = trainer.reward_weights.tolist()
    return _table(("Reward", "Weight"), [(f"`{name}`", w) for name, w in zip(trainer.reward_func_names, weights)])


def _training_table(trainer, stage: str) -> str:
    args = trainer.args
    rows = [("steps", f"{trainer.state.global_step} of {trainer.state.max_steps}"), ("processes", args.world_size)]
    names = [name for name in (*TRAINING_ARGS, *STAGE_ARGS.get(stage, ())) if hasattr(args, name)]
    rows += [(name, getattr(getattr(args, name), "value", getattr(args, name))) for name in names]  # enums: values
    return _table(("Argument", "Value"), [(f"`{name}`", value) for name, value in rows])


def _metrics_table(log_history: list) -> str:
    """The main numbers of the last training log (one with the loss: not an evaluation's or the end-of-run
    summary): `CARD_METRICS` and each reward's mean."""
    logs = [entry for entry in log_history if "loss" in entry]
    if not logs:
        return "Nothing was logged."
    last = logs[-1]
    shown = [
        k for k, v in last.items() if _is_number(v) and (k in CARD_METRICS or re.fullmatch(r"rewards/.*/mean", k))
    ]
    rows = [(f"`{k}`", f"{last[k]:.4g}") for k in shown]
    return f"At step {last['step']} (every logged number is in trainer_state.json):\n\n" + _table(
        ("Metric", "Value"), rows
    )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
