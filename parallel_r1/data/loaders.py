"""Load math problems (RL, evaluation) and cold-start traces (SFT) as TRL-ready datasets.

A source is one of:
- a shipped name, read from `DATA_DIR` with no network: `gsm8k` (splits train, test), `math500`,
  `aime24`, `aime25`, `amc23` (split test), `parallel_gsm8k_sample` (split train, SFT traces);
- a local `.jsonl`, `.json` or `.parquet` file (a file is one split: `split` is not used);
- anything else with a `/` in it: a Hub id (or a local dataset folder), loaded with
  `datasets.load_dataset(source, config, split=split)`.

Every source then goes through the same mapping (`to_problems`, `to_sft_traces`), so the Hub path
runs the code the offline tests run. Nested fields are addressed by dotted names
(`reward_model.ground_truth`): the rows are flattened first. A column is taken from the first known
layout whose columns are all present; `question_column` / `answer_column` / `response_column`
override one side of it. Anything missing or empty fails at load, naming the column (and the row).
"""

from __future__ import annotations

import copy
import difflib
import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from ..answers import final_answer
from ..tags.language import parse
from ..tags.tokens import add_parallel_tokens, missing_tags
from . import DATA_DIR
from .prompts import DEFAULT_TEMPLATE, PROMPT_MARKER, TEMPLATES, build_prompt, check_template

if TYPE_CHECKING:
    from datasets import Dataset

    from .sources import DataArguments, SFTDataArguments

logger = logging.getLogger(__name__)

SHIPPED = {
    "gsm8k": {"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"},
    "math500": {"test": "math500.jsonl"},
    "aime24": {"test": "aime24.jsonl"},
    "aime25": {"test": "aime25.jsonl"},
    "amc23": {"test": "amc23.jsonl"},
    "parallel_gsm8k_sample": {"train": "parallel_gsm8k_sample.jsonl"},
}
HUB_DEFAULT_CONFIGS = {"openai/gsm8k": "main"}  # the Hub refuses this one without a config
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}

# (problem, answer) column pairs, tried in order.
PROBLEM_LAYOUTS = (
    ("question", "answer"),  # GSM8K (openai/gsm8k)
    ("problem", "answer"),  # MATH-500, AIME, AMC
    ("prompt", "reward_model.ground_truth"),  # DAPO-Math-17k and other verl files: chat-list prompt
    ("prompt", "solution"),  # open-r1/DAPO-Math-17k-Processed: text prompt, `solution` is the answer
)
# (problem, response, answer) column triples; answer None: taken from the trace's Final Answer line.
SFT_LAYOUTS = (
    ("question", "response", "answer"),  # the shipped sample
    # Parallel-R1's verl SFT parquet: what its SFT trains on (the response with its tag whitespace normalised)
    ("prompt", "extra_info.answer", "reward_model.ground_truth"),
    ("prompt", "output", "reward_model.ground_truth"),  # the same parquet, raw teacher output
    ("problem", "text", None),  # the cold-start set on the Hub, as the official preprocessing reads it
    ("prompt", "completion", "answer"),  # prompt-completion sets (ours: scripts/generate_cold_start.py)
    ("prompt", "completion", None),
)
ID_COLUMNS = ("id", "unique_id", "index", "extra_info.index")

# DAPO-Math-17k wraps every problem in its own instruction: this first paragraph and this last one.
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
DAPO_SUFFIX = 'Remember to put your answer on its own line after "Answer:".'
# Parallel-R1's verl files: their instruction, this marker, then the problem, in one user turn.
PROBLEM_MARKER = "\n\nProblem: "

_BATCH = 1024


# --------------------------------------------------------------------------- cells


def problem_text(cell) -> str:
    """The bare problem in a question cell.

    - A chat list (verl layout) stands for the content of its last user turn.
    - DAPO-Math-17k's instruction wrapper (its fixed first and last paragraphs, see DAPO_PREFIX and
      DAPO_SUFFIX) is removed.
    - A prompt built by `build_prompt` (any template) gives back its problem.
    - Otherwise, in a chat cell holding PROBLEM_MARKER (Parallel-R1's own prompt), the problem is what
      follows the first marker.
    """
    is_chat = isinstance(cell, list)
    if is_chat:
        turns = [t for t in cell if isinstance(t, dict) and t.get("role") == "user"]
        if not turns:
            raise ValueError(f"a chat prompt with no user turn: {cell!r}")
        cell = turns[-1].get("content")
    if not isinstance(cell, str):
        raise ValueError(f"a problem must be text or a chat list, got {type(cell).__name__}: {cell!r}")
    text = cell.strip()
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX) :].strip()
        return text[: -len(DAPO_SUFFIX)].strip() if text.endswith(DAPO_SUFFIX) else text
    for instruction in filter(None, TEMPLATES.values()):
        if text.startswith(instruction + PROMPT_MARKER):
            return text[len(instruction + PROMPT_MARKER) :].strip()
    if is_chat and PROBLEM_MARKER in cell:
        return cell.split(PROBLEM_MARKER, 1)[1].strip()
    return text


def trace_problem(response: str) -> str | None:
    """Why a cold-start trace is unfit for SFT (a format error code, or `no_final_answer`); None if fit.

    The paper's filter (docs/paper.md, the cold start): the response must be well-formed and end with a
    `Final Answer:` line.
    """
    parsed = parse(response)
    if not parsed.well_formed:
        return parsed.errors[0].code
    return None if final_answer(response) else "no_final_answer"


# --------------------------------------------------------------------------- reading


def check_source(source: str) -> None:
    """Refuse a name that is neither a shipped set, a data file (one that is missing is refused when it is read),
    nor of the form owner/name (a Hub id or a local dataset folder), naming the nearest shipped set: `DataArguments`
    checks its `dataset_name` so, at the parse, before any model loads."""
    path = Path(source)
    if source in SHIPPED or path.suffix in FILE_BUILDERS or path.is_file():
        return
    if "/" not in source:
        nearest = difflib.get_close_matches(source, SHIPPED, n=1)
        raise ValueError(
            f"unknown data source {source!r}{f' (did you mean {nearest[0]}?)' if nearest else ''}: not a shipped set "
            f"({', '.join(SHIPPED)}), not a {'/'.join(FILE_BUILDERS)} file, not a Hub id of the form owner/name"
        )


def read_source(source: str, split: str = "train", config: str | None = None) -> Dataset:
    """The raw rows of a source (see the module docstring), before any mapping."""
    from datasets import load_dataset

    if source in SHIPPED:
        files = SHIPPED[source]
        if split not in files:
            raise ValueError(f"shipped set {source!r} has no split {split!r}; its splits: {', '.join(files)}")
        return load_dataset("json", data_files=str(DATA_DIR / files[split]), split="train")
    check_source(source)
    path = Path(source)
    if path.suffix in FILE_BUILDERS or path.is_file():
        return _read_file(path)
    return load_dataset(source, config or HUB_DEFAULT_CONFIGS.get(source), split=split)


def load_problems(
    data: DataArguments, split: str | None = None, *, template: str = DEFAULT_TEMPLATE, limit: int | None = None
) -> Dataset:
    """Problems of `split` (default: `data.dataset_train_split`) of `data`'s source as columns `prompt` (one chat user
    turn), `answer` and `id`; `limit` caps the rows (default: `data.row_limit(split)`, `max_train_samples` on the
    training split)."""
    split = split or data.dataset_train_split
    limit = data.row_limit(split) if limit is None else limit
    _check_options(template, limit)
    return to_problems(
        read_source(data.dataset_name, split, data.dataset_config),
        question_column=data.question_column,
        answer_column=data.answer_column,
        template=template,
        limit=limit,
        name=f"{data.dataset_name} [{split}]",
    )


def load_sft_traces(
    data: SFTDataArguments, split: str | None = None, *, template: str = DEFAULT_TEMPLATE, limit: int | None = None
) -> Dataset:
    """Cold-start traces of `split` (default: `data.dataset_train_split`) of `data`'s source as TRL conversational
    prompt-completion rows (see `to_sft_traces`); `limit` caps the rows (default: `data.row_limit(split)`)."""
    split = split or data.dataset_train_split
    limit = data.row_limit(split) if limit is None else limit
    _check_options(template, limit)
    return to_sft_traces(
        read_source(data.dataset_name, split, data.dataset_config),
        question_column=data.question_column,
        response_column=data.response_column,
        answer_column=data.answer_column,
        template=template,
        only_well_formed=data.only_well_formed,
        limit=limit,
        name=f"{data.dataset_name} [{split}]",
    )


# --------------------------------------------------------------------------- mapping


def to_problems(
    dataset: Dataset,
    *,
    question_column: str | None = None,
    answer_column: str | None = None,
    template: str = DEFAULT_TEMPLATE,
    limit: int | None = None,
    name: str = "dataset",
) -> Dataset:
    """Map raw rows to `prompt`, `answer`, `id`.

    `prompt` is `build_prompt(problem_text(question), template)`; `answer` is the answer cell as text
    (a GSM8K answer keeps its worked solution and `#### N`); `id` is the row's own id column
    (ID_COLUMNS) or its position. Rows repeating an earlier row are dropped, a repeat being the same id
    or, without an id column, the same (problem, answer) pair: the raw DAPO-Math-17k file repeats each
    of its 17,917 indexed prompts a hundred times (keying on the index keeps 17,917, the paper's count;
    keying on the text would merge a few hundred more). `limit` caps the rows returned.
    """
    from datasets import Dataset

    _check_options(template, limit)
    flat = _flat(dataset, name)
    overrides = {"question": question_column, "answer": answer_column}
    question, answer = _resolve(flat.column_names, PROBLEM_LAYOUTS, overrides, name)
    columns = {"prompt": [], "answer": [], "id": []}
    seen, repeats = set(), 0
    for i, row in _rows(flat, (question, answer, _id_column(flat))):
        if limit is not None and len(seen) == limit:
            break
        problem = _cell(problem_text, row[0], i, question, name)
        gold = _cell(_text, row[1], i, answer, name)
        key = (problem, gold) if row[2] is None else row[2]
        if key in seen:
            repeats += 1
            continue
        seen.add(key)
        columns["prompt"].append(build_prompt(problem, template))
        columns["answer"].append(gold)
        columns["id"].append(str(i if row[2] is None else row[2]))
    logger.info("%s: %d problems (%d repeated rows dropped)", name, len(seen), repeats)
    return Dataset.from_dict(columns)


def to_sft_traces(
    dataset: Dataset,
    *,
    question_column: str | None = None,
    response_column: str | None = None,
    answer_column: str | None = None,
    template: str = DEFAULT_TEMPLATE,
    only_well_formed: bool = True,
    limit: int | None = None,
    name: str = "dataset",
) -> Dataset:
    """Map raw traces to TRL's conversational prompt-completion columns, plus `answer` and `id`.

    `prompt` is the same user turn RL uses (`build_prompt`), `completion` is one assistant turn with
    the response verbatim. `answer` is the answer cell, or (for a layout with no answer column) what
    the trace's `Final Answer:` line says. With `only_well_formed`, traces that `trace_problem`
    rejects are dropped, and how many and why is logged; none left is an error. `limit` caps the
    rows returned (the first that pass).
    """
    from datasets import Dataset

    _check_options(template, limit)
    flat = _flat(dataset, name)
    overrides = {"question": question_column, "response": response_column, "answer": answer_column}
    question, response, answer = _resolve(flat.column_names, SFT_LAYOUTS, overrides, name)
    columns = {"prompt": [], "completion": [], "answer": [], "id": []}
    dropped = Counter()
    for i, row in _rows(flat, (question, response, answer, _id_column(flat))):
        if limit is not None and len(columns["id"]) == limit:
            break
        problem = _cell(problem_text, row[0], i, question, name)
        text = _cell(_response, row[1], i, response, name)
        reason = trace_problem(text) if only_well_formed else None
        if reason:
            dropped[reason] += 1
            continue
        columns["prompt"].append(build_prompt(problem, template))
        columns["completion"].append([{"role": "assistant", "content": text}])
        columns["answer"].append(_cell(_text, row[2], i, answer, name) if answer else final_answer(text) or "")
        columns["id"].append(str(i if row[3] is None else row[3]))
    why = ", ".join(f"{code}: {n}" for code, n in sorted(dropped.items())) or "none"
    summary = f"{name}: kept {len(columns['id'])} traces, dropped {sum(dropped.values())} ({why})"
    if not columns["id"]:
        raise ValueError(f"no usable traces: {summary}")
    logger.info(summary)
    return Dataset.from_dict(columns)


def drop_long_traces(dataset: Dataset, tokenizer, max_length: int, name: str = "dataset") -> Dataset:
    """The prompt-completion rows whose whole conversation, chat template applied, fits `max_length` tokens.

    The official SFT drops the longer rows (docs/paper.md, the cold start); left in, TRL would cut them at
    `max_length`, and a cut trace loses its end: the `Final Answer:` line and the end-of-turn token the model must
    learn to write. A tokenizer without the tags counts as it will once the trainer adds them (on a copy: the
    trainer must still find them missing, to give them embedding rows).
    """
    if missing_tags(tokenizer):
        tokenizer = copy.deepcopy(tokenizer)
        add_parallel_tokens(tokenizer)
    kept = dataset.filter(
        lambda row: (
            len(tokenizer.apply_chat_template(row["prompt"] + row["completion"], return_dict=False)) <= max_length
        ),
        desc=f"traces of at most {max_length} tokens",
    )
    logger.info("%s: dropped %d traces longer than %d tokens", name, len(dataset) - len(kept), max_length)
    if len(kept) == 0:
        raise ValueError(f"no trace of {name} fits max_length={max_length} tokens")
    return kept


# --------------------------------------------------------------------------- helpers


def _read_file(path: Path) -> Dataset:
    from datasets import load_dataset

    if path.suffix not in FILE_BUILDERS:
        raise ValueError(f"unsupported data file type {path.suffix!r} ({path}); use one of {', '.join(FILE_BUILDERS)}")
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if _has_no_rows(path):  # datasets' builders fail on these with messages that do not say so
        raise ValueError(f"data file {path} has no rows")
    try:
        return load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path), split="train")
    except ValueError as error:
        raise ValueError(f"could not read rows from {path}: {error}") from error


def _has_no_rows(path: Path) -> bool:
    """A parquet file whose metadata counts no rows, or a JSON file holding only whitespace."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_metadata(path).num_rows == 0
    with path.open("rb") as f:
        return not any(chunk.strip() for chunk in iter(lambda: f.read(1 << 16), b""))


def _check_options(template: str, limit: int | None) -> None:
    check_template(template)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")


def _flat(dataset: Dataset, name: str) -> Dataset:
    if len(dataset) == 0:
        raise ValueError(f"{name} has no rows")
    return dataset.flatten()


def _resolve(present: list[str], layouts: tuple, overrides: dict, name: str) -> tuple:
    """The columns of the first layout that `present` has in full, once `overrides` (role -> column) replace their side.

    The layouts' columns come in the order of the roles in `overrides`.
    """
    for layout in layouts:
        chosen = tuple(override or column for override, column in zip(overrides.values(), layout))
        if all(column is None or column in present for column in chosen):
            return chosen
    listing = f"columns present in {name}: {', '.join(present)}"
    for role, override in overrides.items():
        if override and override not in present:
            raise ValueError(f"{role}_column {override!r} not found; {listing}")
    for (role, override), candidates in zip(overrides.items(), zip(*layouts)):
        expected = [c for c in dict.fromkeys(candidates) if c]
        if not override and expected and not any(c in present for c in expected):
            raise ValueError(
                f"no {role} column: expected one of {', '.join(expected)} (or pass {role}_column=); {listing}"
            )
    known = "; ".join(" + ".join(c or "(Final Answer line)" for c in layout) for layout in layouts)
    raise ValueError(f"the columns match no known layout ({known}); pass the column names; {listing}")


def _id_column(flat: Dataset) -> str | None:
    return next((c for c in ID_COLUMNS if c in flat.column_names), None)


def _rows(flat: Dataset, columns: tuple):
    """(position, values) for every row; a None column gives None values."""
    wanted = list(dict.fromkeys(c for c in columns if c))
    position = 0
    for batch in flat.select_columns(wanted).iter(batch_size=_BATCH):
        size = len(batch[wanted[0]])
        for k in range(size):
            yield position + k, tuple(batch[c][k] if c else None for c in columns)
        position += size


def _cell(convert, value, row: int, column: str, name: str):
    """`convert(value)`; a ValueError naming the row and column when the cell is missing, empty or unreadable."""
    try:
        result = None if value is None else convert(value)
    except ValueError as error:
        raise ValueError(f"{name}: row {row}, column {column!r}: {error}") from None
    if result is None or not str(result).strip():
        raise ValueError(f"{name}: row {row} has an empty {column!r}")
    return result


def _text(value) -> str:
    return str(value).strip()


def _response(value) -> str:
    """A response cell: text, or a chat list whose last assistant turn is the response."""
    if isinstance(value, list):
        turns = [t for t in value if isinstance(t, dict) and t.get("role") == "assistant"]
        value = turns[-1].get("content") if turns else None
        if value is None:
            raise ValueError("a chat completion with no assistant turn")
    if not isinstance(value, str):
        raise ValueError(f"a response must be text or a chat list, got {type(value).__name__}: {value!r}")
    return value
