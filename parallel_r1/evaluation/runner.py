"""Run an evaluation: sample k completions per problem with the rollout of training, score, write, summarise.

    evaluate(EvaluationConfig(...), model_args) -> results (also written to output_dir)

Sampling uses the fork-join engine with the settings of training (attention variant, paths, budgets, tag
grammar: what the config leaves unset is what the model recorded), or one plain decode (`rollout_mode: plain`).
Backends: transformers (data-parallel when launched with accelerate: each process takes its share of the missing
completions), an offline `vllm.LLM`, or a running vLLM server through TRL's `VLLMClient`. Completions are written
as they come (`records`), and at the end the page to read them (`viewer`); a restart with the same settings samples
only what is missing, other settings in the same folder are refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from pathlib import Path

from tqdm.auto import tqdm

from ..cli import check_model_path
from ..data import DataArguments, load_problems, prompt_ids
from ..durable import check_settings
from ..model_settings import saved_eos_ids
from ..policy import ParallelPolicy
from ..tags.tokens import has_parallel_tokens
from ..versions import versions
from . import records as rec
from .config import EvaluationConfig
from .metrics import summarize
from .report import markdown_table
from .viewer import VIEWER_FILE, write_viewer

logger = logging.getLogger(__name__)


def evaluate(config: EvaluationConfig, model_args) -> dict:
    import torch
    from accelerate import PartialState
    from transformers import AutoTokenizer

    state = PartialState(cpu=not torch.cuda.is_available())  # several CPU processes (torchrun) share the work too
    folder = Path(config.output_dir)
    path = model_args.model_name_or_path
    check_model_path(path)
    config = config.with_model_settings(path, model_args.model_revision)  # what it leaves unset: the model's
    tokenizer = AutoTokenizer.from_pretrained(path, revision=model_args.model_revision)
    eos = saved_eos_ids(tokenizer, path, model_args.model_revision)
    if config.rollout_mode != "plain" and not has_parallel_tokens(tokenizer):
        raise ValueError(f"{path} has no parallel tags in its tokenizer: use rollout_mode='plain' to evaluate it")
    policy = ParallelPolicy(tokenizer, config, eos)  # the filled config: its rollout and its sampling
    if config.backend != "transformers" and state.num_processes > 1:
        raise ValueError(f"backend={config.backend!r} runs in one process: launch it without accelerate")
    if state.is_main_process:
        _check_settings(folder, config, model_args)
    backend = policy.open_backend(
        path, config, policy.sampling(config.seed), model_args, state.device, config.batch_size
    )
    state.wait_for_everyone()
    done = {rec.key(r) for r in rec.read_shards(folder)}
    state.wait_for_everyone()  # every process knows what is done before any writes: they split the same list
    writer = rec.shard_writer(folder, state.process_index)
    expected = set()
    try:
        for name, k in config.benchmark_specs():
            problems = load_problems(
                DataArguments(dataset_name=name),
                config.split,
                template=config.prompt_template,
                limit=config.max_problems,
            )
            rows = [rec.problem_record(name, i, row) for i, row in enumerate(problems)]
            expected |= {(name, i, s) for i in range(len(rows)) for s in range(k)}
            missing = [(i, s) for i in range(len(rows)) for s in range(k) if (name, i, s) not in done]
            with state.split_between_processes(missing) as mine:
                bar = tqdm(
                    total=len(mine), desc=f"{name} (k={k})", unit="completion", disable=not state.is_main_process
                )
                for start in range(0, len(mine), config.batch_size):
                    batch = mine[start : start + config.batch_size]
                    prompts = [prompt_ids(tokenizer, problems[i]["prompt"]) for i, _ in batch]
                    try:
                        with torch.no_grad():
                            outputs = policy.rollouts(
                                backend, prompts, [_completion_seed(config.seed, name, *item) for item in batch]
                            )
                        scored = [rec.score(rows[i], s, r, policy) for (i, s), r in zip(batch, outputs)]
                    except (ValueError, FileNotFoundError) as error:  # not a setting of the user's: the traceback
                        raise RuntimeError(f"sampling stopped: {error}") from error
                    writer.write(scored)
                    bar.update(len(batch))
                bar.close()
    finally:
        writer.close()
    state.wait_for_everyone()
    if not state.is_main_process:
        return {}
    records = [r for r in rec.read_shards(folder) if rec.key(r) in expected]
    if len(records) != len(expected):
        raise RuntimeError(
            f"{len(expected) - len(records)} completions are missing from {folder}/shards: run it again"
        )
    return write_results(folder, config, model_args, records)


def write_results(folder: Path, config: EvaluationConfig, model_args, records: list) -> dict:
    """completions.jsonl, its viewer (viewer.html), results.json and table.md from the records; returns the
    results."""
    ordered = rec.write_completions(folder / "completions.jsonl", records)
    results = {
        "model": _model_info(model_args),
        "label": config.label or model_args.model_name_or_path,
        "settings": config.settings(),
        "versions": versions(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        **summarize(records),
    }
    (folder / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_viewer(ordered, folder / VIEWER_FILE, results["label"])
    table = markdown_table([results])
    (folder / "table.md").write_text(table + "\n")
    print(table)
    return results


def _completion_seed(seed: int, benchmark: str, problem: int, sample: int) -> int:
    """A completion's own 64-bit seed, from the run's seed and which completion it is: however the completions are
    batched, split between processes or resumed, each one draws the same random numbers."""
    digest = hashlib.sha256(f"{seed}/{benchmark}/{problem}/{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _check_settings(folder: Path, config: EvaluationConfig, model_args) -> None:
    """Write run.json, or check that the folder's earlier run had the same model (path, revision and, for a
    local folder, weight files) and settings."""
    model = model_args.model_name_or_path
    run = {"model": model, "revision": model_args.model_revision, "weights": _weight_files(model)}
    check_settings(folder, {**run, **config.settings()}, "an evaluation", has_records=bool(rec.read_shards(folder)))


def _weight_files(model: str) -> dict:
    """Size and modification time of a local model folder's weight files (a retrained model differs)."""
    folder = Path(model)
    if not folder.is_dir():
        return {}
    files = sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")])
    return {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files}


def _model_info(model_args) -> dict:
    """Path, revision and, for a local checkpoint, its training step."""
    path = Path(model_args.model_name_or_path)
    from transformers import AutoConfig

    commit = getattr(AutoConfig.from_pretrained(str(path), revision=model_args.model_revision), "_commit_hash", None)
    info = {
        "name_or_path": model_args.model_name_or_path,
        "revision": model_args.model_revision,
        "commit": commit,  # the Hub commit the files came from (None for a local folder)
        "step": None,
    }
    state = path / "trainer_state.json"
    if state.exists():
        info["step"] = json.loads(state.read_text()).get("global_step")
    elif match := re.search(r"checkpoint-(\d+)$", str(path).rstrip("/")):
        info["step"] = int(match.group(1))
    return info
