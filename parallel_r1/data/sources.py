"""Where a stage's rows come from: `DataArguments` (TRL's `ScriptArguments`, our columns and a row limit) and
`SFTDataArguments` (plus the trace column and the paper's filter). The loaders (`data.load_problems`,
`data.load_sft_traces`) take these objects, not their fields one by one."""

from dataclasses import dataclass, field

from trl import ScriptArguments

from ..docstrings import document_parameters
from .arguments import ColumnArguments


@document_parameters
@dataclass
class DataArguments(ScriptArguments, ColumnArguments):
    """Where a stage's rows come from: TRL's `ScriptArguments` (`dataset_name`, `dataset_config`, the splits), the
    columns (`ColumnArguments`) and how many rows are kept. `dataset_name` is a shipped set (gsm8k, math500, aime24,
    aime25, amc23; parallel_gsm8k_sample for SFT), a local .jsonl/.json/.parquet file or a Hub dataset id. SFT, GRPO
    and the cold start (which reads the training split only) take it from their recipe; evaluation names its
    benchmarks with it."""

    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N usable rows of the training split."}
    )

    def __post_init__(self):
        if not self.dataset_name:
            raise ValueError("dataset_name is required: a shipped set, a local .jsonl/.json/.parquet file or a Hub id")
        from .loaders import check_source  # a misspelt name fails at the parse, before any model loads

        check_source(self.dataset_name)
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
