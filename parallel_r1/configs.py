"""The arguments a recipe fills, by stage: one YAML file = the fields of one script's dataclasses.

Each script parses a tuple of dataclasses with TRL's `TrlParser` (`--config recipe.yaml`, then CLI
overrides): its script arguments (data), its trainer config (TRL's, plus the parallel-thinking settings) and
TRL's `ModelConfig` (model, dtype, attention implementation, LoRA). A key that none of them knows is an
error, as is an unknown command-line flag. The trainer configs live here, not beside their trainers, so that
parsing (and `--help`) loads no trainer.
"""

from __future__ import annotations

import difflib
import logging
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

from trl import GRPOConfig, ModelConfig, SFTConfig, TrlParser

from .cli import OneLineErrors, flag_values, recipe_settings, take_recipe
from .cold_start.config import RENAMED_KEYS as COLD_START_RENAMED_KEYS
from .cold_start.config import ColdStartConfig
from .data.sources import DataArguments, SFTDataArguments
from .docstrings import document_parameters
from .evaluation.config import EvaluationConfig, parse_benchmarks
from .rollout import ParallelArguments, RolloutArguments
from .rollout.arguments import RENAMED_KEYS, RolloutBudgets, renamed_setting
from .tags.tokens import TagRowArguments

logger = logging.getLogger(__name__)

PER_TOKEN_CORRECTIONS = ("token_truncate", "token_mask")
LONG_COMPLETION_TOKENS = 256  # past this, a sequence-level correction drops completions for their length alone


class RecipeParser(OneLineErrors, TrlParser):
    """TRL's parser, with a user's mistake said in one line: a bad flag or value ends in `error: ...` (exit 2)
    instead of argparse's page of usage, and a recipe that is missing, given twice or not YAML is named. The recipe
    (`--config FILE` or `--config=FILE`) is kept in `recipe` for the model card. Its --help ends with `--config`,
    which TrlParser reads before parsing, so that it is not one of the parser's own arguments."""

    def __init__(self, classes: tuple, renamed_keys: dict[str, str] = RENAMED_KEYS):
        super().__init__(classes)
        self.epilog = "--config RECIPE.yaml   a recipe: its keys fill the fields above; flags given here win."
        self.recipe: str | None = None
        self.renamed_keys = renamed_keys

    def parse_args_and_config(self, args=None) -> tuple:
        args, self.recipe = take_recipe(list(sys.argv[1:] if args is None else args))
        refuse_renamed_settings(args, self.recipe, self.renamed_keys)
        if self.recipe is not None:
            args = ["--config", self.recipe, *args]
        *parsed, from_recipe, from_flags = super().parse_args_and_config(
            args, return_remaining_strings=True, separate_remaining_strings=True
        )
        self.refuse_unknown(from_recipe, from_flags)
        return tuple(parsed)

    def refuse_unknown(self, from_recipe: list[str], from_flags: list[str]) -> None:
        """A recipe key or a flag that no field takes (what the parse left over) is refused in one line that names
        the nearest field (difflib), instead of TRL's and transformers' advice to edit their dataclasses."""
        fields = [action.dest for action in self._actions if action.option_strings and action.dest != "help"]

        def nearest(name: str, prefix: str = "") -> str:
            match = difflib.get_close_matches(name.replace("-", "_"), fields, n=1)
            return f" (did you mean {prefix}{match[0]}?)" if match else ""

        if from_recipe:
            key = from_recipe[0].removeprefix("--")
            raise ValueError(f"recipe {self.recipe}: unknown setting {key}{nearest(key)}")
        flag = next((arg for arg in from_flags if arg.startswith("-")), None)
        if flag is not None:
            name = flag.lstrip("-").partition("=")[0]
            raise ValueError(f"unknown flag {flag.partition('=')[0]}{nearest(name, '--')}")
        if from_flags:
            raise ValueError(f"unexpected argument {from_flags[0]!r}: settings are given as --name value")


def refuse_renamed_settings(args: list[str], recipe: str | None, renamed_keys: dict[str, str] = RENAMED_KEYS) -> None:
    """A setting given under its old name (`renamed_keys`: old -> new) or value (`RENAMED_VALUES`), in the recipe or
    as a flag, is refused in one line that names the new one."""
    problem = renamed_setting(flag_values(args), renamed_keys)
    if problem is None and recipe is not None:
        problem = renamed_setting(recipe_settings(recipe), renamed_keys)
        problem = problem and f"recipe {recipe}: {problem}"
    if problem:
        raise ValueError(problem)


# --------------------------------------------------------------------------- both stages


@contextmanager
def bf16_named(config):
    """Around TRL's `__post_init__`: where it refuses bf16 (on by default in TRL's configs) because no GPU here
    computes in bfloat16, the line names the setting to change (transformers' own names `use_cpu`)."""
    try:
        yield
    except ValueError as error:
        if "doesn't support bf16" in str(error):  # transformers' own refusal, and no other error
            raise ValueError(
                "bf16 (on unless a recipe turns it off) needs a GPU that computes in bfloat16, and this machine has "
                "none: add `bf16: false` to the recipe (or --bf16 false) to train in float32"
            ) from None
        raise


@document_parameters
@dataclass(kw_only=True)
class TagRateArguments:
    """The tag rows' own learning rate (`trainers.tag_rate`), in SFT and GRPO."""

    tag_lr_multiplier: float = field(
        default=1.0,
        metadata={
            "help": "The tag rows of the embedding (and of an untied head, or LoRA's trainable tag tokens) learn at "
            "this multiple of learning_rate, on every step of its schedule; logged as tag_learning_rate. 1: the "
            "run's rate."
        },
    )

    def __post_init__(self):
        if not self.tag_lr_multiplier > 0:
            raise ValueError(f"tag_lr_multiplier must be positive, got {self.tag_lr_multiplier}")


# --------------------------------------------------------------------------- stage 1: SFT


@document_parameters
@dataclass
class ParallelSFTConfig(SFTConfig, ParallelArguments, RolloutBudgets, TagRowArguments, TagRateArguments):
    """`SFTConfig` plus the attention variant and the prompt template (`rollout.ParallelArguments`), the budgets the
    model records for the stages after it (`rollout.arguments.RolloutBudgets`), how the rows of
    tags the trainer adds start (`tags.tokens.TagRowArguments`) and the tag rows' learning rate
    (`TagRateArguments`), and two rules that teach the summary to vote (`trainers.summary_loss`). Options that cannot
    carry path isolation fail here."""

    summary_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Each token of a summary (after <Summary>, </Summary> included) counts this many times in the "
            "loss (TRL's fused next-token loss, still divided by the count of tokens; the loss logged is the "
            "weighted one): the vote is a few tokens after a block of many. 1: TRL's loss."
        },
    )
    disagreeing_paths_in_loss: bool = field(
        default=True,
        metadata={
            "help": "false: in a complete block whose paths end on different numbers (a path's result is the last "
            "number it writes: for traces whose paths end on their result), the paths' bodies and </Path> leave the "
            "loss and the summary stays, so SFT does not imitate a slipped attempt while the summary learns to vote "
            "over it."
        },
    )

    def __post_init__(self):
        with bf16_named(self):
            super().__post_init__()
        ParallelArguments.__post_init__(self)  # TrainingArguments' __post_init__ does not chain to these
        TagRateArguments.__post_init__(self)
        if not self.summary_loss_weight > 0:
            raise ValueError(f"summary_loss_weight must be positive, got {self.summary_loss_weight}")
        other_loss = {
            f"loss_type={self.loss_type!r}": self.loss_type != "nll",
            f"label_smoothing_factor={self.label_smoothing_factor}": bool(self.label_smoothing_factor),
            "use_liger_kernel=True": self.use_liger_kernel,
        }
        if self.summary_loss_weight != 1 and (option := next((o for o, on in other_loss.items() if on), None)):
            raise ValueError(
                f"summary_loss_weight={self.summary_loss_weight} weighs TRL's fused next-token loss: it cannot be "
                f"combined with {option}, which computes another"
            )
        setting = self.structured_setting
        if setting is None:
            return
        refused = {
            "padding_free=True": self.padding_free,
            "packing=True": self.packing,
            "eval_packing=True": self.eval_packing,
        }
        for option, is_set in refused.items():
            if is_set:
                raise ValueError(
                    f"{setting} cannot be used with {option}: rows that share one flattened sequence cannot carry "
                    "the per-row structure. Leave it off (padded batches)."
                )
        if self.completion_only_loss is False:
            raise ValueError(
                f"{setting} needs completion_only_loss: the completion (the part whose tags are read) starts at the "
                "first token in the loss, and the prompt, which names the tags as plain text, must stay out of it."
            )

    @property
    def structured_setting(self) -> str | None:
        """The first setting of this run that reads each row's tags (an attention other than causal, or a rule of
        `trainers.summary_loss`), named as it is set; None when no setting does."""
        settings = {
            f"attention={self.attention!r}": self.attention != "causal",
            f"summary_loss_weight={self.summary_loss_weight}": self.summary_loss_weight != 1,
            "disagreeing_paths_in_loss=False": not self.disagreeing_paths_in_loss,
        }
        return next((setting for setting, on in settings.items() if on), None)


SFT_ARGUMENTS = (SFTDataArguments, ParallelSFTConfig, ModelConfig)


def sft_parser() -> RecipeParser:
    """The parser of `scripts/sft.py`: (SFTDataArguments, ParallelSFTConfig, ModelConfig)."""
    return RecipeParser(SFT_ARGUMENTS)


# --------------------------------------------------------------------------- stage 2: RL


@document_parameters
@dataclass
class ParallelGRPOConfig(RolloutArguments, GRPOConfig, TagRateArguments):
    """GRPOConfig plus the rollout settings (`rollout.RolloutArguments`, first in the bases so that their
    `max_completion_length`, the paper's 3000 by default, takes the place of TRL's field of that name: it caps whole
    completions) and the tag rows' learning rate (`TagRateArguments`). `rollout_mode: plain` is TRL's own
    generation (no engine, no tag grammar)."""

    parallel_eval_steps: int = field(
        default=0,
        metadata={
            "help": "Every N optimizer steps, evaluate the current weights with the training rollout on a few problems "
            "(parallel_eval_benchmarks) and log eval/<benchmark>/* metrics; 0 turns it off."
        },
    )
    parallel_eval_benchmarks: list[str] = field(
        default_factory=lambda: ["aime25@4"],
        metadata={"help": "Benchmarks of the in-training evaluation, as name@k (see scripts/evaluate.py)."},
    )
    parallel_eval_problems: int = field(default=32, metadata={"help": "Problems per benchmark in that evaluation."})
    vllm_importance_sampling_mode: str = field(
        default="token_truncate",
        metadata={
            "help": "How TRL corrects the vLLM sampler / trainer gap: 'token_truncate' (our default: each token's "
            "weight is clipped at vllm_importance_sampling_clip_max, the completion stays), 'token_mask', "
            "'sequence_truncate' or 'sequence_mask' (TRL's default). A sequence mode sums the per-token gaps of a "
            "completion, so long answers, and those whose blocks carry a gap, are dropped whole and from one side "
            "only (trl #5814).",
            "choices": [*PER_TOKEN_CORRECTIONS, "sequence_truncate", "sequence_mask"],
        },
    )
    measure_sampling_mismatch: bool = field(
        default=True,
        metadata={
            "help": "Log |sampler - trainer| log-prob gaps (sampling/sampling_logp_difference) when TRL does not: one "
            "extra no-grad forward per generation when the old log-probs are not computed anyway."
        },
    )
    viewer_completions: int = field(
        default=256,
        metadata={
            "help": "With log_completions, the completions of each generation shown on its rollout viewer page "
            "(completions_<step>.html, its first whole groups; TRL's table keeps them all); 0 writes no page."
        },
    )

    def __post_init__(self):
        if self.viewer_completions < 0:
            raise ValueError(f"viewer_completions must be 0 (no page) or more, got {self.viewer_completions}")
        with bf16_named(self):
            GRPOConfig.__post_init__(self)
        self._generate_no_more_than_trained()
        RolloutArguments.__post_init__(self)  # no __post_init__ chains to the others
        TagRateArguments.__post_init__(self)
        if self.rollout_mode != "plain":
            self._refuse_unreproducible_sampling()
        if self.rollout_mode == "plain" and self.attention != "causal":
            raise ValueError(
                "rollout_mode='plain' samples plain causal text, which the training forward must score the same "
                "way: use attention='causal' with it"
            )
        if self.use_liger_kernel and self.attention != "causal":
            raise ValueError(
                f"use_liger_kernel computes its own forward and cannot carry attention={self.attention!r}"
            )
        if self.rollout_mode != "plain" and self.max_completion_length is None:
            raise ValueError(
                f"rollout_mode={self.rollout_mode!r} needs max_completion_length: the engine caps completions"
            )
        self._warn_on_a_sequence_correction()
        if self.parallel_eval_steps < 0 or self.parallel_eval_problems < 1:
            raise ValueError("parallel_eval_steps must be >= 0 and parallel_eval_problems >= 1")
        if self.parallel_eval_steps and not self.ds3_gather_for_generation:
            raise ValueError(
                "parallel_eval_steps needs ds3_gather_for_generation: without it every decoding step of the evaluation "
                "is a collective step, and processes decode different lengths"
            )
        if self.parallel_eval_steps:
            parse_benchmarks(self.parallel_eval_benchmarks)
        if self.parallel_eval_steps and self.rollout_mode == "plain":
            raise ValueError(
                "parallel_eval_steps evaluates with the fork-join engine: it needs rollout_mode fork or sequential"
            )

    def _generate_no_more_than_trained(self) -> None:
        """TRL generates `steps_per_generation` micro-batches at once and trains on one a micro-step; `max_steps`
        optimizer steps train `max_steps x gradient_accumulation_steps` of them. A run shorter than one generation
        (the SmolLM2 recipe's 16 with `--max_steps 1`, which trains 8) would generate completions it never trains
        on: steps_per_generation is lowered, with a warning, to the fewest micro-batches that cover what is trained
        and hold whole groups of `num_generations` (a batch of the same size)."""
        trained = self.max_steps * self.gradient_accumulation_steps
        if self.max_steps <= 0 or self.steps_per_generation <= trained:
            return
        per_micro_batch = self.generation_batch_size // self.steps_per_generation
        unit = self.num_generations // math.gcd(per_micro_batch, self.num_generations)  # micro-batches a whole group
        lowered = -(-trained // unit) * unit
        if lowered >= self.steps_per_generation:
            return
        logger.warning(
            "steps_per_generation %d is lowered to %d: max_steps=%d x gradient_accumulation_steps=%d trains %d "
            "micro-batches, and the rest of a generation would never be trained on",
            self.steps_per_generation,
            lowered,
            self.max_steps,
            self.gradient_accumulation_steps,
            trained,
        )
        self.steps_per_generation, self.generation_batch_size = lowered, per_micro_batch * lowered

    def _refuse_unreproducible_sampling(self) -> None:
        """Sampling options that reshape the distribution in ways the training forward does not repeat."""
        unreproducible = {
            "top_p": self.top_p != 1.0,
            "top_k": self.top_k not in (None, 0),
            "min_p": self.min_p not in (None, 0.0),
            "repetition_penalty": self.repetition_penalty != 1.0,
            "generation_kwargs": bool(self.generation_kwargs),
            "vllm_structured_outputs_regex": self.vllm_structured_outputs_regex is not None,
        }
        for name, is_set in unreproducible.items():
            if is_set:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} changes what the rollout samples, but the training forward "
                    "scores the completion without it (an uncorrected off-policy gap): leave it at its default "
                    f"with rollout_mode={self.rollout_mode!r}"
                )

    def _warn_on_a_sequence_correction(self) -> None:
        """A sequence-level correction multiplies the per-token ratios of a whole completion: over hundreds of tokens
        even bf16 noise (~4e-4 nats a token) sums past the clip, and the completion leaves the loss."""
        sequence_level = self.vllm_importance_sampling_mode not in PER_TOKEN_CORRECTIONS
        corrected = self.use_vllm and self.vllm_importance_sampling_correction
        if corrected and sequence_level and (self.max_completion_length or 0) > LONG_COMPLETION_TOKENS:
            logger.warning(
                "vllm_importance_sampling_mode=%r weighs a completion by the product of its %d tokens' ratios: long "
                "completions are dropped whole once their summed gap passes ln(clip_max), and only when the trainer "
                "likes them more than vLLM did (trl #5814). Use a per-token mode (token_truncate).",
                self.vllm_importance_sampling_mode,
                self.max_completion_length,
            )

    @property
    def optimizer_steps_per_generation(self) -> int:
        """Optimizer steps per generated batch: the unit of the paper's step, which reward schedules count."""
        return max(1, self.steps_per_generation * self.num_iterations // self.gradient_accumulation_steps)


@document_parameters
@dataclass
class GRPOScriptArguments(DataArguments):
    """Where the problems come from (`data.load_problems`) and which rewards score them (`rewards`)."""

    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Drop problems whose prompt (chat template applied) is longer than this many tokens."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["accuracy"],
        metadata={
            "help": "Reward names or schedule calls (parallel_r1.rewards), e.g. accuracy, tiered, "
            "'alternating(accuracy, tiered, window=10, a_steps=8)'. Weights: reward_weights."
        },
    )


GRPO_ARGUMENTS = (GRPOScriptArguments, ParallelGRPOConfig, ModelConfig)


def grpo_parser() -> RecipeParser:
    """The parser of `scripts/grpo.py`: (GRPOScriptArguments, ParallelGRPOConfig, ModelConfig)."""
    return RecipeParser(GRPO_ARGUMENTS)


# --------------------------------------------------------------------------- evaluation

EVAL_ARGUMENTS = (EvaluationConfig, ModelConfig)


def eval_parser() -> RecipeParser:
    """The parser of `scripts/evaluate.py`: (EvaluationConfig, ModelConfig)."""
    return RecipeParser(EVAL_ARGUMENTS)


# --------------------------------------------------------------------------- cold-start data


def cold_start_parser() -> RecipeParser:
    """The parser of `scripts/generate_cold_start.py`: (ColdStartConfig,)."""
    return RecipeParser((ColdStartConfig,), COLD_START_RENAMED_KEYS)
