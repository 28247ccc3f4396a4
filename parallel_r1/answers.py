"""Final answers: find them in a completion, read them from a dataset, and check one against the other.

Extraction (`extract_answer`), on the completion with its tags removed:
- Only the last `MAX_SCAN_CHARS` characters are read.
- Two markers count: the last `Final Answer:` (any case, markdown bold allowed; the rest of its line, or the
  next non-blank line when the rest is blank) and the last complete `\\boxed{...}` (braces balanced; a box
  left open by a cut output is ignored).
- What a `Final Answer:` marker gives loses Minerva's wording around the answer: a leading `The final answer is`,
  and the closing sentences that name no value (`I hope it is correct.`). So `Final Answer: The final answer is
  $9$. I hope it is correct.` gives `$9$`; a closing sentence with a value stays, and a hedge stays a hedge.
- The marker that starts later in the text wins. So a `\\boxed{}` inside or below the `Final Answer:` line
  gives its content, and a `Final Answer:` written after a box overrides the box.
- All boxes on the winning box's line form one answer, joined by ", " (`\\boxed{2}` and `\\boxed{-3}` ->
  `2, -3`), the way a model boxes each of several solutions.
- An answer longer than `MAX_ANSWER_CHARS` is no answer.

A path of a block has a result, not a marked answer: the last number it writes (`path_result`). A complete block
whose paths end on different results is a split vote (`paths_disagree`).

Checking (`answers_match`, `is_correct`; docs/answers.md):
- Equal to the reference after `normalize` is correct.
- Otherwise the answer is read (`read_answer`): math delimiters (`$`, `\\( \\)`, `\\[ \\]`), bold markers and
  text commands go (their text stays), and a line that then holds words (two or more ASCII letters outside a
  LaTeX command, or an abbreviation such as `i.e.`; a unit's power goes with its word, `cm^2`) is read as the
  list of the values between its words: the pieces that hold a digit or a LaTeX command.
- The reading is judged: a base subscript in it must be the reference's (`52_9` is not `52_8`; `52` for
  `52_8` is right); two plain decimal numbers are compared exactly (`3.1415927` is not `3.1415926`); anything
  else gets math-verify's verdict.

So an answer that names two or more different values is wrong, however it is spelled: `5 (not 4)`,
`5 or maybe 4` and `5 apples or 4 apples` all read `5, 4`, a list that equals no single reference, as
math-verify already reads `18 or 19`. One value with unit words is that value (`4 apples` reads `4`).
math-verify's own leniencies stay: a decimal against an exact value is compared at 6 decimals (`0.333333`
is `\\frac13`), a slash between numbers divides (`4/2` is 2), a relation is read by one side (`x = 5` is 5).
Words are not values: `east or 3/2` reads `3/2`.

math-verify runs in a child process (spawned once), so every check is bounded in time from any thread:
math-verify's own timeouts use `signal.alarm`, which works only on a main thread, and TRL may call rewards
from other threads. Inside the child they bound slow symbolic work cheaply; a check that still overruns
`timeout` gets the child killed and restarted, which also covers work that signals cannot interrupt. Nothing
here raises: bad input gives None/False.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

from .tags.language import BLANK, strip_tags

logger = logging.getLogger(__name__)

MAX_SCAN_CHARS = 50_000  # the tail of a completion that is searched for an answer (4k tokens is ~16k chars)
MAX_ANSWER_CHARS = 500  # a longer "answer" is not an answer
TIMEOUT_S = 5.0  # hard bound on one math-verify check
SOFT_TIMEOUT_S = 1  # math-verify's own bound on each parse/verify step inside the child (whole seconds)
STARTUP_TIMEOUT_S = 120.0  # the child imports sympy once

# `Final Answer:` as a model may write it: any case, markdown bold around the words or the colon
FINAL_MARKER = re.compile(r"(?:\*\*)?final answer(?:\*\*)?\s*:(?:\*\*)?", re.IGNORECASE)
_MARKER_FIRST = re.compile(r"[ \t]*" + FINAL_MARKER.pattern, re.IGNORECASE)  # the marker first on its line
_MINERVA_LEAD = re.compile(r"[ \t]*(?:the )?final answer is\b[ \t]*:?", re.IGNORECASE)  # Minerva's doubled marker
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")  # where a closing sentence may start
_VALUE = re.compile(r"\d|\\[a-zA-Z]")  # a digit or a LaTeX command: what a value holds
_BLANK = "".join(sorted(BLANK))
_BOX = re.compile(r"\\boxed\s*\{")
_BRACE = re.compile(r"[{}]")
_GSM8K_MARK = "####"


# --------------------------------------------------------------------------- extraction


def _brace_pairs(text: str) -> dict[int, int]:
    """{index of a `{`: index of the `}` that closes it}, for the braces that close (one pass)."""
    pairs, open_at = {}, []
    for match in _BRACE.finditer(text):
        if match.group() == "{":
            open_at.append(match.start())
        elif open_at:
            pairs[open_at.pop()] = match.start()
    return pairs


def _last_boxes(text: str) -> tuple[int, str] | None:
    """(start, answer) of the last complete box, with the other boxes of its line joined in."""
    pairs = _brace_pairs(text)
    boxes = [(m.start(), text[m.end() : pairs[m.end() - 1]]) for m in _BOX.finditer(text) if m.end() - 1 in pairs]
    if not boxes:
        return None
    start = boxes[-1][0]
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line_end = len(text) if line_end < 0 else line_end
    same_line = [content.strip() for s, content in boxes if line_start <= s < line_end]
    return start, ", ".join(same_line)


def _last_final_answer(text: str) -> tuple[int, str] | None:
    """(start, answer) of the last `Final Answer:` marker, without Minerva's wording (`_without_remarks`)."""
    matches = list(FINAL_MARKER.finditer(text))
    if not matches:
        return None
    match = matches[-1]
    lines = text[match.end() :].split("\n")
    content = next((line for line in lines if line.strip()), "")
    return match.start(), _without_remarks(content)


def _without_remarks(content: str) -> str:
    """The content of a `Final Answer:` line without a leading `The final answer is` and without the closing
    sentences (after `.`, `!` or `?` and a capital) that hold no value (`_VALUE`)."""
    lead = _MINERVA_LEAD.match(content)
    if lead:
        content = content[lead.end() :]
    end = len(content)
    for cut in reversed([m.start() for m in _SENTENCE_BREAK.finditer(content)]):
        if _VALUE.search(content, cut, end):
            break
        end = cut
    return content[:end]


def final_answer_line(text: str) -> tuple[int, int, str] | None:
    """(start, end, answer) of the last non-blank line of `text` when it is a `Final Answer:` line: the marker first on
    it (after spaces), an answer after it; None otherwise. This is the format the prompts ask for and the cold-start
    filter requires (docs/paper.md, the cold start); `extract_answer` reads answers anywhere. Blank is the tag
    parser's whitespace; the answer is stripped."""
    end = len(text.rstrip(_BLANK))
    start = text.rfind("\n", 0, end) + 1
    match = _MARKER_FIRST.match(text, start, end)
    answer = text[match.end() : end].strip() if match else ""
    return (start, end, answer) if answer else None


def final_answer(response: str) -> str | None:
    """The answer on the `Final Answer:` line that ends `response` once its tags are removed (`final_answer_line`),
    or None."""
    line = final_answer_line(strip_tags(response))
    return line[2] if line else None


def _clean(answer: str) -> str:
    """Strip the wrapping a model puts around an answer: spaces, bold, a closing full stop."""
    answer = answer.strip().strip("*").strip()
    return answer[:-1].rstrip() if answer.endswith(".") else answer


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion (rules in the module docstring), or None if it gives none."""
    if not isinstance(completion, str):
        return None
    text = strip_tags(completion[-2 * MAX_SCAN_CHARS :])[-MAX_SCAN_CHARS:]
    found = [m for m in (_last_boxes(text), _last_final_answer(text)) if m is not None]
    if not found:
        return None
    answer = _clean(max(found, key=lambda m: m[0])[1])
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer


def extract_reference(answer) -> str:
    """The gold answer of a dataset cell: the content of a cell that is one `\\boxed{}`, what follows the last
    `####` (GSM8K, thousands commas dropped), or the cell itself, unwrapped until nothing changes (so `#### \\boxed{5}`
    and `\\boxed{\\boxed{5}}` are `5`). Numbers become strings. Idempotent."""
    text = "" if answer is None else str(answer).strip()
    while (inner := _unwrap_reference(text)) != text:  # each step shortens the text
        text = inner
    return text


def _unwrap_reference(text: str) -> str:
    box = _BOX.match(text)
    if box and _brace_pairs(text).get(box.end() - 1) == len(text) - 1:
        return text[box.end() : -1].strip()
    if _GSM8K_MARK in text:
        return text.rsplit(_GSM8K_MARK, 1)[1].replace(",", "").strip()
    return text


# --------------------------------------------------------------------------- the paths of a block

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def path_result(text: str) -> Decimal | None:
    """The last number a path writes, as a value (`1,000` is 1000, `68.0` is 68), or None."""
    numbers = _NUMBER.findall(text)
    return Decimal(numbers[-1].replace(",", "")) if numbers else None


def paths_disagree(block, text_of=str) -> bool:
    """Whether a complete block (`language.Block`: closed, every path closed) has paths that end on different
    numbers (`path_result`): a split vote. A block cut by the length is not judged (its paths' last numbers are not
    their results), and a path that writes no number disagrees with one that does. `text_of` turns a path's body
    into text (an id parse's needs the tokenizer's decode)."""
    if not (block.closed and all(path.closed for path in block.paths)):
        return False
    return len({path_result(text_of(path.body)) for path in block.paths}) > 1


# --------------------------------------------------------------------------- spelling and reading

_TEXT_COMMAND = r"\\(?:text[a-z]*|mbox|mathrm)(?![a-zA-Z])"
_TEXT_WRAP = re.compile(rf"{_TEXT_COMMAND}\s*\{{([^{{}}]*)\}}")
_DELIMITERS = re.compile(r"\\[()\[\]]|(?<!\\)\$")  # \( \) \[ \] $, not \$ (a dollar)
_SPACING = re.compile(r"\\[!,;: ]\s*|\\(?:left|right)(?![a-zA-Z])|\\displaystyle")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_MATH_WORDS = r"(?:sqrt|pi|infinity|infty|inf|sin|cos|tan|log|ln|exp)\b"  # plain-text math, not words
_WORD = re.compile(  # two or more letters, or an abbreviation (i.e.), with a unit's power (cm^2)
    rf"(?<![\\a-zA-Z])(?<!\\begin\{{)(?<!\\end\{{)(?!{_MATH_WORDS})(?:[a-zA-Z]{{2,}}|[a-zA-Z](?:\.[a-zA-Z])+\.?)"
    r"(?:\s*\^\s*\{?\d\}?)?"
)
_PUNCTUATION = re.compile(r"^[\s,;:!?=/|&~]+|[\s,;:!?=/|&~.]+$")  # a leading dot is a decimal point (.5)
_OPENERS, _CLOSERS = ("(", "[", "{"), (")", "]", "}")
_BASE = re.compile(r"(?<![\w\\])\d[0-9A-Z]*_\{?\s*(\d+)\s*\}?")
_DECIMAL = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")


def normalize(answer: str) -> str:
    """A canonical spelling for string comparison: no spacing commands, math delimiters, `\\text{}` wrappers,
    dollar signs, degree marks, percent signs, thousands commas, spaces or closing full stop; `\\dfrac` is
    `\\frac`; lower case. A comma followed by a space separates numbers (`4, 500` is not `4500`)."""
    text = _TEXT_WRAP.sub(r"\1", answer)
    text = _SPACING.sub("", _DELIMITERS.sub("", text))
    text = _DEGREES.sub("", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = re.sub(r"\\?[$%]", "", text)
    text = _THOUSANDS.sub("", text)
    text = re.sub(r"\s+", "", text)
    return text.rstrip(".").lower()


def _trim(piece: str) -> str:
    """A piece of a line without the spaces, punctuation and unmatched brackets at its ends."""
    while True:
        piece = _PUNCTUATION.sub("", piece)
        unclosed = sum(map(piece.count, _OPENERS)) - sum(map(piece.count, _CLOSERS))
        if unclosed > 0 and piece[-1:] in _OPENERS:
            piece = piece[:-1]
        elif unclosed > 0 and piece[:1] in _OPENERS:
            piece = piece[1:]
        elif unclosed < 0 and piece[-1:] in _CLOSERS:
            piece = piece[:-1]
        elif unclosed < 0 and piece[:1] in _CLOSERS:
            piece = piece[1:]
        else:
            return piece


def read_answer(answer: str) -> str:
    """What an answer says, for math-verify (rules in the module docstring): without math delimiters, bold
    markers and text commands (their text is read, not hidden); when it holds words, the values between them,
    joined by ", " (`4 apples` -> `4`, `5 (not 4)` -> `5, 4`)."""
    text = _DELIMITERS.sub(" ", answer).replace("**", " ")  # bold markers, paired or left by _clean
    text = re.sub(_TEXT_COMMAND, " ", _TEXT_WRAP.sub(r" \1 ", text))  # a text with braces inside keeps them
    pieces = _WORD.split(text)
    values = [piece for piece in map(_trim, pieces) if _VALUE.search(piece)]
    return ", ".join(values) if len(pieces) > 1 and values else " ".join(text.split())


def _decimal(text: str) -> Decimal | None:
    """The value of a plain decimal number (`$1,600.00`, `-3.5`), or None."""
    spelled = normalize(text)
    return Decimal(spelled) if "%" not in text and _DECIMAL.fullmatch(spelled) else None


# --------------------------------------------------------------------------- math-verify, in the child


@lru_cache(maxsize=4096)
def _gold(reference: str):
    from math_verify import LatexExtractionConfig, parse

    return parse(f"\\boxed{{{reference}}}", [LatexExtractionConfig()], parsing_timeout=SOFT_TIMEOUT_S)


def _math_verify(answer: str, reference: str) -> bool:
    """math-verify's verdict on an answer as read by `read_answer` (runs in the child, on its main thread)."""
    from math_verify import LatexExtractionConfig, parse, verify

    latex = parse(f"\\boxed{{{answer}}}", [LatexExtractionConfig()], parsing_timeout=SOFT_TIMEOUT_S)
    return verify(_gold(reference), latex, timeout_seconds=SOFT_TIMEOUT_S)


def _serve() -> None:
    """The child's loop: read `[answer, reference]` JSON lines on stdin, write the verdicts on stdout."""
    replies, sys.stdout = sys.stdout, sys.stderr  # whatever else prints must not corrupt the replies
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # its timeout warnings would flood the log
    import math_verify  # noqa: F401  (imported before "ready", so that the first check is not slowed by it)

    print("ready", file=replies, flush=True)
    for line in sys.stdin:
        try:
            verdict = _math_verify(*json.loads(line))
        except Exception:  # math-verify is not meant to raise; if it does, the answer is not verified
            verdict = False
        print(json.dumps(verdict), file=replies, flush=True)


class _Verifier:
    """One child process running math-verify (`_serve`), shared by the threads of this process.

    A plain subprocess rather than `multiprocessing`: it does not re-import the caller's `__main__`, so
    training scripts need no guard and the child starts in about a second.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._proc = None
        self._pid = None  # the process that started the child
        self._failed = False  # the child could not start: do not try again on every call

    def check(self, answer: str, reference: str, timeout: float) -> bool | None:
        """math-verify's verdict, or None when there is none within `timeout` seconds."""
        with self._lock:
            if self._failed:
                return None
            if self._pid != os.getpid():  # a forked copy of the parent: the child is not ours to use
                self._proc = None
            try:
                if self._proc is None:
                    self._start()
                self._proc.stdin.write(json.dumps([answer, reference]) + "\n")
                self._proc.stdin.flush()
                reply = self._read_line(timeout)
                if reply is not None:
                    return bool(json.loads(reply))
                logger.warning("math-verify took over %.1fs on %r; restarting its process", timeout, answer[:80])
            except Exception as error:  # a dead or unstartable child: no verdict this time
                logger.warning("math-verify process failed (%r); restarting it", error)
            self._stop()
            return None

    def _read_line(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        return self._proc.stdout.readline() if ready else None

    def _start(self) -> None:
        package_root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-c", "from parallel_r1.answers import _serve; _serve()"]
        self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._pid = os.getpid()
        if self._read_line(STARTUP_TIMEOUT_S) != "ready\n":
            self._failed = True
            logger.error("math-verify process did not start; answers are compared as normalised strings only")
            raise RuntimeError("math-verify process did not start")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
        self._proc = None


_verifier = _Verifier()


# --------------------------------------------------------------------------- public checks


def answers_match(answer: str, reference: str, timeout: float = TIMEOUT_S) -> bool:
    """Whether an extracted answer equals a reference (already extracted). Never raises; bounded time."""
    try:
        if not answer or not reference or len(answer) > MAX_ANSWER_CHARS:
            return False
        spelled = normalize(answer)
        if spelled and spelled == normalize(reference):
            return True
        reading = read_answer(answer)
        bases = _BASE.findall(reading)
        if bases and bases != _BASE.findall(reference):
            return False
        numbers = _decimal(reading), _decimal(reference)
        if None not in numbers:
            return numbers[0] == numbers[1]
        return bool(_verifier.check(reading, reference, timeout))
    except Exception:  # the rule for rewards: a value, never an exception
        logger.exception("answer check failed on %r vs %r", str(answer)[:80], str(reference)[:80])
        return False


def is_correct(completion: str, reference, timeout: float = TIMEOUT_S) -> bool:
    """Whether the completion's final answer equals the reference (a dataset cell). Never raises."""
    answer = extract_answer(completion)
    if answer is None:
        return False
    return answers_match(answer, extract_reference(reference), timeout)
