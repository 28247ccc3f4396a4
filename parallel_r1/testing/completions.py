"""Made-up completion records shaped like an evaluation's (`evaluation.records.score`), as many as a test asks for,
to load the rollout viewer (`evaluation.viewer`) with: a third plain, the rest with one or two blocks of two to four
paths, some blocks split (a path ends on another number), every other completion right, about 1,500 characters each.
"""

from __future__ import annotations

import random

from ..tags.language import canonical_block


def completion_records(count: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    records = []
    for index in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        answer = a + b if index % 2 == 0 else a + b + 1
        work = " ".join(f"step {step}: {a} + {b} is still {a + b}." for step in range(12))
        text = f"We add {a} and {b}. {work}\n"
        widths = [] if index % 3 == 0 else [rng.randint(2, 4) for _ in range(1 + index % 2)]
        for width in widths:
            results = [a + b] * width
            if rng.random() < 0.3:
                results[-1] += 1
            paths = [f"Path {p}: {work} So {a} + {b} = {result}" for p, result in enumerate(results)]
            text += canonical_block(paths, f"The paths give {a + b}.") + "\n"
        text += f"The answer is \\boxed{{{answer}}}."
        records.append(
            {
                "benchmark": "made-up",
                "problem_index": index,
                "sample": 0,
                "prompt": f"What is {a} + {b}?",
                "reference": str(a + b),
                "completion": text,
                "answer": str(answer),
                "correct": answer == a + b,
                "blocks": len(widths),
                "paths_per_block": widths,
                "tokens_total": len(text) // 4,
                "tokens_critical": len(text) // 6,
            }
        )
    return records
