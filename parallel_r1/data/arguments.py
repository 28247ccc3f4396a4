"""The data settings every stage that reads problems shares, each declared once: the prompt template and the
columns. (SFT and GRPO add TRL's dataset fields: `configs.DataArguments`.)"""

from dataclasses import dataclass, field

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
