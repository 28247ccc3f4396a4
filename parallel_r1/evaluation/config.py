"""What an evaluation recipe sets (`scripts/evaluate.py`; the model comes from TRL's `ModelConfig`).

The rollout settings a trained model records (`rollout.RolloutArguments`: attention, prompt template, rollout,
paths, budgets) default to the model's own: a field the recipe or a flag leaves unset takes the recorded value
(`EvaluationConfig.with_model_settings`), one they set wins, and a model that recorded none is sampled with
the defaults of `RolloutArguments` (the paper's, as `scripts/generate.py` samples it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from ..docstrings import document_parameters
from ..model_settings import recorded_settings
from ..rollout.arguments import BackendArguments, RecordedRolloutArguments, SamplingArguments, check_set_fields

ROLLOUT_FIELDS = tuple(f.name for f in dataclasses.fields(RecordedRolloutArguments))


@document_parameters
@dataclass(kw_only=True)
class EvaluationConfig(RecordedRolloutArguments, SamplingArguments, BackendArguments):
    """What `scripts/evaluate.py` samples and how: the benchmarks, the rollout (each setting unset until filled from
    what the model recorded: `RecordedRolloutArguments`), the sampling and the backend."""

    output_dir: str = field(metadata={"help": "Folder of results.json, table.md, completions.jsonl and shards/."})
    benchmarks: list[str] = field(
        default_factory=lambda: ["aime24@16", "aime25@16", "amc23@16", "math500@1"],
        metadata={
            "help": "Benchmarks as name@k (k samples per problem): a shipped set (aime24, aime25, amc23, math500, "
            "gsm8k), a local .jsonl/.json/.parquet file or a Hub dataset id."
        },
    )
    split: str = field(default="test", metadata={"help": "Split of every benchmark."})
    max_problems: int | None = field(default=None, metadata={"help": "Only the first N problems of each benchmark."})
    label: str | None = field(default=None, metadata={"help": "Name of the model in the table (default: its path)."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0: off)."})
    batch_size: int = field(default=64, metadata={"help": "Completions per generation call (and per write)."})

    def __post_init__(self):
        """Checks what is set; `with_model_settings` checks the filled config again."""
        check_set_fields(self)
        SamplingArguments.__post_init__(self)
        BackendArguments.__post_init__(self)
        if self.batch_size < 1 or (self.max_problems is not None and self.max_problems < 1):
            raise ValueError("batch_size and max_problems must be at least 1")
        self.benchmark_specs()  # fail now on a bad spec

    def with_model_settings(self, model_path: str, revision: str | None = None) -> EvaluationConfig:
        """This config with each unset sampling field filled from what the model recorded
        (`model_settings.recorded_settings`; `RolloutArguments`' defaults for a model that recorded none), and
        checked again."""
        unset = [name for name in ROLLOUT_FIELDS if getattr(self, name) is None]
        if not unset:
            return self
        recorded = recorded_settings(model_path, revision=revision)
        filled = {name: recorded[name] for name in unset}
        try:
            return dataclasses.replace(self, **filled)
        except ValueError as problem:
            raise ValueError(f"{problem} (unset here, so taken from {model_path}: {filled})") from None

    def benchmark_specs(self) -> list[tuple[str, int]]:
        """(name, k) of each benchmark, in order."""
        return parse_benchmarks(self.benchmarks)

    def settings(self) -> dict:
        """What decides the completions (a resumed evaluation must have the same); how to run them is free."""
        free = (
            "output_dir",
            "label",
            "batch_size",
            "vllm_server_url",
            "vllm_gpu_memory_utilization",
            "vllm_enforce_eager",
        )
        return {k: v for k, v in asdict(self).items() if k not in free}


def parse_benchmarks(benchmarks: list) -> list[tuple[str, int]]:
    """(name, k) of each `name@k` spec, in order; a ValueError names a bad or repeated one."""
    specs = []
    for spec in benchmarks:
        name, _, k = str(spec).rpartition("@")
        if not name or not k.isdigit() or int(k) < 1:
            raise ValueError(f"benchmark {spec!r} must be written name@k with k >= 1 samples, e.g. aime24@16")
        specs.append((name, int(k)))
    if len({name for name, _ in specs}) != len(specs):
        raise ValueError(f"a benchmark is listed twice in {benchmarks}")
    return specs
