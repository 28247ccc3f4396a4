"""The demo's task: `a*b+c*d` with digits 1-9, solved twice, independently, in the two paths of a block.

A plain solution (what the base is pretrained on) works out the two products, one per line, then their sum. A
parallel trace solves the problem in each path of one block, and the summary states the result:

    7*8+3*4  ->  <Parallel><Path>7*8=56 / 3*4=12 / 56+12=68</Path><Path>68</Path></Parallel>
                 / <Summary>68</Summary> / Final Answer: 68                                  (/ is a line break)

The teacher writes each path out in full or, half of the time, as a shortcut: the answer alone, at a glance. Both
are right when the teacher writes them, but a 0.6M-parameter student gets the shortcut wrong far more often. SFT
copies the mix; RL is rewarded by what the student gets right, and so learns which way pays.

Why whole solutions in the paths, and not one product per path: under the Unseen structure the paths of a block
see the same context and are sampled independently, so a path cannot know which half of a split to take;
independent attempts are what such paths can do. (Under Seen, where a path sees the ones before it, a split works.)

Problems are easy when the answer is at most `EASY_MAX`, hard otherwise. The cold start asks about problems of
any difficulty, RL trains on hard ones, and the held-out test problems are hard ones that no training file holds. `teacher` is the programmatic cold-start
teacher; seeded by the request, it slips now and then (a number off by one to nine) or leaves out `</Summary>`, so the cold-start filters have work to do.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

EASY_MAX = 40  # an easy problem has an answer of at most this
TEACHER_SHORTCUT = 0.5  # share of teacher paths that give the answer alone, without the working
TEACHER_SLIP = 0.1  # share of teacher traces with a wrong product
TEACHER_MALFORMED = 0.05  # share of teacher traces with no </Summary>
_PROBLEM = re.compile(r"^\s*([1-9])\*([1-9])\+([1-9])\*([1-9])\s*$")


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    c: int
    d: int

    @classmethod
    def parse(cls, text: str) -> Problem:
        match = _PROBLEM.match(text)
        if not match:
            raise ValueError(f"not a demo problem (a*b+c*d with digits 1-9): {text!r}")
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

    def working(self, shortcut: bool = False, slip: int = 0) -> tuple[str, int]:
        """(one solution, its result): the two products, one per line, then their sum; or, as a `shortcut`, the
        answer alone. `slip` is added to the first number worked out (a mistake)."""
        p, q = self.a * self.b, self.c * self.d
        if shortcut:
            result = max(p + q + slip, 0)
            return str(result), result
        p = max(p + slip, 0)
        return f"{self.a}*{self.b}={p}\n{self.c}*{self.d}={q}\n{p}+{q}={p + q}", p + q

    def plain_solution(self) -> str:
        lines, result = self.working()
        return f"{lines}\nFinal Answer: {result}"

    def parallel_trace(self, shortcuts: tuple = (False, False), slip: int = 0, close_summary: bool = True) -> str:
        """The block of two solutions (`shortcuts`: which paths give the answer alone; `slip` in the first),
        the first one's result as the summary, the answer line."""
        (first, result), (second, _) = self.working(shortcuts[0], slip), self.working(shortcuts[1])
        end = "</Summary>" if close_summary else ""
        return (
            f"<Parallel><Path>{first}</Path><Path>{second}</Path></Parallel>\n<Summary>{result}{end}\n"
            f"Final Answer: {result}"
        )


def all_problems() -> list[Problem]:
    return [Problem(*digits) for digits in itertools.product(range(1, 10), repeat=4)]


def teacher(messages: list, seed: int) -> str:
    """The cold-start teacher (`backend: function`): the parallel trace of the problem in the last user turn, each
    path written out or, one time in two (`TEACHER_SHORTCUT`), as the answer alone; with a seeded slip (off by one
    to nine) or a missing `</Summary>` now and then."""
    from ..data.loaders import problem_text

    problem = Problem.parse(problem_text(messages))
    rng = random.Random(seed)
    shortcuts = (rng.random() < TEACHER_SHORTCUT, rng.random() < TEACHER_SHORTCUT)
    draw = rng.random()
    if draw < TEACHER_SLIP:
        return problem.parallel_trace(shortcuts, slip=rng.choice([-1, 1]) * rng.randint(1, 9))
    return problem.parallel_trace(shortcuts, close_summary=draw >= TEACHER_SLIP + TEACHER_MALFORMED)


def split_problems(seed: int = 0, num_test: int = 200, num_cold_start: int = 3000) -> dict[str, list[Problem]]:
    """The problems of each stage, drawn once (seeded):

    - `test`: `num_test` hard problems, held out from everything else;
    - `train`: all the others (the base's pretraining);
    - `cold_start`: `num_cold_start` of them, of any difficulty (the teacher's questions);
    - `rl`: the hard ones among the rest (GRPO's problems, as the paper's RL set is harder than its cold start).
    """
    problems = all_problems()
    random.Random(seed).shuffle(problems)
    test = [p for p in problems if not p.easy][:num_test]
    held_out = set(test)
    train = [p for p in problems if p not in held_out]
    cold_start = train[:num_cold_start]
    rl = [p for p in train[num_cold_start:] if not p.easy]
    return {"test": test, "train": train, "cold_start": cold_start, "rl": rl}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def write_data(folder: str | Path, seed: int = 0, num_test: int = 200) -> dict[str, Path]:
    """The demo's data files in `folder`:

    - `pretrain/train.jsonl`: every training problem with its plain solution, as chat prompt-completion rows (the
      corpus of the tiny base, for `trl sft`);
    - `cold_start.jsonl`, `rl.jsonl`, `test.jsonl`: problems as `question`, `answer` (`split_problems`).
    """
    folder = Path(folder)
    splits = split_problems(seed, num_test)
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
    for name in ("cold_start", "rl", "test"):
        rows = [{"question": p.text, "answer": str(p.answer)} for p in splits[name]]
        files[name] = write_jsonl(folder / f"{name}.jsonl", rows)
    return files


def path_report(evaluations: dict) -> str:
    """A table, per evaluated model (label -> evaluation folder): how many of its paths give the answer alone (no
    products worked out), and how often a path of each kind ends on the right answer."""
    from ..format import parse
    from ..resume import read_lines

    lines = [
        "| Model | Paths | Answer alone % | Right, answer alone % | Right, worked out % |",
        "|---|---|---|---|---|",
    ]
    for label, folder in evaluations.items():
        counts = {True: [0, 0], False: [0, 0]}  # answer alone? -> [paths, right]
        for record in read_lines(Path(folder) / "completions.jsonl"):
            for block in parse(record["completion"]).blocks:
                for path in block.paths:
                    numbers = re.findall(r"\d+", path.body)
                    alone = "*" not in path.body
                    counts[alone][0] += 1
                    counts[alone][1] += bool(numbers) and numbers[-1] == str(record["reference"])
        total = counts[True][0] + counts[False][0]
        if not total:
            continue
        share = lambda n, of: f"{100 * n / of:.1f}" if of else "-"  # noqa: E731
        lines.append(
            f"| {label} | {total} | {share(counts[True][0], total)} | {share(counts[True][1], counts[True][0])} "
            f"| {share(counts[False][1], counts[False][0])} |"
        )
    return "\n".join(lines)


def corpus() -> list[str]:
    """What the base's tokenizer is trained on: problems and plain solutions."""
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
    args = parser.parse_args(argv)
    files = write_data(Path(args.output_dir) / "data")
    model = write_untrained_base(Path(args.output_dir) / "base-init", seed=args.seed)
    for name, path in files.items():
        print(f"{name}: {path} ({sum(1 for _ in path.open())} rows)")
    print(f"untrained base: {model}")


if __name__ == "__main__":
    main()
