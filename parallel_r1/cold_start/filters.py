"""Which teacher answers become SFT traces, and why the others do not.

Each answer is first cleaned (`clean_answer`: the reasoning of a reasoning teacher dropped, ends stripped), checked
against the per-answer rules, then normalised (`normalize_trace`) and measured in student tokens. Then, per problem
in sample order, the surviving traces are compared with the ones already kept. An answer is rejected by the first
rule it breaks, in the order of RULES; a switched-off rule rejects nothing.

    truncated        did not end on its own (finish reason not "stop")       require_finished
    malformed        the tag parser reports an error (`language.parse`)        require_well_formed
    no_final_answer  the last line is not `Final Answer: ...`                require_final_answer
    wrong_answer     the answer does not match the reference (`answers`)     require_correct
    no_block         no <Parallel> block                                     require_block
    too_long         over max_length student tokens, prompt included         max_length
    exact_duplicate  the text of a kept trace of the problem, up to spacing  drop_exact_duplicates
    near_duplicate   word-trigram Jaccard >= threshold with a kept trace     near_duplicate_threshold
    over_cap         the problem already has its max_traces_per_question     max_traces_per_question

Every check is also recorded on its own (`Verdict.checks`), whatever rejected the answer, for the report's rates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..answers import final_answer, final_answer_line, is_correct
from ..data import FINAL_ANSWER, build_prompt
from ..tags.language import BLANK, PARALLEL_CLOSE, PARALLEL_OPEN, PATH_CLOSE, PATH_OPEN, TAGS, parse, stats
from .config import ColdStartConfig

RULES = (
    "truncated",
    "malformed",
    "no_final_answer",
    "wrong_answer",
    "no_block",
    "too_long",
    "exact_duplicate",
    "near_duplicate",
    "over_cap",
)
THINK_CLOSE = "</think>"
_BLANK = "[" + re.escape("".join(sorted(BLANK))) + "]+"  # the parser's whitespace
_INSIDE_BLOCK = re.compile(
    f"({re.escape(PARALLEL_OPEN)}|{re.escape(PATH_CLOSE)}){_BLANK}(?={re.escape(PATH_OPEN)}|{re.escape(PARALLEL_CLOSE)})"
)


def clean_answer(text: str, drop_reasoning: bool = True) -> str:
    """The answer without its ends' whitespace and, with `drop_reasoning`, without what precedes the last
    `</think>` (a reasoning teacher's thinking)."""
    if drop_reasoning and THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    return text.strip()


def normalize_trace(text: str) -> str:
    """The trace with its tags spaced as the official training data has them: no whitespace between `<Parallel>`,
    the paths and `</Parallel>`; what follows `</Parallel>` is kept."""
    return _INSIDE_BLOCK.sub(r"\1", text)


def _rewrite_final_answer(text: str, reference: str) -> str:
    """The trace with its last line, a `Final Answer:` line (`answers.final_answer_line`) with no tag in it, made
    `Final Answer: <reference>` (the official training data spells every answer as its reference does: `$18.00`
    became `18`); the whitespace after it is kept."""
    line = final_answer_line(text)
    if line is None:
        return text
    start, end, _ = line
    if any(tag in text[start:] for tag in TAGS):
        return text
    return text[:start] + f"{FINAL_ANSWER} {reference}" + text[end:]


@dataclass
class Verdict:
    question_id: str
    sample: int
    reason: str | None  # the rule that rejected it (RULES), None if kept
    trace: str  # the normalised trace (the cleaned answer if it never got that far)
    checks: dict = field(default_factory=dict)  # every check on its own: finished, well_formed, ..., num_tokens
    detail: str | None = None  # the format error code of a malformed answer


def judge(record: dict, config: ColdStartConfig, tokenizer=None) -> Verdict:
    """The per-answer rules (truncated .. too_long) on one samples.jsonl record."""
    text = clean_answer(record["text"], config.drop_reasoning)
    parsed = parse(text)
    checks = {
        "finished": record["finish"] == "stop",
        "well_formed": parsed.well_formed,
        "final_answer": final_answer(text) is not None,
        "correct": is_correct(text, record["reference"]),
        "has_block": bool(parsed.blocks),
    }
    trace = normalize_trace(text) if config.normalize_whitespace else text
    if checks["final_answer"] and checks["correct"] and config.rewrite_final_answer:
        trace = _rewrite_final_answer(trace, record["reference"])
    shape = stats(parse(trace))
    checks["blocks"] = shape.num_blocks
    checks["paths_per_block"] = list(shape.paths_per_block)
    checks["num_tokens"] = None
    if tokenizer is not None:
        prompt = build_prompt(record["problem"], config.prompt_template)
        conversation = [*prompt, {"role": "assistant", "content": trace}]
        checks["num_tokens"] = len(tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False))
    broken = {
        "truncated": config.require_finished and not checks["finished"],
        "malformed": config.require_well_formed and not checks["well_formed"],
        "no_final_answer": config.require_final_answer and not checks["final_answer"],
        "wrong_answer": config.require_correct and not checks["correct"],
        "no_block": config.require_block and not checks["has_block"],
        "too_long": config.max_length is not None and checks["num_tokens"] > config.max_length,
    }
    reason = next((rule for rule, failed in broken.items() if failed), None)
    detail = parsed.errors[0].code if parsed.errors else None
    return Verdict(record["question_id"], record["sample"], reason, trace, checks, detail)


def select(verdicts: list[Verdict], config: ColdStartConfig) -> list[Verdict]:
    """Apply the per-problem rules (exact_duplicate, near_duplicate, over_cap) to the verdicts of ONE problem, in
    sample order; returns them with their reasons set."""
    kept = []
    for verdict in sorted(verdicts, key=lambda v: v.sample):
        if verdict.reason is not None:
            continue
        key, grams = " ".join(verdict.trace.split()), _trigrams(verdict.trace)
        if config.drop_exact_duplicates and any(key == " ".join(k.trace.split()) for k in kept):
            verdict.reason = "exact_duplicate"
        elif config.near_duplicate_threshold is not None and any(
            _jaccard(grams, _trigrams(k.trace)) >= config.near_duplicate_threshold for k in kept
        ):
            verdict.reason = "near_duplicate"
        elif config.max_traces_per_question is not None and len(kept) >= config.max_traces_per_question:
            verdict.reason = "over_cap"
        else:
            kept.append(verdict)
    return verdicts


def _trigrams(text: str) -> set:
    words = text.lower().split()
    return {tuple(words[i : i + 3]) for i in range(max(len(words) - 2, 1))}


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0
