"""Fuzz drill: adversarial completions through the tag language, answer extraction and every reward.

    python -m parallel_r1.testing.drills.fuzz --n 100000 --seed 0 --out benchmarks/results/fuzz.md

Input i of seed s is `draw_case(s, i)`: a completion of a random kind (`KINDS`: tag soup, deep nesting, tags
only, huge (50-200k characters), unterminated LaTeX, junk `Final Answer:` lines, unicode, blank, well-formed
traces and cut ones) with a random reference cell. `run_fuzz` puts each through the rules the library states:

- `language`: parse never raises and loses nothing, `serialize(parse(x)) == x` for the text and for its token
  ids; stats count every unit (`0 <= critical <= total == length`), blocks start in [0, 1), one paths count
  per block, `well_formed` and `has_parallel` agree with the errors; the text and id parses of the same
  completion report the same errors.
- `answers`: `extract_answer` gives None or a non-empty answer of at most `MAX_ANSWER_CHARS`,
  `extract_reference` a string, `is_correct` a bool.
- every reward of `rewards.REWARDS`, and the two schedules of `SCHEDULE_SPECS`, read from the text and (with
  the tiny tokenizer's tags) from the ids: one float per row within the declared `Reward.low..high` (a
  schedule: the union of its two rewards' ranges).

A failure is an exception, raised or caught and logged by the library (a reward row that comes back None is
also out of range), or a broken rule. The ids are cut to `max_tokens`, as TRL's `max_completion_length` cuts
a completion, and id-read rewards get the cut decoded, as TRL gives it. Every library call is timed; the
slowest are reported. math-verify runs in the child process of `answers` (started before timing), each check
bounded by `answers.TIMEOUT_S`; its timeouts are counted, not failures.
"""

from __future__ import annotations

import argparse
import heapq
import logging
import math
import os
import platform
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from tqdm.auto import tqdm

from ...answers import MAX_ANSWER_CHARS, extract_answer, extract_reference, is_correct
from ...rewards import REWARDS, Schedule, get_reward_funcs
from ...tags.language import TAGS, canonical_block, parse, serialize, stats
from ...tags.tokens import tag_vocab
from ..tiny import build_tokenizer

P, PC, A, AC, S, SC = TAGS
HUGE_CHARS = (50_000, 200_000)
MAX_TOKENS = 8192
SCHEDULE_SPECS = (
    "alternating(accuracy, tiered)",
    "switch(alternating(accuracy, tiered_diversity), accuracy_plus_parallel, at_step=200)",
)
KEEP_SLOWEST = 10
KEEP_FAILURES = 20

BLANKS = ("", " ", "\n", "\n\n", "\t", "\r\n")
WORDS = (
    "Let x = 3.",
    "so 2 + 2 = 4",
    "Wait,",
    "check: 7 * 6 = 42",
    "x",
    "7 ",
    "é",
    "🙂",
    "\u00a0",
    "\u200b",
    "\u3000",
)
NEAR_TAGS = ("<", ">", "</", "Path>", "<Path", "<parallel>", "< Path>", "<PATH>", "</Path >", "<Sum<Summary>mary>")
LATEX = (
    r"\boxed{12",
    r"$\frac{1}{",
    r"\boxed{\frac{3}{4}",
    r"\sqrt{",
    r"\left(",
    "^{",
    r"\boxed{",
    "{",
    "}",
    "$",
    "$$",
    r"\boxed{\boxed{5}}",
    r"\boxed{2} and \boxed{-3}",
    r"\frac{\frac{\frac{",
    r"\begin{pmatrix}1 & 2",
    r"\text{",
    "\\",
    r"\boxed{}",
    r"\boxed {x^2 - 1}",
    r"\infty",
    r"10^{10^{10^{10}}}",
)
FINALS = ("Final Answer:", "**Final Answer:**", "FINAL ANSWER :", "final answer**:**", "Final Answer", "####")
STEPS = ("Counting gives {a}.", "Checking: {a}.", "Let x = {a}, so x + 0 = {a}.", "Try small cases first.", "")


# --------------------------------------------------------------------------- the generator


def _char(rng: random.Random) -> str:
    """Any code point but a surrogate (a decoder never writes one), biased towards ASCII and the lower planes."""
    point = rng.randrange(rng.choice((0x80, 0x800, 0xD800, 0x110000)))
    return chr(point + 0x800 if 0xD800 <= point < 0xE000 else point)


def _junk(rng: random.Random, pieces: int) -> str:
    pool = LATEX + WORDS + NEAR_TAGS + TAGS + BLANKS
    return "".join(rng.choice(pool) for _ in range(pieces))


def _number(rng: random.Random) -> str:
    n = rng.randrange(-50, 10_000)
    return rng.choice((str(n), f"{n},000", f"{n}/7", f"\\frac{{{n}}}{{7}}", f"{n}.5", f"{n}\\%", "10^{100}"))


def _trace(rng: random.Random, answer: str) -> str:
    """A well-formed completion: 0-3 blocks of 2-4 paths, whitespace between the tags, then a final answer."""

    def gap() -> str:
        return rng.choice(("", "\n", " ", "\n\n"))

    out = rng.choice(("", "Let me think.\n", "We solve it step by step. "))
    for _ in range(rng.randint(0, 3)):
        paths = "".join(f"{gap()}{A}{rng.choice(STEPS).format(a=answer)}{AC}" for _ in range(rng.randint(2, 4)))
        out += f"{P}{paths}{gap()}{PC}{gap()}{S}Both give {answer}.{SC}{rng.choice(BLANKS)}"
    finals = (f"Final Answer: {answer}", f"The answer is $\\boxed{{{answer}}}$.", f"**Final Answer:** {answer}.")
    return out + rng.choice(finals)


def _tag_soup(rng: random.Random, answer: str) -> str:
    pool = rng.choice((TAGS, TAGS + WORDS + BLANKS, TAGS + NEAR_TAGS + LATEX + WORDS + (answer,)))
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, 80)))


def _nested(rng: random.Random, answer: str) -> str:
    depth = rng.choice((1, 2, 3, 10, 100, 1000))
    opener = rng.choice((P + A, P, A, S, P + A + "x" + AC + A))
    closer = rng.choice((AC + PC, PC, AC, SC, ""))
    inner = rng.choice(WORDS + LATEX + (f"Final Answer: {answer}",))
    return opener * depth + inner + closer * rng.randint(0, depth)


def _only_tags(rng: random.Random, answer: str) -> str:
    if rng.random() < 0.2:
        return canonical_block([""] * rng.randint(0, 5), "") * rng.randint(1, 50)
    return "".join(rng.choice(TAGS) for _ in range(rng.choice((1, 2, 6, 30, 300, 1000))))


def _huge(rng: random.Random, answer: str) -> str:
    """Exactly 50-200k characters: one unit repeated (a trace, text, a tag, braces, markers, unicode)."""
    size = rng.randint(*HUGE_CHARS)
    start = rng.choice(("", P + A, S, r"\boxed{"))
    unit = rng.choice(
        (
            _trace(rng, answer),
            "Let x = 3. ",
            PC,
            AC + A,
            "{",
            r"\boxed{",
            "Final Answer: ",
            "".join(_char(rng) for _ in range(500)),
        )
    )
    end = rng.choice(("", f"\nFinal Answer: {answer}", f"\\boxed{{{answer}}}"))
    body = start + unit * ((size - len(start)) // len(unit) + 1)
    return body[: size - len(end)] + end


def _latex(rng: random.Random, answer: str) -> str:
    junk = _junk(rng, rng.randint(1, 12))
    return rng.choice(
        (
            f"Final Answer: {junk}",
            f"{_trace(rng, answer)}\n{junk}",
            f"\\boxed{{{junk}",
            f"{junk}\\boxed{{{answer}}}{junk}",
            junk + "{" * rng.randint(0, 5000),
            f"$\\boxed{{{answer}" + "}" * rng.randint(0, 3),
        )
    )


def _final_answer(rng: random.Random, answer: str) -> str:
    lines = []
    for _ in range(rng.randint(1, 4)):
        rest = rng.choice(
            (
                answer,
                "",
                " ",
                f"\n\n{answer}",
                _junk(rng, rng.randint(1, 6)),
                "x" * rng.choice((499, 500, 501, 5000)),
                f"${answer}$.",
                f"**{answer}**",
                "".join(_char(rng) for _ in range(20)),
                r"\boxed{" + answer,
            )
        )
        lines.append(rng.choice(FINALS) + rest)
    return rng.choice(("\n", "", " ")).join(lines)


def _unicode(rng: random.Random, answer: str) -> str:
    size = rng.choice((1, 10, 200, 2000))
    return "".join(rng.choice(TAGS) if rng.random() < 0.1 else _char(rng) for _ in range(size))


def _blank(rng: random.Random, answer: str) -> str:
    return rng.choice(("", " ", "\n" * rng.randint(1, 1000), "\u00a0", "\u3000 \t", "\r\n" * 3, "\x00"))


def _cut(rng: random.Random, answer: str) -> str:
    """A well-formed trace cut short (as a rollout at its length limit), or with one tag dropped, doubled or added."""
    text = _trace(rng, answer)
    tag = rng.choice(TAGS)
    at = rng.randint(0, len(text))
    return rng.choice(
        (text[:at], text.replace(tag, "", 1), text.replace(tag, tag + tag, 1), text[:at] + tag + text[at:])
    )


KINDS = {  # name: (weight, generator)
    "tag_soup": (22, _tag_soup),
    "nested": (8, _nested),
    "only_tags": (10, _only_tags),
    "huge": (0.5, _huge),
    "latex": (14, _latex),
    "final_answer": (14, _final_answer),
    "unicode": (8, _unicode),
    "blank": (3, _blank),
    "well_formed": (12, lambda rng, answer: _trace(rng, answer)),
    "cut": (8, _cut),
}


def _reference(rng: random.Random, answer: str):
    """A dataset cell: the answer in the forms datasets write it, or junk, None, an integer."""
    return rng.choice(
        (answer, answer, f"#### {answer}", f"\\boxed{{{answer}}}", None, "", 42, _junk(rng, 3), f"{answer}.0")
    )


@dataclass(frozen=True)
class Case:
    index: int
    kind: str
    text: str
    reference: object
    conversational: bool  # TRL's chat form: the completion as a list of messages
    step: int  # trainer_state.global_step, for the schedules


def draw_case(seed: int, index: int) -> Case:
    """Input `index` of the drill with `seed`: the same on every run and machine (a failure is reproducible)."""
    rng = random.Random(f"{seed}:{index}")
    kind = rng.choices(list(KINDS), weights=[w for w, _ in KINDS.values()])[0]
    answer = _number(rng)
    text = KINDS[kind][1](rng, answer)
    return Case(index, kind, text, _reference(rng, answer), rng.random() < 0.2, rng.randrange(500))


# --------------------------------------------------------------------------- the checks


def declared_range(reward) -> tuple[float, float]:
    """A reward's declared `low..high`; a schedule's is the union of its two rewards' ranges."""
    if isinstance(reward, Schedule):
        (a_low, a_high), (b_low, b_high) = declared_range(reward.a), declared_range(reward.b)
        return min(a_low, b_low), max(a_high, b_high)
    return reward.low, reward.high


def _value_problem(values, low: float, high: float) -> str | None:
    if not isinstance(values, list) or len(values) != 1:
        return f"returned {values!r} for one completion"
    value = values[0]
    if not isinstance(value, float) or math.isnan(value) or not low <= value <= high:
        return f"value {value!r} outside its declared range {low}..{high}"
    return None


def _stats_problem(parsed, shape, length: int) -> str | None:
    if parsed.length != length or shape.total != length:
        return f"total {shape.total} (parsed length {parsed.length}) for {length} units"
    if not 0 <= shape.critical <= shape.total:
        return f"critical {shape.critical} outside 0..{shape.total}"
    if not all(0 <= x < 1 for x in shape.block_positions):
        return f"block positions {shape.block_positions} outside [0, 1)"
    if len(shape.paths_per_block) != shape.num_blocks:
        return f"{len(shape.paths_per_block)} path counts for {shape.num_blocks} blocks"
    if shape.well_formed != (not parsed.errors) or shape.has_parallel != (shape.num_blocks > 0 and shape.well_formed):
        return "well_formed/has_parallel disagree with the errors and blocks"
    if any(not 0 <= e.at <= length for e in parsed.errors):
        return "an error outside the completion"
    return None


def _no_metric(name: str, value: float) -> None:
    """TRL's `log_metric`, which the schedules call; the drill keeps nothing."""


@dataclass(frozen=True)
class Call:
    name: str
    seconds: float
    index: int
    kind: str
    chars: int
    tokens: int | None  # for a call on the ids

    @property
    def size(self) -> str:
        return f"{self.chars:,} chars" + (f", {self.tokens:,} tokens" if self.tokens is not None else "")


@dataclass(frozen=True)
class Failure:
    name: str
    index: int
    kind: str
    chars: int
    problem: str
    exception: bool  # raised or logged, rather than a broken rule


@dataclass
class FunctionStats:
    calls: int = 0
    seconds: float = 0.0
    slowest: Call | None = None


@dataclass
class FuzzReport:
    n: int
    seed: int
    max_tokens: int
    kinds: Counter = field(default_factory=Counter)
    chars: int = 0  # all inputs together
    max_chars: int = 0
    calls: int = 0
    seconds: float = 0.0
    functions: dict = field(default_factory=dict)  # name -> FunctionStats
    slowest: list = field(default_factory=list)  # Call, slowest first
    failures: list = field(default_factory=list)  # the first KEEP_FAILURES
    exceptions: int = 0
    violations: int = 0
    warnings: Counter = field(default_factory=Counter)  # logged warning (its format string) -> count

    @property
    def no_exception(self) -> bool:
        return self.exceptions == 0

    @property
    def ok(self) -> bool:
        return self.exceptions == 0 and self.violations == 0


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Drill:
    def __init__(self, report: FuzzReport, tokenizer):
        self.report, self.tokenizer = report, tokenizer
        self.vocab = tag_vocab(tokenizer)
        specs = list(REWARDS) + list(SCHEDULE_SPECS)
        self.text_rewards = get_reward_funcs(specs)
        self.id_rewards = get_reward_funcs(specs, tokenizer)
        self.log = _Records()
        self.heap: list = []  # (seconds, order, Call): the KEEP_SLOWEST slowest so far
        self.case: Case | None = None
        self.tokens: int | None = None

    def call(self, name: str, on_ids: bool, func, *args, **kwargs) -> tuple[bool, object]:
        """Run and time one library call; (False, None) if it raised. Errors it logged are failures too."""
        self.log.records.clear()
        start = time.perf_counter()
        try:
            ok, result = True, func(*args, **kwargs)
        except Exception as error:
            ok, result = False, None
            self.fail(name, f"raised {type(error).__name__}: {error}", exception=True)
        self.time(name, time.perf_counter() - start, on_ids)
        for record in self.log.records:
            if record.levelno >= logging.ERROR:
                self.fail(name, f"logged: {record.getMessage()[:300]}", exception=True)
            else:
                self.report.warnings[str(record.msg)] += 1
        return ok, result

    def time(self, name: str, seconds: float, on_ids: bool) -> None:
        report, case = self.report, self.case
        report.calls += 1
        record = Call(name, seconds, case.index, case.kind, len(case.text), self.tokens if on_ids else None)
        function = report.functions.setdefault(name, FunctionStats())
        function.calls += 1
        function.seconds += seconds
        if function.slowest is None or seconds > function.slowest.seconds:
            function.slowest = record
        entry = (seconds, report.calls, record)
        if len(self.heap) < KEEP_SLOWEST:
            heapq.heappush(self.heap, entry)
        elif seconds > self.heap[0][0]:
            heapq.heapreplace(self.heap, entry)

    def fail(self, name: str, problem: str | None, exception: bool = False) -> None:
        if problem is None:
            return
        report, case = self.report, self.case
        if exception:
            report.exceptions += 1
        else:
            report.violations += 1
        if len(report.failures) < KEEP_FAILURES:
            report.failures.append(Failure(name, case.index, case.kind, len(case.text), problem, exception))

    def run(self, case: Case) -> None:
        self.case, self.tokens = case, None
        self.report.kinds[case.kind] += 1
        self.report.chars += len(case.text)
        self.report.max_chars = max(self.report.max_chars, len(case.text))
        by_text = self.check_format(case.text, on_ids=False)
        self.check_answers(case)
        self.check_rewards(self.text_rewards, case.text, None, on_ids=False)
        full = self.tokenizer.encode(case.text, add_special_tokens=False, verbose=False)
        ids = full[: self.report.max_tokens]
        self.tokens = len(ids)
        by_ids = self.check_format(ids, on_ids=True)
        if by_text is not None and by_ids is not None and len(full) == len(ids):
            text_codes, id_codes = [e.code for e in by_text.errors], [e.code for e in by_ids.errors]
            if text_codes != id_codes:
                self.fail("language.parse [ids]", f"id parse reports {id_codes}, text parse {text_codes}")
        decoded = self.tokenizer.decode(ids, skip_special_tokens=True)
        self.check_rewards(self.id_rewards, decoded, ids, on_ids=True)

    def check_format(self, content, on_ids: bool):
        """Parse, serialize and measure one completion (text, or ids); the parse, or None if it raised."""
        suffix, vocab = (" [ids]", self.vocab) if on_ids else ("", None)
        ok, parsed = self.call("language.parse" + suffix, on_ids, parse, content, vocab)
        if not ok:
            return None
        ok, back = self.call("language.serialize" + suffix, on_ids, serialize, parsed, vocab)
        if ok and back != (tuple(content) if on_ids else content):
            self.fail("language.serialize" + suffix, "serialize(parse(x)) != x")
        ok, shape = self.call("language.stats" + suffix, on_ids, stats, parsed)
        if ok:
            self.fail("language.stats" + suffix, _stats_problem(parsed, shape, len(content)))
        return parsed

    def check_answers(self, case: Case) -> None:
        ok, answer = self.call("answers.extract_answer", False, extract_answer, case.text)
        if ok and not (answer is None or (isinstance(answer, str) and 0 < len(answer) <= MAX_ANSWER_CHARS)):
            self.fail("answers.extract_answer", f"answer {answer!r:.80} is not None or 1..{MAX_ANSWER_CHARS} chars")
        ok, reference = self.call("answers.extract_reference", False, extract_reference, case.reference)
        if ok and not isinstance(reference, str):
            self.fail("answers.extract_reference", f"reference {reference!r:.80} is not a string")
        ok, correct = self.call("answers.is_correct", False, is_correct, case.text, case.reference)
        if ok and not isinstance(correct, bool):
            self.fail("answers.is_correct", f"verdict {correct!r} is not a bool")

    def check_rewards(self, rewards: list, text: str, ids, on_ids: bool) -> None:
        case = self.case
        completion = [{"role": "assistant", "content": text}] if case.conversational else text
        prompt = [{"role": "user", "content": "?"}] if case.conversational else "?"
        state = SimpleNamespace(global_step=case.step)
        suffix = " [ids]" if on_ids else ""
        for reward in rewards:
            name = f"reward {reward.__name__}{suffix}"
            ok, values = self.call(
                name,
                on_ids,
                reward,
                prompts=[prompt],
                completions=[completion],
                completion_ids=[ids],
                answer=[case.reference],
                trainer_state=state,
                log_metric=_no_metric,
            )
            if ok:
                self.fail(name, _value_problem(values, *declared_range(reward)))


def run_fuzz(
    n: int, seed: int = 0, tokenizer=None, max_tokens: int = MAX_TOKENS, progress: bool = False
) -> FuzzReport:
    """Push inputs 0..n-1 of `seed` through every check (module docstring); the tiny tokenizer by default.

    Raises RuntimeError if math-verify does not run, since the answer checks would then never reach it."""
    tokenizer = build_tokenizer() if tokenizer is None else tokenizer
    if not is_correct("Final Answer: 1/2", "0.5"):  # starts the math-verify process before any timing
        raise RuntimeError("math-verify does not run (answers._verifier); the drill would not reach it")
    report = FuzzReport(n, seed, max_tokens)
    drill = _Drill(report, tokenizer)
    logger = logging.getLogger("parallel_r1")
    propagate = logger.propagate
    logger.addHandler(drill.log)
    logger.propagate = False  # the records are the report's; the progress bar stays readable
    start = time.perf_counter()
    try:
        for index in tqdm(range(n), desc="fuzz", unit="input", disable=not progress):
            drill.run(draw_case(seed, index))
    finally:
        logger.removeHandler(drill.log)
        logger.propagate = propagate
    report.seconds = time.perf_counter() - start
    report.slowest = [record for _, _, record in sorted(drill.heap, reverse=True)]
    return report


# --------------------------------------------------------------------------- the result file


def to_markdown(report: FuzzReport, command: str) -> str:
    yes = {True: "yes", False: "no"}
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in report.kinds.most_common())
    lines = [
        "# Fuzz drill",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; Python {platform.python_version()} on "
        f"{platform.platform()} ({platform.machine()}), {os.cpu_count()} CPUs (shared with other jobs: read the "
        "times as upper bounds).",
        f"Command: `{command}`.",
        f"Inputs: {report.n:,} ({kinds}); {report.chars:,} characters in all, the largest {report.max_chars:,}; "
        f"ids cut to {report.max_tokens:,} tokens.",
        f"Calls: {report.calls:,} in {report.seconds:,.1f} s ({report.n / max(report.seconds, 1e-9):,.1f} inputs/s).",
        "",
        f"- No exception: {yes[report.no_exception]} ({report.exceptions:,} raised or logged).",
        f"- Every value in its declared range and every rule kept: {yes[report.violations == 0]} "
        f"({report.violations:,} broken).",
    ]
    lines += [f"- Logged warning, {count:,} times: `{message}`" for message, count in report.warnings.most_common()]
    lines += [
        "",
        "## The 10 slowest calls",
        "",
        "| # | call | seconds | input | kind | size |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {rank} | {c.name} | {c.seconds:.3f} | {c.index} | {c.kind} | {c.size} |"
        for rank, c in enumerate(report.slowest, 1)
    ]
    lines += [
        "",
        "## Per function",
        "",
        "| call | calls | mean ms | slowest s | its input | kind | size |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, f in sorted(report.functions.items(), key=lambda item: -item[1].slowest.seconds):
        lines.append(
            f"| {name} | {f.calls:,} | {1000 * f.seconds / f.calls:.3f} | {f.slowest.seconds:.3f} "
            f"| {f.slowest.index} | {f.slowest.kind} | {f.slowest.size} |"
        )
    if report.failures:
        lines += [
            "",
            f"## Failures (the first {len(report.failures)})",
            "",
            "| call | input | kind | chars | problem |",
        ]
        lines.append("|---|---|---|---|---|")
        lines += [f"| {f.name} | {f.index} | {f.kind} | {f.chars:,} | {f.problem} |" for f in report.failures]
    lines += ["", f"Input i is `parallel_r1.testing.drills.fuzz.draw_case({report.seed}, i)`."]
    return "\n".join(lines) + "\n"


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="how many inputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="where the ids are cut")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fuzz.md"))
    args = parser.parse_args(argv)
    report = run_fuzz(args.n, args.seed, max_tokens=args.max_tokens, progress=True)
    command = (
        f"python -m parallel_r1.testing.drills.fuzz --n {args.n} --seed {args.seed} --max-tokens {args.max_tokens}"
    )
    result = to_markdown(report, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(result, encoding="utf-8")
    print(result)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
