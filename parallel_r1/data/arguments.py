"""The prompt and column settings, each declared once, with no TRL import: the rollout settings build on
`PromptArguments`. Where the rows come from (`DataArguments`, on TRL's `ScriptArguments`) is in `data.sources`."""

from dataclasses import dataclass, field

from ..docstrings import document_parameters
from .prompts import DEFAULT_TEMPLATE, check_template


@document_parameters
@dataclass(kw_only=True)
class PromptArguments:
    """The template a model's prompts are built with: for its cold-start traces, its training and its sampling."""

    prompt_template: str = field(
        default=DEFAULT_TEMPLATE,
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
