"""The demo's task: `a*b+c*d` with digits 1-9, and a block that can pay as a vote of independent attempts.

A harder variant (`VARIANTS["two-digit"]`) gives the first factor two digits (`17*8+3*4`): the same working, the same
characters, a product the small model gets wrong more often. Everything below holds for both, with two differences of
degree: few of the variant's problems are easy (answers of at most `EASY_MAX`: 1.9% of them, 42% of the demo's), and
its slips (one to nine, or ten) are small beside its three-digit products.

A plain solution (what the base is pretrained on) works out the two products, one per line, then their sum. A
parallel trace makes `NUM_PATHS` independent attempts in the paths of one block, and the summary states the result
most of them reached, as the final answer:

    7*8+3*4  ->  <Parallel><Path>7*8=56 / 3*4=12 / 56+12=68</Path><Path>...=68</Path><Path>7*8=58 / ... =70</Path>
                 </Parallel> / <Summary>Final Answer: 68</Summary>                        (/ is a line break)

Why this gives the method a fair chance: the small model sampled at temperature 1 gets one attempt wrong now and then,
and its mistakes on one problem are partly independent, so a vote of three isolated attempts is right more often
than one (at 0.8 a path, about 0.9). The summary has real work to do (compare, state the majority), and the paths
can do what Unseen paths can: independent attempts that see the same context, not halves of a split. (Under Unseen
the paths sit at the same positions, so the summary cannot tell which came first: it states the vote, not a list.)
What the plain base can already do is one attempt; a plain RL run can only make that attempt better. The block
costs about three times the tokens (T), not three times the critical path (D).

The teacher also writes a plain solution for a share of the problems (`TEACHER_PLAIN`), so that after SFT the model
can still answer without a block, and a reward that does not pay for blocks can let them die, as in the paper. Its
attempts slip now and then (a product off by one to nine): the summary's vote outvotes a lone slip, and a trace
whose vote is wrong is rejected by the cold-start filters, as a model teacher's wrong answer would be. Now and then
it leaves out `</Summary>` (a malformed trace for the filters).

A third kind of answer is off by default (`TEACHER_LATE = 0`): a plain working first, then a block whose paths check
it (the paper's late, verification block; the working's result counts in the vote and wins a tie). With 45% of
answers so, SFT keeps the plain habit, but RL moved the blocks earlier, not later (docs/demo.md, "Designs tried").

Problems are easy when the answer is at most `EASY_MAX`, hard otherwise. The cold start asks about problems of any
difficulty, RL trains on hard ones, and the held-out test problems are hard ones that no training file holds.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

EASY_MAX = 40  # an easy problem has an answer of at most this
NUM_PATHS = 3  # independent attempts in a teacher's block
WIDTHS = (2, 3, 4)  # the widths of `varied_width_teacher`'s blocks
TEACHER_PLAIN = 0.15  # share of teacher answers with no block (the plain habit stays alive after SFT)
TEACHER_LATE = 0.0  # share of teacher answers that work the problem out first, then check it in a block
TEACHER_SLIP = 0.1  # chance that one attempt of the teacher gets its first product wrong
TEACHER_MALFORMED = 0.05  # share of teacher traces with no </Summary>
SUMMARY_LISTS_RESULTS = False  # the teacher's summary lists the paths' results, in order, before the answer
VOTE_DRILLS = 2 / 3  # share of `vote_teacher`'s answers that are vote drills
DRILL_ONE_SLIPPED, DRILL_TWO_ALIKE = 0.4, 0.3  # shares of drills with one attempt slipped, two alike (the rest: none)
SLIPS_AT = ("first", "second", "sum")  # where a drill's attempt may slip: either product, or the sum
VARIANTS = {"one-digit": range(1, 10), "two-digit": range(10, 100)}  # the task's first factor: the demo's, the harder
DEFAULT_VARIANT = "one-digit"  # the variant every run uses unless told otherwise
_PROBLEM = re.compile(r"^\s*([1-9]\d*)\*([1-9])\+([1-9])\*([1-9])\s*$")  # the first factor checked on `VARIANTS`


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    c: int
    d: int

    @classmethod
    def parse(cls, text: str) -> Problem:
        match = _PROBLEM.match(text)
        if not match or not any(int(match[1]) in first for first in VARIANTS.values()):
            firsts = " or ".join(f"{first.start}-{first.stop - 1}" for first in VARIANTS.values())
            raise ValueError(f"not a demo problem (a*b+c*d, a in {firsts}, the others 1-9): {text!r}")
        return cls(*map(int, match.groups()))

    @property
    def text(self) -> str:
        return f"{self.a}*{self.b}+{self.c}*{self.d}"

    @property
    def answer(self) -> int:
        return self.a * self.b + self.c * self.d

    @property
    def easy(self) -> bool:
        return self.answer <= EASY_MAX

    def working(self, slip: int = 0, at: str = "first") -> tuple[str, int]:
        """(one solution, its result): the two products, one per line, then their sum; `slip` (a mistake) is added
        to the line `at` names (one of `SLIPS_AT`), no value going under 0."""
        if at not in SLIPS_AT:
            raise ValueError(f"a slip is at one of {SLIPS_AT}, got {at!r}")
        p = max(self.a * self.b + (slip if at == "first" else 0), 0)
        q = max(self.c * self.d + (slip if at == "second" else 0), 0)
        total = max(p + q + (slip if at == "sum" else 0), 0)
        return f"{self.a}*{self.b}={p}\n{self.c}*{self.d}={q}\n{p}+{q}={total}", total

    def plain_solution(self, slip: int = 0) -> str:
        lines, result = self.working(slip)
        return f"{lines}\nFinal Answer: {result}"

    def parallel_trace(
        self,
        slips: tuple[int, ...] = (0,) * NUM_PATHS,
        close_summary: bool = True,
        first: int | None = None,
        listed: bool = False,
        at: tuple[str, ...] | None = None,
    ) -> str:
        """A block of one attempt a path (`slips`: each one's mistake, 0 for none, in its first product or where
        `at` says), a summary that states the result most of them reached (the first of them on a tie), and that as
        the answer line. With `first` (its slip), a plain working comes before the block, whose paths then check it:
        its result counts in the vote and wins a tie. `listed`: the summary first lists the paths' results in order
        (`68 70 68`), then the answer line."""
        attempts = [
            self.working(slip, where) for slip, where in zip(slips, at or ("first",) * len(slips), strict=True)
        ]
        lead, results = "", [result for _, result in attempts]
        if first is not None:
            lines, result = self.working(first)
            lead, results = f"{lines}\n", [result, *results]
        vote = majority(results)
        paths = "".join(f"<Path>{lines}</Path>" for lines, _ in attempts)
        end = "</Summary>" if close_summary else ""
        listing = " ".join(str(result) for _, result in attempts) + "\n" if listed else ""
        return f"{lead}<Parallel>{paths}</Parallel>\n<Summary>{listing}Final Answer: {vote}{end}"


def slip_size(rng: random.Random) -> int:
    """A mistake in a first product: off by one to nine, up or down."""
    return rng.choice([-1, 1]) * rng.randint(1, 9)


def draw_slip(rng: random.Random) -> int:
    """One attempt's mistake: with chance `TEACHER_SLIP` a `slip_size`, else 0."""
    return slip_size(rng) if rng.random() < TEACHER_SLIP else 0


def majority(values: list[int]) -> int:
    """The value most of `values` agree on; on a tie, the first of the tied values to appear."""
    counts = Counter(values)
    return max(values, key=lambda v: (counts[v], -values.index(v)))


def all_problems(variant: str = DEFAULT_VARIANT) -> list[Problem]:
    """Every problem of a variant of the task (`VARIANTS`: the range of its first factor)."""
    digit = range(1, 10)
    return [Problem(*numbers) for numbers in itertools.product(VARIANTS[variant], digit, digit, digit)]


def asked(messages: list) -> Problem:
    """The problem in the last user turn of a chat (what a cold-start teacher is sent)."""
    from ...data.loaders import problem_text

    return Problem.parse(problem_text(messages))


def teacher(messages: list, seed: int, widths: tuple[int, ...] = (NUM_PATHS,)) -> str:
    """The cold-start teacher (`backend: function`): for the problem in the last user turn, a plain solution with
    chance `TEACHER_PLAIN`, a working checked by a block with chance `TEACHER_LATE`, otherwise a block first; a
    block has `NUM_PATHS` attempts (one of `widths`, drawn evenly, when there are several) voted on in the summary.
    Each attempt slips (off by one to nine) with chance `TEACHER_SLIP`, and a trace now and then leaves `</Summary>`
    out. Seeded by the request."""
    problem = asked(messages)
    rng = random.Random(seed)

    kind = rng.random()
    if kind < TEACHER_PLAIN:
        return problem.plain_solution(draw_slip(rng))
    first = draw_slip(rng) if kind < TEACHER_PLAIN + TEACHER_LATE else None
    width = widths[0] if len(widths) == 1 else rng.choice(widths)
    slips = tuple(draw_slip(rng) for _ in range(width))
    return problem.parallel_trace(
        slips, close_summary=rng.random() >= TEACHER_MALFORMED, first=first, listed=SUMMARY_LISTS_RESULTS
    )


def vote_drill(problem: Problem, rng: random.Random) -> str:
    """A block whose slips are planted so that its summary must count: one attempt slipped (the majority is right),
    two slipped alike (the majority is their wrong value), or none (`DRILL_ONE_SLIPPED`, `DRILL_TWO_ALIKE`, the
    rest). A slip is off by one to nine, or by ten (a carry) 30% of the time, in either product or in the sum
    (`SLIPS_AT`), where the model's own slips are."""
    size = rng.choice([-1, 1]) * (10 if rng.random() < 0.3 else rng.randint(1, 9))
    at = rng.choice(SLIPS_AT)
    kind, odd = rng.random(), rng.randrange(NUM_PATHS)
    if kind < DRILL_ONE_SLIPPED:
        slipped = [i == odd for i in range(NUM_PATHS)]
    elif kind < DRILL_ONE_SLIPPED + DRILL_TWO_ALIKE:
        slipped = [i != odd for i in range(NUM_PATHS)]
    else:
        slipped = [False] * NUM_PATHS
    return problem.parallel_trace(tuple(size if s else 0 for s in slipped), at=(at,) * NUM_PATHS)


def vote_teacher(messages: list, seed: int) -> str:
    """`teacher`, or with chance `VOTE_DRILLS` a `vote_drill`: the cold start of `make demo-vote`, whose answers hold
    a split block about 2.4 times as often as `teacher`'s (55% against 23%). A drill whose majority slipped states the
    slipped value, so the run keeps the answers that are wrong (`require_correct: false`), and its SFT leaves the
    paths of a split block out of the loss (`disagreeing_paths_in_loss: false`)."""
    rng = random.Random(seed)
    if rng.random() < VOTE_DRILLS:
        return vote_drill(asked(messages), rng)
    return teacher(messages, rng.randrange(2**32))


def varied_width_teacher(messages: list, seed: int) -> str:
    """`teacher` with blocks of 2, 3 or 4 attempts (`WIDTHS`): the width demo's cold start, after which the model
    has seen every width it may choose."""
    return teacher(messages, seed, WIDTHS)


def plain_teacher(messages: list, seed: int) -> str:
    """`teacher` with a plain solution for every problem (its attempt slips as often): the cold start of a plain SFT
    run, the control that gets the teacher's correct traces without blocks."""
    return asked(messages).plain_solution(draw_slip(random.Random(seed)))


def block_teacher(messages: list, seed: int) -> str:
    """`plain_teacher`'s solution (the same attempt, slipped as often) written `NUM_PATHS` times, once in each path of
    a block, with the summary stating it: the teacher's plain solutions in the form the paths will use, with no vote
    to learn (`scripts/demo.py --strong --strong_start blocks`: arm c's first SFT stage learns the working behind
    the tags)."""
    slip = draw_slip(random.Random(seed))
    return asked(messages).parallel_trace((slip,) * NUM_PATHS)


def split_problems(
    seed: int = 0, num_test: int = 200, num_cold_start: int = 3000, variant: str = DEFAULT_VARIANT
) -> dict[str, list[Problem]]:
    """The problems of each stage of a variant of the task, drawn once (seeded):

    - `test`: `num_test` hard problems, held out from everything else;
    - `train`: all the others (the base's pretraining);
    - `cold_start`: `num_cold_start` of them, of any difficulty (the teacher's questions);
    - `rl`: the hard ones among the rest (GRPO's problems, as the paper's RL set is harder than its cold start);
    - `rl_easy`: the easy ones among the rest (the width demo's contrast).
    """
    problems = all_problems(variant)
    random.Random(seed).shuffle(problems)
    test = [p for p in problems if not p.easy][:num_test]
    held_out = set(test)
    train = [p for p in problems if p not in held_out]
    cold_start = train[:num_cold_start]
    rl = [p for p in train[num_cold_start:] if not p.easy]
    rl_easy = [p for p in train[num_cold_start:] if p.easy]
    return {"test": test, "train": train, "cold_start": cold_start, "rl": rl, "rl_easy": rl_easy}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def write_data(
    folder: str | Path, seed: int = 0, num_test: int = 200, variant: str = DEFAULT_VARIANT
) -> dict[str, Path]:
    """The demo's data files in `folder`, for a variant of the task:

    - `pretrain/train.jsonl`: every training problem with its plain solution, as chat prompt-completion rows (the
      corpus of the tiny base, for `trl sft`);
    - `cold_start.jsonl`, `rl.jsonl`, `rl_easy.jsonl`, `test.jsonl`: problems as `question`, `answer`
      (`split_problems`).
    """
    folder = Path(folder)
    splits = split_problems(seed, num_test, variant=variant)
    files = {
        "pretrain": write_jsonl(
            folder / "pretrain" / "train.jsonl",
            [
                {
                    "prompt": [{"role": "user", "content": p.text}],
                    "completion": [{"role": "assistant", "content": p.plain_solution()}],
                }
                for p in splits["train"]
            ],
        )
    }
    for name in ("cold_start", "rl", "rl_easy", "test"):
        rows = [{"question": p.text, "answer": str(p.answer)} for p in splits[name]]
        files[name] = write_jsonl(folder / f"{name}.jsonl", rows)
    return files


def last_number(text: str | None) -> str | None:
    """The last run of digits in `text` (a path's result, a summary's answer), or None."""
    return (re.findall(r"\d+", text or "") or [None])[-1]


def vote_report(evaluations: dict) -> str:
    """A table, per evaluated model (label -> evaluation folder): how many answers hold a block, how often one path
    of a block reaches the right result, how often the block's answer is right (the vote's gain is the difference),
    how often the paths of a block disagree, how often no more than half of them are right (the blocks no faithful
    vote can save), how often the answers without a block are right, and how faithful the summary is: in the blocks
    where most paths agree and the others do not (two against one, for three paths), how often the summary states
    the majority's value, and how often a value that no path reached."""
    from ...durable import read_lines
    from ...tags.language import parse

    lines = [
        "| Model | Answers | With a block % | Path right % | Block answer right % | Vote gain (points) "
        "| Paths disagree % | No right majority % | Plain answer right % | Majority against minority "
        "| Summary states the majority % | Summary states no path's value % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    share = lambda n, of: f"{100 * n / of:.1f}" if of else "-"  # noqa: E731
    for label, folder in evaluations.items():
        paths = paths_right = blocks = disagree = unsaved = split = faithful = invented = 0
        block_answers, plain_answers = [], []
        for record in read_lines(Path(folder) / "completions.jsonl"):
            parsed = parse(record["completion"])
            (block_answers if parsed.blocks else plain_answers).append(record["correct"])
            for block in parsed.blocks:
                results = [last_number(path.body) for path in block.paths]
                paths += len(results)
                right = sum(r == str(record["reference"]) for r in results)
                paths_right += right
                unsaved += 2 * right <= len(results)
                blocks += 1
                disagree += len(set(results)) > 1
                value, count = Counter(results).most_common(1)[0]
                if len(results) / 2 < count < len(results):  # a majority, and a minority against it
                    split += 1
                    stated = last_number(block.summary)
                    faithful += stated == value
                    invented += stated not in results
        total = len(block_answers) + len(plain_answers)
        gain = f"{100 * (sum(block_answers) / len(block_answers) - paths_right / paths):+.1f}" if paths else "-"
        lines.append(
            f"| {label} | {total} | {share(len(block_answers), total)} | {share(paths_right, paths)} "
            f"| {share(sum(block_answers), len(block_answers))} | {gain} | {share(disagree, blocks)} "
            f"| {share(unsaved, blocks)} | {share(sum(plain_answers), len(plain_answers))} | {split} "
            f"| {share(faithful, split)} | {share(invented, split)} |"
        )
    return "\n".join(lines)


def token_table(states: dict) -> str:
    """A table, per RL run (label -> its trainer_state.json): steps, completions a step, the mean completion length
    over the logged steps (inserted tags included) and the tokens TRL counted (`num_tokens` at the end: prompts and
    completions, each generated batch once)."""
    lines = [
        "| Run | Steps | Completions a step | Mean completion length | Tokens (TRL's num_tokens) |",
        "|---|---|---|---|---|",
    ]
    for label, path in states.items():
        state = json.loads(Path(path).read_text())
        logs = [entry for entry in state["log_history"] if "completions/mean_length" in entry]
        length = sum(entry["completions/mean_length"] for entry in logs) / len(logs)
        tokens = max(entry.get("num_tokens", 0) for entry in state["log_history"])
        lines.append(
            f"| {label} | {state['global_step']} | {state['train_batch_size']} | {length:.1f} | {tokens:,.0f} |"
        )
    return "\n".join(lines)


def corpus() -> list[str]:
    """What the base's tokenizer is trained on: problems and plain solutions (of the demo's task: the harder variant
    is written in the same characters, each digit a token of its own)."""
    return [f"{p.text}\n{p.plain_solution()}" for p in all_problems()[::7]]


def write_untrained_base(folder: str | Path, seed: int = 0) -> Path:
    """The demo's untrained "base": a tokenizer trained on the task's text (one token per digit, no tags yet) and
    a randomly initialised 4-layer Qwen3 of width 128 (about 0.6M parameters)."""
    from ..tiny import build_model, build_tokenizer

    folder = Path(folder)
    tokenizer = build_tokenizer(vocab_size=300, with_tags=False, corpus=corpus(), split_digits=True)
    model = build_model(tokenizer, seed=seed, hidden_size=128, num_hidden_layers=4, num_attention_heads=4)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write the demo's data files and its untrained base model.")
    parser.add_argument("output_dir", help="gets data/ (write_data) and base-init/ (write_untrained_base)")
    parser.add_argument("--seed", type=int, default=0, help="the model's initialisation (the data split is fixed)")
    parser.add_argument(
        "--variant",
        choices=list(VARIANTS),
        default=DEFAULT_VARIANT,
        help="the task (default: %(default)s, the demo's)",
    )
    args = parser.parse_args(argv)
    files = write_data(Path(args.output_dir) / "data", variant=args.variant)
    model = write_untrained_base(Path(args.output_dir) / "base-init", seed=args.seed)
    for name, path in files.items():
        print(f"{name}: {path} ({sum(1 for _ in path.open())} rows)")
    print(f"untrained base: {model}")


if __name__ == "__main__":
    main()
