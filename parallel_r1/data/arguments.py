"""The data settings of every stage that reads a dataset, each declared once: the prompt template, the columns, and
where the rows come from (`DataArguments`, TRL's `ScriptArguments` with our columns and row limit). The loaders
(`data.load_problems`, `data.load_sft_traces`) take these objects, not their fields one by one."""

from dataclasses import dataclass, field

from trl import ScriptArguments

from ..docstrings import document_parameters
from .prompts import check_template


@document_parameters
@dataclass(kw_only=True)
class PromptArguments:
    """The template a model's prompts are built with: for its cold-start traces, its training and its sampling."""

    prompt_template: str = field(
        default="parallel",
        metadata={"help": "Prompt template around each problem (data.TEMPLATES): parallel, plain or none."},
    )

    def __post_init__(self):
        check_template(self.prompt_template)


@document_parameters
@dataclass(kw_only=True)
class ColumnArguments:
    """Which columns of a dataset hold the problem and the answer, where its layout is not a known one
    (`data.loaders`)."""

    question_column: str | None = field(default=None, metadata={"help": "Column of the problem, if not a known one."})
    answer_column: str | None = field(default=None, metadata={"help": "Column of the answer, if not a known one."})


@document_parameters
@dataclass
class DataArguments(ScriptArguments, ColumnArguments):
    """Where a stage's rows come from: TRL's `ScriptArguments` (`dataset_name`, `dataset_config`, the splits), the
    columns (`ColumnArguments`) and how many rows are kept. `dataset_name` is a shipped set (gsm8k, math500, aime24,
    aime25, amc23; parallel_gsm8k_sample for SFT), a local .jsonl/.json/.parquet file or a Hub dataset id. SFT, GRPO
    and the cold start (which reads the training split only) use it."""

    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N usable rows of the training split."}
    )

    def __post_init__(self):
        if not self.dataset_name:
            raise ValueError("dataset_name is required: a shipped set, a local .jsonl/.json/.parquet file or a Hub id")
        if self.dataset_streaming:
            raise ValueError("dataset_streaming is not supported: every row is read and checked before training")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"max_train_samples must be at least 1 or None, got {self.max_train_samples}")

    def row_limit(self, split: str) -> int | None:
        """How many rows of `split` are kept: `max_train_samples` on the training split, all on the others."""
        return self.max_train_samples if split == self.dataset_train_split else None


@document_parameters
@dataclass
class SFTDataArguments(DataArguments):
    """Where the cold-start traces come from and how they become prompt-completion rows (`data.load_sft_traces`)."""

    response_column: str | None = field(default=None, metadata={"help": "Column of the trace, if not a known one."})
    only_well_formed: bool = field(
        default=True,
        metadata={"help": "Drop traces that are malformed or lack a final 'Final Answer:' line (the paper's filter)."},
    )
