"""The arguments a recipe fills, by stage: one YAML file = the fields of one script's dataclasses.

Each script parses a tuple of dataclasses with TRL's `TrlParser` (`--config recipe.yaml`, then CLI
overrides): its script arguments (data, below), its trainer config (`trainers/`) and TRL's
`ModelConfig` (model, dtype, attention implementation, LoRA). A key that none of them knows is an
error, as is an unknown command-line flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import ModelConfig, TrlParser

from .cold_start.config import ColdStartConfig
from .evaluation.config import EvaluationConfig
from .trainers.grpo import ParallelGRPOConfig
from .trainers.sft import ParallelSFTConfig


def recipe_parser(classes: tuple) -> TrlParser:
    """TRL's parser for `classes`, its --help ending with `--config` (which TrlParser reads before parsing, so it is
    not one of the parser's own arguments)."""
    parser = TrlParser(classes)
    parser.epilog = "--config RECIPE.yaml   a recipe: its keys fill the fields above; flags given here win."
    return parser


# --------------------------------------------------------------------------- stage 1: SFT


@dataclass
class SFTScriptArguments:
    """Where the cold-start traces come from and how they become prompt-completion rows (`data.load_sft_traces`)."""

    dataset_name: str = field(
        metadata={
            "help": "A shipped set (parallel_gsm8k_sample), a local .jsonl/.json/.parquet file, or a Hub dataset id "
            "(e.g. TongZheng1999/Deepseek-Qwen-3-8B-GSM8k-Parallel-data-Adaptive-Thinking-v2)."
        }
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(
        default=None, metadata={"help": "Split to evaluate on (used when eval_strategy is not 'no')."}
    )
    question_column: str | None = field(default=None, metadata={"help": "Column of the problem, if not a known one."})
    response_column: str | None = field(default=None, metadata={"help": "Column of the trace, if not a known one."})
    answer_column: str | None = field(default=None, metadata={"help": "Column of the answer, if not a known one."})
    prompt_template: str = field(
        default="parallel", metadata={"help": "Prompt template around the problem (data.TEMPLATES)."}
    )
    only_well_formed: bool = field(
        default=True,
        metadata={"help": "Drop traces that are malformed or lack a final 'Final Answer:' line (the paper's filter)."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N usable traces."})


SFT_ARGUMENTS = (SFTScriptArguments, ParallelSFTConfig, ModelConfig)


def sft_parser() -> TrlParser:
    """The parser of `scripts/sft.py`: (SFTScriptArguments, ParallelSFTConfig, ModelConfig)."""
    return recipe_parser(SFT_ARGUMENTS)


# --------------------------------------------------------------------------- stage 2: RL


@dataclass
class GRPOScriptArguments:
    """Where the problems come from (`data.load_problems`) and which rewards score them (`rewards`)."""

    dataset_name: str = field(
        metadata={
            "help": "A shipped set (gsm8k, math500, aime24, aime25, amc23), a local .jsonl/.json/.parquet file, or a "
            "Hub dataset id (e.g. BytedTsinghua-SIA/DAPO-Math-17k, openai/gsm8k)."
        }
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(
        default=None, metadata={"help": "Split to evaluate on (used when eval_strategy is not 'no')."}
    )
    question_column: str | None = field(default=None, metadata={"help": "Column of the problem, if not a known one."})
    answer_column: str | None = field(default=None, metadata={"help": "Column of the answer, if not a known one."})
    prompt_template: str = field(
        default="parallel", metadata={"help": "Prompt template around the problem (data.TEMPLATES)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N problems."})
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


def grpo_parser() -> TrlParser:
    """The parser of `scripts/grpo.py`: (GRPOScriptArguments, ParallelGRPOConfig, ModelConfig)."""
    return recipe_parser(GRPO_ARGUMENTS)


# --------------------------------------------------------------------------- evaluation

EVAL_ARGUMENTS = (EvaluationConfig, ModelConfig)


def eval_parser() -> TrlParser:
    """The parser of `scripts/evaluate.py`: (EvaluationConfig, ModelConfig)."""
    return recipe_parser(EVAL_ARGUMENTS)


# --------------------------------------------------------------------------- cold-start data


def cold_start_parser() -> TrlParser:
    """The parser of `scripts/generate_cold_start.py`: (ColdStartConfig,)."""
    return recipe_parser((ColdStartConfig,))
