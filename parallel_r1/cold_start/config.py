"""What a cold-start recipe sets (`scripts/generate_cold_start.py`): the teacher, the questions, the sampling, the
filters and the output."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..data.arguments import PromptArguments
from ..data.sources import DataArguments
from ..docstrings import document_parameters
from ..rollout.arguments import SamplingArguments, VLLMArguments

BACKENDS = ("transformers", "vllm", "openai", "function")

# What decides the teacher's samples: a restart in the same folder must have the same. The filters are applied
# anew to every sample on each run, so they may change; so may the connection to a server and max_train_samples.
GENERATION_SETTINGS = (
    "model_name_or_path",
    "model_revision",
    "dtype",
    "backend",  # the transformers backend seeds each problem, the others each answer
    "dataset_name",
    "dataset_config",
    "dataset_train_split",
    "question_column",
    "answer_column",
    "prompt_template",
    "num_samples",
    "temperature",
    "top_p",
    "max_new_tokens",
    "seed",
)
# Names the cold start's settings had before it took `DataArguments`: refused in one line that names the new one.
RENAMED_KEYS = {"dataset_split": "dataset_train_split", "max_problems": "max_train_samples"}
RECORDED_AS = {"dataset_train_split": "dataset_split"}  # run.json keeps the key earlier runs wrote: they resume


@document_parameters
@dataclass(kw_only=True)
class ColdStartConfig(DataArguments, PromptArguments, SamplingArguments, VLLMArguments):
    """The teacher, the problems (`DataArguments`: the training split, at most `max_train_samples` problems, which
    may be raised later to extend a run in place), the sampling (`SamplingArguments`), the backend's options (the
    offline vLLM engine's: `VLLMArguments`), the filters and the output."""

    output_dir: str = field(
        metadata={"help": "Folder of samples.jsonl (every answer), train.parquet, report.md/json/png and run.json."}
    )
    model_name_or_path: str = field(
        metadata={"help": "The teacher: a local folder or a Hub id (backend function: package.module:function)."}
    )
    model_revision: str | None = field(default=None, metadata={"help": "The teacher's Hub revision."})
    dtype: str = field(default="auto", metadata={"help": "Teacher weights dtype (transformers and vllm backends)."})

    # Sampling
    num_samples: int = field(default=1, metadata={"help": "Answers asked of the teacher per problem."})
    max_new_tokens: int = field(default=4096, metadata={"help": "Tokens the teacher may write per answer."})

    # Backend
    backend: str = field(
        default="transformers",
        metadata={
            "help": "'transformers' (small runs, CPU or one GPU), 'vllm' (an offline vllm.LLM on this node's GPUs) "
            "'openai' (any OpenAI-compatible server: vLLM, TGI, SGLang, a hosted API) or 'function' (a Python "
            "function as the teacher, see teachers.FunctionTeacher).",
            "choices": list(BACKENDS),
        },
    )
    base_url: str = field(default="http://127.0.0.1:8000/v1", metadata={"help": "openai: the server's /v1 URL."})
    served_model_name: str | None = field(
        default=None, metadata={"help": "openai: the model name the server knows (default: model_name_or_path)."}
    )
    api_key_env: str = field(
        default="OPENAI_API_KEY",
        metadata={"help": "openai: the environment variable holding the API key (unset: 'EMPTY', as vLLM takes)."},
    )
    concurrency: int = field(default=64, metadata={"help": "openai: requests in flight at once."})
    request_timeout: float = field(default=600.0, metadata={"help": "openai: seconds before a request is retried."})
    max_retries: int = field(
        default=5, metadata={"help": "openai: retries of a failed request, with exponential back-off."}
    )
    chunk_size: int = field(
        default=1024,
        metadata={
            "help": "vllm and transformers: answers decoded at once (the next request starts as soon as one ends; "
            "each answer is saved as soon as it is written)."
        },
    )
    vllm_tensor_parallel_size: int = field(default=1, metadata={"help": "vllm: GPUs per model replica."})

    # Filters (docs/paper.md, the cold start: the paper kept well-formed answers ending with a Final Answer line
    # that fit 4096 tokens with the prompt)
    drop_reasoning: bool = field(
        default=True,
        metadata={"help": "Keep only what follows the last </think> (reasoning teachers such as DeepSeek-R1)."},
    )
    require_finished: bool = field(
        default=True, metadata={"help": "Reject answers cut by max_new_tokens (finish reason 'length')."}
    )
    require_well_formed: bool = field(default=True, metadata={"help": "Reject answers the tag parser rejects."})
    require_final_answer: bool = field(
        default=True, metadata={"help": "Reject answers whose last line is not 'Final Answer: ...'."}
    )
    require_correct: bool = field(
        default=True,
        metadata={"help": "Reject answers that do not match the reference (not in the paper's filter)."},
    )
    require_block: bool = field(
        default=False, metadata={"help": "Reject answers with no <Parallel> block (the paper kept them)."}
    )
    student_tokenizer: str | None = field(
        default=None,
        metadata={"help": "The student's tokenizer, with the tags (for max_length and the token counts)."},
    )
    max_length: int | None = field(
        default=None,
        metadata={"help": "Reject traces longer than this many student tokens, chat template and prompt included."},
    )
    normalize_whitespace: bool = field(
        default=True,
        metadata={
            "help": "Remove the whitespace between a block's <Parallel>, paths and </Parallel>, as the "
            "official training data has it."
        },
    )
    rewrite_final_answer: bool = field(
        default=True,
        metadata={"help": "Write a correct trace's Final Answer line as the reference spells it (official data)."},
    )
    drop_exact_duplicates: bool = field(
        default=True, metadata={"help": "Keep one of the answers to a problem that are the same text."}
    )
    near_duplicate_threshold: float | None = field(
        default=0.9,
        metadata={
            "help": "Drop an answer whose word-trigram Jaccard similarity to a kept answer to the same "
            "problem reaches this (None: off)."
        },
    )
    max_traces_per_question: int | None = field(
        default=None, metadata={"help": "Keep at most this many traces per problem (the lowest sample indices)."}
    )

    # Output
    push_to_hub: bool = field(default=False, metadata={"help": "Push the dataset and its report to the Hub."})
    hub_dataset_id: str | None = field(default=None, metadata={"help": "The Hub dataset to push to (owner/name)."})
    hub_private: bool = field(default=False, metadata={"help": "Make the pushed dataset private."})

    def __post_init__(self):
        DataArguments.__post_init__(self)
        PromptArguments.__post_init__(self)
        SamplingArguments.__post_init__(self)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("num_samples", "max_new_tokens", "concurrency", "chunk_size", "vllm_tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_length", "max_traces_per_question"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 or None, got {getattr(self, name)}")
        if self.near_duplicate_threshold is not None and not 0 < self.near_duplicate_threshold <= 1:
            raise ValueError(
                f"near_duplicate_threshold must be in (0, 1] or None, got {self.near_duplicate_threshold}"
            )
        if self.max_length is not None and not self.student_tokenizer:
            raise ValueError("max_length counts the student's tokens: set student_tokenizer too")
        if self.push_to_hub and not self.hub_dataset_id:
            raise ValueError("push_to_hub needs hub_dataset_id (owner/name)")

    def generation_settings(self) -> dict:
        """The settings a restart in the same output_dir must share (GENERATION_SETTINGS)."""
        values = asdict(self)
        return {RECORDED_AS.get(name, name): values[name] for name in GENERATION_SETTINGS}
