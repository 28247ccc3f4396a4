"""A cold-start run: ask the teacher what is missing, filter every answer, write the dataset and its report.

    generate_cold_start(ColdStartConfig(...)) -> report (also written to output_dir)

The output folder holds
- `run.json`: the settings that decide the teacher's answers (`ColdStartConfig.generation_settings`); a run with
  other such settings in the same folder is refused;
- `samples.jsonl`: every answer, one line keyed by (question_id, sample), appended and synced as it arrives
  (`durable.AppendLog`). A restart reads it back, asks only for the keys it lacks (the transformers backend redraws
  a problem it has in part, and keeps the lines it has), and draws them with the seeds of the first run: on a
  deterministic backend (transformers on one machine) a run killed at any point and restarted gives the rows of an
  uninterrupted one; vLLM, which is not batch-invariant, gives rows drawn the same way, not always the same rows;
- `train.parquet`: the kept traces as prompt-completion rows that `scripts/sft.py` reads (plus answer, id, sample,
  problem, blocks, paths_per_block and, with a student tokenizer, num_tokens);
- `rejected.jsonl`: each rejected answer with the rule that rejected it;
- `report.json`, `report.md`, `report.png` (`report`).
The filters run on all of samples.jsonl on every run, so changing them needs no new answers.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from tqdm.auto import tqdm

from ..answers import extract_reference
from ..cli import check_model_path
from ..data import build_prompt, load_problems, problem_text
from ..durable import AppendLog, check_settings, read_lines
from ..tags.tokens import add_parallel_tokens
from .config import ColdStartConfig
from .filters import judge, select
from .report import build_report, plot_report, report_markdown
from .teachers import Request, make_teacher, sample_seed

logger = logging.getLogger(__name__)
SAMPLES = "samples.jsonl"


def generate_cold_start(config: ColdStartConfig) -> dict:
    folder = Path(config.output_dir)
    problems = load_problems(config, template=config.prompt_template)  # the training split, max_train_samples rows
    questions = {
        row["id"]: {"problem": problem_text(row["prompt"]), "reference": extract_reference(row["answer"])}
        for row in problems
    }
    if config.backend not in ("openai", "function"):  # a server's model name is its own
        check_model_path(config.model_name_or_path, "teacher")
    tokenizer = student_tokenizer(config.student_tokenizer)
    done = {(r["question_id"], r["sample"]) for r in read_lines(folder / SAMPLES)}
    check_settings(folder, config.generation_settings(), "a cold-start generation", has_records=bool(done))
    failed = ask_teacher(config, questions, folder / SAMPLES, tokenizer, done)
    answers = {(r["question_id"], r["sample"]): r for r in reversed(read_lines(folder / SAMPLES))}
    keys = [(q, s) for q in questions for s in range(config.num_samples)]
    report = write_outputs(config, [answers[k] for k in keys if k in answers], len(questions), tokenizer)
    if failed:
        raise RuntimeError(
            f"{len(failed)} requests failed for good (first: {failed[0]}); the outputs hold the other answers. "
            f"Run the same command again to ask for the missing ones"
        )
    return report


def ask_teacher(config: ColdStartConfig, questions: dict, path: Path, tokenizer, done: set) -> list[str]:
    """Append to `path` the answers it lacks (`done`: the keys it has), one line each as they come; returns the
    requests that failed."""
    requests = [
        Request(q, s, build_prompt(row["problem"], config.prompt_template), sample_seed(config.seed, q, s))
        for q, row in questions.items()
        for s in range(config.num_samples)
        if (q, s) not in done
    ]
    if done:
        logger.info("%s: %d answers already there, %d to ask", path, len(done), len(requests))
    if not requests:
        return []
    teacher = make_teacher(config)
    failed, counts = [], Counter()
    with AppendLog(path) as log, tqdm(total=len(requests), desc="teacher answers", unit="answer") as bar:
        for request, answer in teacher.ask(requests):
            bar.update()
            if isinstance(answer, Exception):
                failed.append(f"{request.question_id}/{request.sample}: {answer}")
                continue
            record = {
                "question_id": request.question_id,
                "sample": request.sample,
                **questions[request.question_id],
                "text": answer.text,
                "finish": answer.finish,
                "tokens": answer.tokens,
            }
            log.write([record])
            counts["passed" if judge(record, config, tokenizer).reason is None else "rejected"] += 1  # per answer
            bar.set_postfix(counts, refresh=False)
    return failed


def write_outputs(config: ColdStartConfig, records: list, num_problems: int, tokenizer) -> dict:
    """Filter `records` (ordered by problem, then sample) and write train.parquet, rejected.jsonl and the report."""
    from datasets import Dataset

    folder = Path(config.output_dir)
    verdicts = [judge(r, config, tokenizer) for r in tqdm(records, desc="filtering", unit="answer")]
    for start in range(0, len(verdicts), config.num_samples):
        select(verdicts[start : start + config.num_samples], config)
    rows, rejected = [], []
    for record, verdict in zip(records, verdicts):
        if verdict.reason is not None:
            rejected.append({"question_id": verdict.question_id, "sample": verdict.sample, "reason": verdict.reason,
                             "detail": verdict.detail, "trace": verdict.trace})  # fmt: skip
            continue
        row = {
            "prompt": build_prompt(record["problem"], config.prompt_template),
            "completion": [{"role": "assistant", "content": verdict.trace}],
            "answer": record["reference"],
            "id": record["question_id"],
            "sample": record["sample"],
            "problem": record["problem"],
            "blocks": verdict.checks["blocks"],
            "paths_per_block": verdict.checks["paths_per_block"],
        }
        if tokenizer is not None:
            row["num_tokens"] = verdict.checks["num_tokens"]
        rows.append(row)
    (folder / "rejected.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejected))
    report = build_report(verdicts, config, num_problems)
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(report_markdown(report))
    plot_report(verdicts, report, folder / "report.png")
    logger.info("%d of %d answers kept; report in %s", len(rows), len(records), folder / "report.md")
    (folder / "train.parquet").unlink(missing_ok=True)  # never left to contradict the report
    if not rows:
        raise ValueError(f"no answer passed the filters: see {folder / 'report.md'} and {folder / 'rejected.jsonl'}")
    dataset = Dataset.from_list(rows)
    dataset.to_parquet(str(folder / "train.parquet.tmp"))
    (folder / "train.parquet.tmp").replace(folder / "train.parquet")
    if config.push_to_hub:
        push(dataset, folder, config)
    return report


def push(dataset, folder: Path, config: ColdStartConfig) -> None:
    """The dataset with `datasets`' own push_to_hub, then the report files next to it."""
    from huggingface_hub import HfApi

    dataset.push_to_hub(config.hub_dataset_id, private=config.hub_private)
    api = HfApi()
    for name in ("report.md", "report.json", "report.png"):
        api.upload_file(path_or_fileobj=str(folder / name), path_in_repo=f"cold_start/{name}",
                        repo_id=config.hub_dataset_id, repo_type="dataset")  # fmt: skip
    logger.info("pushed to https://huggingface.co/datasets/%s", config.hub_dataset_id)


def student_tokenizer(name: str | None):
    """The student's tokenizer with the tags (added in memory when it lacks them, as SFT adds them), or None."""
    if not name:
        return None
    from transformers import AutoTokenizer

    check_model_path(name, "student_tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(name)
    if add_parallel_tokens(tokenizer):
        logger.info("student_tokenizer %s had no tags: counted with the tags added, as SFT adds them", name)
    return tokenizer
