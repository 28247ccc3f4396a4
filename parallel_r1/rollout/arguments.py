"""The settings that decide how a parallel-thinking model is trained and sampled, each declared once here.

- `ParallelArguments`: the prompt template (`data.arguments.PromptArguments`, which the cold start shares), the
  attention variant and the paths a block may have (SFT's config inherits them);
- `RolloutArguments`: those plus the rollout: mode, and the block limit and token budgets (`RolloutBudgets`, which
  SFT's config inherits too, to record them). GRPO's config inherits them, the engine reads them, a trained model
  records them (`parallel_r1.model_settings`);
- `RecordedRolloutArguments`: the same fields, derived, each None until filled from what the model recorded
  (evaluation's and generation's arguments inherit it);
- `SamplingArguments` and `VLLMArguments`: how tokens are drawn, and the offline vLLM engine's options, outside
  training (evaluation, generation, the cold-start teacher); `BackendArguments`: which backend decodes
  (evaluation, generation).

The defaults are the paper's (2 paths, 4 blocks, 3000-token budgets: docs/paper.md, "The settings"); they are also
what a model that recorded nothing is sampled with. `max_completion_length` is TRL's name, and in GRPO's config
this declaration replaces TRL's.
"""

from dataclasses import MISSING, dataclass, field, fields, make_dataclass, replace
from typing import Literal, get_args, get_type_hints

from ..data.arguments import PromptArguments
from ..data.prompts import check_template
from ..docstrings import document_parameters
from ..tags.language import MIN_PATHS

Attention = Literal["isolated", "causal", "tree"]
RolloutMode = Literal["fork", "sequential", "plain"]
ATTENTION: tuple[str, ...] = get_args(Attention)
ROLLOUT_MODES: tuple[str, ...] = get_args(RolloutMode)
ENGINE_MODES = ("fork", "sequential")

# Old names a recipe or a flag may still use: refused in one line that names the new one (`renamed_setting`).
RENAMED_KEYS = {
    "max_completion_tokens": "max_completion_length",
    "num_paths": "min_paths and max_paths (both K for K paths a block)",
}
RENAMED_VALUES = {("rollout_mode", "trl"): "plain"}


@document_parameters
@dataclass(kw_only=True)
class ParallelArguments(PromptArguments):
    """What a model is trained with and sampled with again: its prompt template, its attention variant and how many
    paths a block may have (which tokens are the model's choice of width, and what reads them)."""

    attention: Attention = field(
        default="isolated",
        metadata={
            "help": "'isolated' (Unseen: the paths of a block cannot attend to each other and restart their positions "
            "at the block's opener), 'causal' (Seen: plain causal attention) or 'tree' (the paths as isolated, what "
            "follows reads them as written: what a serving engine samples in fork mode, trained exactly).",
        },
    )
    min_paths: int = field(
        default=2,
        metadata={"help": "Paths every block gets: the runtime opens each of them (the paper: 2)."},
    )
    max_paths: int = field(
        default=2,
        metadata={
            "help": "Paths a block may get. Between min_paths and max_paths the model chooses: after each of those "
            "paths it writes <Path> (one more) or </Parallel> (done), a sampled and trained token; min_paths == "
            "max_paths fixes the width.",
        },
    )

    def __post_init__(self):
        check_set_fields(self)


@document_parameters
@dataclass(kw_only=True)
class RolloutBudgets:
    """A rollout's block limit and token budgets. GRPO samples with them; an SFT run records them in its model
    (`exact_rollout`), so that what samples that model next (generation, an evaluation, its card's command) uses the
    budgets of the stages after it."""

    max_blocks: int = field(
        default=4, metadata={"help": "Blocks per completion; after the last one <Parallel> is banned (tag grammar)."}
    )
    max_path_tokens: int = field(default=3000, metadata={"help": "Sampled tokens per path before it is closed."})
    max_summary_tokens: int = field(default=3000, metadata={"help": "Sampled tokens per summary before it is closed."})
    max_completion_length: int = field(
        default=3000, metadata={"help": "Tokens per completion, inserted tags included."}
    )


@document_parameters
@dataclass(kw_only=True)
class RolloutArguments(RolloutBudgets, ParallelArguments):
    """How completions are sampled: with the fork-join engine (`fork`, `sequential`) or one plain decode."""

    rollout_mode: RolloutMode = field(
        default="fork",
        metadata={
            "help": "'fork': the fork-join engine decodes the paths of a block concurrently; 'sequential': the same "
            "blocks with the paths decoded one after the other, each reading the earlier ones (the causal policy "
            "exactly); 'plain': one decode with no engine and no tag grammar (TRL's own generation in GRPO): "
            "sequential baselines and models without the tags.",
        },
    )
    summary_temperature: float | None = field(
        default=None,
        metadata={
            "help": "Temperature of the tokens a summary samples (its closer included); unset: the sampling "
            "temperature, as the paper samples. The training forward scores those tokens at it too "
            "(docs/rollout.md). A greedy run stays greedy. Needs the engine (rollout_mode fork or sequential).",
        },
    )

    @classmethod
    def from_fields(cls, source) -> "RolloutArguments":
        """These settings as `source` (any object with these attributes: a trainer config, a filled evaluation
        config) has them; an attribute it lacks keeps its default."""
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls) if hasattr(source, f.name)})


@document_parameters
@dataclass(kw_only=True)
class SamplingArguments:
    """How tokens are drawn outside training: evaluation, generation and the cold-start teacher."""

    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (0: greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling (1: off)."})
    seed: int = field(
        default=0,
        metadata={
            "help": "Seed of the sampling. Evaluation seeds each batch on the transformers backend (with the batch's "
            "first item) and the offline vLLM engine (a server samples with its own). The cold start draws each "
            "answer with a seed made from it, the problem id and the sample index, so a restarted run draws the "
            "same answers (transformers: one seed per problem)."
        },
    )

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {self.temperature}, {self.top_p}")


@dataclass(kw_only=True)
class SampledRolloutArguments(RolloutArguments, SamplingArguments):
    """A saved model's rollout with how its tokens are drawn: the settings of a policy that samples outside
    training (`ParallelPolicy.from_pretrained(..., sampling=...)`)."""

    def __post_init__(self):
        RolloutArguments.__post_init__(self)
        SamplingArguments.__post_init__(self)


@document_parameters
@dataclass(kw_only=True)
class VLLMArguments:
    """The offline vLLM engine's options (`backend: vllm`), shared by evaluation and the cold start."""

    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "Offline vLLM: GPU memory share."})
    vllm_max_model_length: int | None = field(default=None, metadata={"help": "Offline vLLM: context length."})
    vllm_enforce_eager: bool = field(default=False, metadata={"help": "Offline vLLM: no CUDA graphs."})


BackendName = Literal["transformers", "vllm", "server"]
BACKENDS: tuple[str, ...] = get_args(BackendName)


@document_parameters
@dataclass(kw_only=True)
class BackendArguments(VLLMArguments):
    """What decodes outside training (evaluation, generation): transformers, an offline vLLM or a vLLM server."""

    backend: BackendName = field(
        default="transformers",
        metadata={
            "help": "'transformers' (CPU or GPU, data-parallel under accelerate), 'vllm' (an offline vllm.LLM) or "
            "'server' (a running vLLM server, through TRL's VLLMClient).",
        },
    )
    vllm_server_url: str = field(default="http://127.0.0.1:8000", metadata={"help": "Base URL of the server."})

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")


def exact_rollout(settings: ParallelArguments) -> RolloutArguments:
    """The rollout that samples exactly the policy `settings`' structure trains, what an SFT run records: paths
    one after the other for `causal` (each reads the earlier ones), decoded together otherwise."""
    mode = "sequential" if settings.attention == "causal" else "fork"
    return replace(RolloutArguments.from_fields(settings), rollout_mode=mode)


def concurrent_paths(settings) -> int | None:
    """How many paths of a block the engine decodes at once, for D (`language.stats`): `min_paths` when the model
    chooses the width (the later paths are decoded one at a time), None (all of them) when the width is fixed."""
    return settings.min_paths if settings.min_paths < settings.max_paths else None


def paths_at_once(settings) -> int:
    """The most segments one completion of `settings` decodes at once (requests a vLLM engine or server holds for
    it): a block's first `min_paths` paths in fork mode (a path the model adds is decoded alone), one otherwise."""
    return settings.min_paths if settings.rollout_mode == "fork" else 1


def check_set_fields(args) -> None:
    """Every range and combination rule of the settings above, on the fields that are set (not None)."""
    value = {f.name: getattr(args, f.name, None) for f in fields(RolloutArguments)}
    choices = {"attention": ATTENTION, "rollout_mode": ROLLOUT_MODES}
    for name, allowed in choices.items():
        if value[name] is not None and value[name] not in allowed:
            new = RENAMED_VALUES.get((name, value[name]))
            hint = f" ({value[name]!r} is now called {new!r})" if new else ""
            raise ValueError(f"{name} must be one of {allowed}, got {value[name]!r}{hint}")
    if value["rollout_mode"] == "sequential" and value["attention"] not in (None, "causal"):
        raise ValueError(
            f"rollout_mode='sequential' samples every path after its siblings, which the {value['attention']} "
            f"structure would hide from them: use attention='causal' with it, or rollout_mode='fork'"
        )
    if value["min_paths"] is not None and value["min_paths"] < MIN_PATHS:
        problem = f"min_paths must be at least {MIN_PATHS} (a block holds two or more paths)"
        raise ValueError(f"{problem}, got {value['min_paths']}")
    low, high = value["min_paths"], value["max_paths"]
    if high is not None and high < (MIN_PATHS if low is None else low):
        raise ValueError(f"max_paths must be at least min_paths ({low or MIN_PATHS}), got {high}")
    for name in ("max_path_tokens", "max_summary_tokens", "max_completion_length"):
        if value[name] is not None and value[name] < 1:
            raise ValueError(f"{name} must be at least 1, got {value[name]}")
    if value["summary_temperature"] is not None:
        if not value["summary_temperature"] > 0:
            raise ValueError(f"summary_temperature must be > 0, got {value['summary_temperature']}")
        if value["rollout_mode"] == "plain":
            raise ValueError(
                "summary_temperature needs the fork-join engine, which alone samples a summary on its own: "
                "rollout_mode='plain' decodes the whole completion at one temperature"
            )
    if value["max_blocks"] is not None and value["max_blocks"] < 0:
        raise ValueError(f"max_blocks must be >= 0, got {value['max_blocks']}")
    if value["prompt_template"] is not None:
        check_template(value["prompt_template"])


def renamed_setting(settings: dict, renamed_keys: dict[str, str] = RENAMED_KEYS) -> str | None:
    """Why a recipe's or command line's settings (name -> value) use an old name (`renamed_keys`: old -> new) or an
    old value (`RENAMED_VALUES`), or None."""
    for key in settings:
        if key in renamed_keys:
            return f"{key} is now called {renamed_keys[key]}"
    for (key, old), new in RENAMED_VALUES.items():
        if settings.get(key) == old:
            return f"{key}: {old!r} is now called {new!r}"
    return None


def _unset_variant(cls: type) -> type:
    """`cls` with each field None by default, meaning: the value the model recorded, else `cls`'s default."""
    specs, types = [], get_type_hints(cls)
    for f in fields(cls):
        default = f.default if f.default is not MISSING else f.default_factory()
        help_text = f"{f.metadata['help']} Unset: the model's recorded value, else {default!r}."
        specs.append((f.name, types[f.name] | None, field(default=None, metadata={**f.metadata, "help": help_text})))
    variant = make_dataclass(
        f"Recorded{cls.__name__}", specs, namespace={"__post_init__": check_set_fields}, kw_only=True
    )
    variant.__module__ = __name__
    variant.__doc__ = f"`{cls.__name__}`, each field None (unset) until filled from what a model recorded."
    return document_parameters(variant)


RecordedRolloutArguments = _unset_variant(RolloutArguments)
