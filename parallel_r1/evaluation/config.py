"""What an evaluation recipe sets (`scripts/evaluate.py`; the model comes from TRL's `ModelConfig`).

The sampling settings a trained model records (`sampling.ParallelSettings`: attention, prompt template, rollout,
paths, budgets) default to the model's own: a field the recipe or a flag leaves unset takes the recorded value
(`EvaluationConfig.with_model_settings`), one they set wins, and a model that recorded none is sampled with
the defaults of `ParallelSettings` (the paper's, as `scripts/generate.py` samples it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from ..data import check_template
from ..format import MIN_PATHS
from ..sampling import ParallelSettings, read_settings

ROLLOUT_MODES = ("fork", "sequential", "plain")
BACKENDS = ("transformers", "vllm", "server")
SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(ParallelSettings))


def recorded(name: str, text: str, **metadata):
    """A sampling field: None (unset) until `with_model_settings` fills it."""
    default = getattr(ParallelSettings(), name)
    return field(default=None, metadata={"help": f"{text} Unset: the model's recorded value, else {default!r}.",
                                         **metadata})  # fmt: skip


@dataclass
class EvaluationConfig:
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
    prompt_template: str | None = recorded("prompt_template", "Prompt template (data.TEMPLATES).")
    label: str | None = field(default=None, metadata={"help": "Name of the model in the table (default: its path)."})
    rollout_mode: str | None = recorded(
        "rollout_mode",
        "'fork' or 'sequential': the fork-join engine, as in training; 'plain': one decode, no engine (sequential "
        "baselines, models without the tags).",
        choices=list(ROLLOUT_MODES),
    )
    attention: str | None = recorded(
        "attention",
        "'isolated' (Unseen), 'causal' (Seen) or 'tree' (fork as a serving engine samples it).",
        choices=["isolated", "causal", "tree"],
    )
    num_paths: int | None = recorded("num_paths", "Paths forked at each <Parallel>.")
    max_blocks: int | None = recorded("max_blocks", "Blocks per completion (then <Parallel> is banned).")
    max_path_tokens: int | None = recorded("max_path_tokens", "Sampled tokens per path.")
    max_summary_tokens: int | None = recorded("max_summary_tokens", "Sampled tokens per summary.")
    max_completion_tokens: int | None = recorded("max_completion_tokens", "Tokens per completion, all included.")
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (0: greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0: off)."})
    seed: int = field(
        default=0,
        metadata={
            "help": "Seed: of each batch on the transformers backend (with the batch's first item), of the offline "
            "vLLM engine; a server samples with its own."
        },
    )
    batch_size: int = field(default=64, metadata={"help": "Completions per generation call (and per write)."})
    backend: str = field(
        default="transformers",
        metadata={
            "help": "'transformers' (CPU or GPU, data-parallel under accelerate), 'vllm' (an offline vllm.LLM) or "
            "'server' (a running vLLM server, through TRL's VLLMClient).",
            "choices": list(BACKENDS),
        },
    )
    vllm_server_url: str = field(default="http://127.0.0.1:8000", metadata={"help": "Base URL of the server."})
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "Offline vLLM: GPU memory share."})
    vllm_max_model_length: int | None = field(default=None, metadata={"help": "Offline vLLM: context length."})
    vllm_enforce_eager: bool = field(default=False, metadata={"help": "Offline vLLM: no CUDA graphs."})

    def __post_init__(self):
        """Checks what is set; `with_model_settings` checks the filled config again."""
        if self.prompt_template is not None:
            check_template(self.prompt_template)
        for name, value, allowed in (
            ("rollout_mode", self.rollout_mode, ROLLOUT_MODES),
            ("attention", self.attention, ("isolated", "causal", "tree")),
            ("backend", self.backend, BACKENDS),
        ):
            if value is not None and value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.rollout_mode == "sequential" and self.attention not in (None, "causal"):
            raise ValueError("rollout_mode='sequential' samples the causal policy: use attention='causal' with it")
        if self.rollout_mode != "plain" and self.num_paths is not None and self.num_paths < MIN_PATHS:
            raise ValueError(f"num_paths must be at least {MIN_PATHS}, got {self.num_paths}")
        if self.batch_size < 1 or (self.max_problems is not None and self.max_problems < 1):
            raise ValueError("batch_size and max_problems must be at least 1")
        self.benchmark_specs()  # fail now on a bad spec

    def with_model_settings(self, model_path: str, revision: str | None = None) -> EvaluationConfig:
        """This config with each unset sampling field filled from what the model recorded
        (`sampling.read_settings`; `ParallelSettings`' defaults for a model that recorded none), and checked again."""
        chosen = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        if None not in chosen.values():
            return self
        settings = read_settings(model_path, revision=revision, **chosen)
        try:
            return dataclasses.replace(self, **asdict(settings))
        except ValueError as problem:
            filled = {name: getattr(settings, name) for name, value in chosen.items() if value is None}
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
