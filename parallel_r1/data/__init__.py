"""Datasets: shipped offline files, Hub ids and local files mapped to prompt + answer columns.

Importing the package is light (no `datasets`, no TRL): the loaders and the arguments are imported on first use.
"""

from pathlib import Path

from .prompts import FINAL_ANSWER, PLAIN_CHAT_TEMPLATE, TEMPLATES, build_prompt, check_template, prompt_ids

DATA_DIR = Path(__file__).parent / "files"

_LOADERS = (
    "SHIPPED",
    "drop_long_traces",
    "load_problems",
    "load_sft_traces",
    "problem_text",
    "read_source",
    "to_problems",
    "to_sft_traces",
    "trace_problem",
)
_ARGUMENTS = ("DataArguments", "SFTDataArguments")  # TRL's ScriptArguments: also imported on first use
__all__ = [
    "DATA_DIR",
    "FINAL_ANSWER",
    "PLAIN_CHAT_TEMPLATE",
    "TEMPLATES",
    "build_prompt",
    "check_template",
    "prompt_ids",
    *_LOADERS,
    *_ARGUMENTS,
]


def __getattr__(name: str):
    if name in _LOADERS:
        from . import loaders

        return getattr(loaders, name)
    if name in _ARGUMENTS:
        from . import sources

        return getattr(sources, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
