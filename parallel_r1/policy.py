"""The policy: one run's tokenizer and settings, and everything that must agree between what is sampled and what is
trained.

    policy = ParallelPolicy.from_pretrained("outputs/tiny-grpo", sampling=SamplingArguments(temperature=1.0))
    backend = policy.backend(policy.sampling(seed=0), model=load_for_sampling("outputs/tiny-grpo"))
    rollouts = policy.rollouts(backend, prompt_ids)                       # fork-join engine, or one plain decode
    model_on_structure = policy.training_forward(model, start, sampled=True)  # scores them as they were sampled
    shape = policy.shape(rollouts[0].completion_ids)                      # blocks, paths, T, D, ...

A `ParallelPolicy` holds the settings whole (GRPO's config, an evaluation's, `RolloutArguments` with the sampling of
a caller; SFT's `ParallelArguments`, which sample nothing) and reads from the tokenizer, once, what both sides need:
the tag ids, the ids that end a completion, and the tag grammar that the sampler obeys (the engine takes it from
here) and the training forward re-applies. The temperature the tokens are drawn at (`sampling`) is the one the
training forward scores them at (`training_forward`): both read the settings' `temperature`. The trainers, the evaluation and its
in-training callback and `sampling.ParallelSampler` (`scripts/generate.py`) sample, score and measure through it;
the cold start's teachers, which are other models, build their backends with it (`backend`, `load_for_sampling`,
`load_llm`); `shape_metrics` is the one place the shape of a set of completions is summed up, for
the training logs and the evaluation tables alike.
"""

from __future__ import annotations

from dataclasses import asdict

from .rewards.diversity import self_bleu
from .rollout import EngineTokens, ForkJoinEngine, PlainEngine, Rollout, Sampling, TransformersBackend
from .rollout.arguments import (
    ParallelArguments,
    SampledRolloutArguments,
    SamplingArguments,
    concurrent_paths,
    paths_at_once,
)
from .structure import IsolatedForward, TreeForward
from .tags.grammar import GrammarForward
from .tags.language import TagVocab, parse, stats
from .tags.tokens import has_parallel_tokens, tag_ids, tag_vocab

NO_TAGS = TagVocab(ids={})  # a tokenizer without the tags: every completion is plain text


class ParallelPolicy:
    """A tokenizer with the run's settings (`settings`, kept whole) and `eos_ids`, the ids that end a completion.

    A setting that samples with the engine (`rollout_mode` fork or sequential) needs the six tags in the tokenizer
    (refused here, naming the missing ones); a plain run, or a tokenizer without the tags, has no grammar."""

    def __init__(self, tokenizer, settings: ParallelArguments, eos_ids=frozenset()):
        self.tokenizer, self.settings, self.eos_ids = tokenizer, settings, frozenset(eos_ids)
        self.vocab = tag_vocab(tokenizer) if has_parallel_tokens(tokenizer) else None
        self.tokens = self.grammar = None
        if getattr(settings, "rollout_mode", "plain") != "plain":
            if self.vocab is None:
                tag_ids(tokenizer)  # raises, naming the missing tags
            self.tokens = EngineTokens.of(tokenizer, self.eos_ids, self.vocab)
            self.grammar = self.tokens.grammar(settings)

    @classmethod
    def from_pretrained(
        cls, path: str, revision: str | None = None, sampling: SamplingArguments | None = None, **overrides
    ) -> ParallelPolicy:
        """The policy of a saved model: its tokenizer, the settings it recorded (then `overrides`, None ignored:
        `model_settings.read_settings`) with `sampling`, how its tokens are to be drawn (none: it samples nothing),
        and its end ids (`model_settings.saved_eos_ids`)."""
        from transformers import AutoTokenizer

        from .model_settings import read_settings, saved_eos_ids

        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
        settings = read_settings(path, revision, **overrides)
        if sampling is not None:
            settings = SampledRolloutArguments(**asdict(settings), **asdict(sampling))
        return cls(tokenizer, settings, saved_eos_ids(tokenizer, path, revision))

    # ------------------------------------------------------------------ sampling

    def sampling(self, seed: int | None) -> Sampling:
        """How this policy's tokens are drawn, from its settings: `temperature` (the one `training_forward` scores
        at), `top_p` and, where the settings have one, `top_k`; `seed` seeds the generator that gives each
        completion its own seed (`rollout.backend.completion_seeds`)."""
        settings = self.settings
        if not hasattr(settings, "temperature"):
            raise ValueError(f"{type(settings).__name__} sets no temperature: this policy samples nothing")
        return Sampling(settings.temperature, settings.top_p, getattr(settings, "top_k", 0) or 0, seed)

    def ban_words(self) -> dict[int, str]:
        """The text of each id the grammar may ban, for a vLLM server, which takes bans as `bad_words`: texts it
        tokenizes with this tokenizer, banning the last id of each, and of its form after a space when that is a
        single other id. So each text must read back as its own id alone, and its spaced form as no other single
        id; a tokenizer that does not is refused here, naming the token. Empty without a grammar (nothing is
        banned)."""
        words = {}
        for token in self.grammar.controlled if self.grammar is not None else ():
            text = self.tokenizer.decode([token])
            alone = self.tokenizer.encode(text.lstrip(), add_special_tokens=False)  # as vLLM reads a bad word
            spaced = self.tokenizer.encode(" " + text.lstrip(), add_special_tokens=False)
            if alone != [token] or (len(spaced) == 1 and spaced != [token]):
                raise ValueError(
                    f"id {token} ({text!r}) cannot be banned on a vLLM server: its text does not tokenize back to "
                    "that one id alone"
                )
            words[token] = text
        return words

    @staticmethod
    def backend(
        sampling: Sampling,
        *,
        model=None,
        llm=None,
        client=None,
        ban_words: dict[int, str] | None = None,
        max_concurrent_requests: int = 64,
    ):
        """The decoding backend over exactly one of: a transformers `model`, an offline `vllm.LLM` (`llm`, also
        TRL's colocated engine) or TRL's `VLLMClient` of a server (`client`, with the policy's `ban_words`, at most
        `max_concurrent_requests` requests in flight)."""
        if sum(source is not None for source in (model, llm, client)) != 1:
            raise ValueError("a backend needs exactly one of model, llm or client")
        if model is not None:
            return TransformersBackend(model, sampling)
        from .rollout.vllm_backend import VLLMBackend

        return VLLMBackend(
            llm=llm,
            client=client,
            sampling=sampling,
            ban_words=ban_words,
            max_concurrent_requests=max_concurrent_requests,
        )

    def open_backend(self, path: str, args, sampling: Sampling, model_args=None, device=None, batch_size: int = 64):
        """The backend `args.backend` names (`rollout.arguments.BackendArguments`) over the saved model at `path`:
        the model loaded here onto `device` (`load_for_sampling`), an offline vLLM of it (`load_llm`, seeded with
        `sampling.seed`) or the server at `args.vllm_server_url`, which must serve it, with a request in flight for
        every segment `batch_size` completions decode at once. `model_args` (TRL's `ModelConfig`, optional): the
        revision, dtype and attention implementation to load."""
        revision = getattr(model_args, "model_revision", None)
        dtype = getattr(model_args, "dtype", None)
        if args.backend == "transformers":
            attention = getattr(model_args, "attn_implementation", None)
            model = load_for_sampling(path, revision, dtype, attention, device)
            return self.backend(sampling, model=model)
        if args.backend == "vllm":
            llm = load_llm(path, args, revision, dtype, sampling.seed, logprobs_mode="processed_logprobs")
            return self.backend(sampling, llm=llm)
        from trl.generation.vllm_client import VLLMClient

        from .rollout.vllm_backend import MAX_REQUESTS_IN_FLIGHT

        client = VLLMClient(base_url=args.vllm_server_url)
        requests = min(batch_size * paths_at_once(self.settings), MAX_REQUESTS_IN_FLIGHT)
        return self.backend(sampling, client=client, ban_words=self.ban_words(), max_concurrent_requests=requests)

    def engine(self, backend) -> ForkJoinEngine | PlainEngine:
        """The engine of these settings on `backend`: the fork-join engine, or for `rollout_mode: plain` one plain
        decode capped at `max_completion_length`."""
        if self.tokens is None:
            return PlainEngine(backend, self.settings.max_completion_length, self.eos_ids)
        return ForkJoinEngine(backend, self.tokens, self.grammar, self.settings)

    def rollouts(
        self, backend, prompts: list[list[int]], seeds: list[int] | None = None, progress: bool = False
    ) -> list[Rollout]:
        """One rollout per prompt (`engine`); `seeds[i]` is completion i's random stream (default: drawn by the
        backend). `progress`: a bar of the completions done, of those due."""
        return self.engine(backend).generate(prompts, seeds, progress=progress)

    # ------------------------------------------------------------------ training

    def training_forward(self, model, completion_start, sampled: bool = False):
        """`model` called on the run's structure (`attention`: isolated and tree rebuild it from the ids; causal is
        the model itself) and, for completions this policy `sampled`, scored as they were drawn: under the grammar
        the sampler obeyed, at the settings' `temperature` (`sampling`), a summary's tokens at the run's
        `summary_temperature`. `completion_start`: where the completions start, one for all rows or one per row
        (SFT, which scores its traces as written: not `sampled`)."""
        settings = self.settings
        if settings.attention != "causal" and self.vocab is None:
            tag_ids(self.tokenizer)  # raises, naming the missing tags
        if settings.attention == "isolated":
            model = IsolatedForward(model, self.vocab, completion_start, settings)
        elif settings.attention == "tree":
            model = TreeForward(model, self.vocab, completion_start, settings)
        if sampled and self.grammar is not None:
            temperature = self.sampling(None).temperature
            model = GrammarForward(model, self.grammar, completion_start, temperature, settings.summary_temperature)
        return model

    # ------------------------------------------------------------------ shapes

    def parse(self, completion_ids):
        """The completion's tag structure, read from its ids (all text for a tokenizer without the tags)."""
        return parse(completion_ids, self.vocab or NO_TAGS)

    def shape(self, completion_ids) -> dict:
        """The shape of one completion, in tokens: what `shape_metrics` sums up (and evaluation records keep).
        D counts the paths decoded at once by the longest of them (`language.stats`); `self_bleu` is the mean
        self-BLEU of its closed blocks' paths, None without one."""
        parsed = self.parse(completion_ids)
        shape = stats(parsed, concurrent_paths(self.settings))
        closed = any(block.closed for block in parsed.blocks)
        return {
            "well_formed": shape.well_formed,
            "has_parallel": shape.has_parallel,
            "blocks": shape.num_blocks,
            "paths_per_block": list(shape.paths_per_block),
            "block_positions": list(shape.block_positions),
            "tokens_total": shape.total,
            "tokens_critical": shape.critical,
            "alike_blocks": shape.alike_blocks,
            "self_bleu": self_bleu(parsed, self.tokenizer.decode) if closed else None,
        }


def shape_metrics(shapes: list[dict]) -> dict:
    """The shape of a set of completions (`ParallelPolicy.shape` of each), for the training logs and the evaluation
    tables: parallel ratio, format validity, blocks per completion, paths per block (mean, min and max over the
    blocks; all three 0 when no completion has a block), the share of blocks whose paths open alike, the mean
    self-BLEU of the completions with a closed block (0 without any; None, not measured, when a shape lacks it: an
    evaluation record written before it was kept), the mean relative block position, mean T and D, and D/T (sum
    over sum; 1 without tokens)."""
    if not shapes:
        raise ValueError("no completions to measure")
    count, blocks = len(shapes), sum(s["blocks"] for s in shapes)
    total, critical = sum(s["tokens_total"] for s in shapes), sum(s["tokens_critical"] for s in shapes)
    widths = [n for s in shapes for n in s["paths_per_block"]]
    positions = [p for s in shapes for p in s["block_positions"]]
    bleu = [s["self_bleu"] for s in shapes if s.get("self_bleu") is not None]
    measured = all("self_bleu" in s for s in shapes)
    alike = sum(s.get("alike_blocks", 0) for s in shapes)  # records older than the count hold none
    return {
        "parallel_ratio": sum(bool(s["has_parallel"]) for s in shapes) / count,
        "format_valid": sum(bool(s["well_formed"]) for s in shapes) / count,
        "blocks_per_completion": blocks / count,
        "paths_per_block": sum(widths) / blocks if blocks else 0.0,
        "paths_per_block_min": min(widths, default=0),
        "paths_per_block_max": max(widths, default=0),
        "openings_alike": alike / blocks if blocks else 0.0,
        "self_bleu": (sum(bleu) / len(bleu) if bleu else 0.0) if measured else None,
        "block_position": sum(positions) / len(positions) if positions else 0.0,
        "tokens_total": total / count,
        "tokens_critical": critical / count,
        "critical_over_total": critical / total if total else 1.0,
    }


def load_for_sampling(path: str, revision: str | None = None, dtype=None, attn_implementation=None, device=None):
    """A saved model loaded to sample from, in eval mode, on `device` (default: the GPU if there is one)."""
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(
        path, revision=revision, dtype=dtype, attn_implementation=attn_implementation
    )
    return model.to(device).eval()


def load_llm(path: str, vllm_args, revision: str | None = None, dtype=None, seed: int = 0, **options):
    """An offline `vllm.LLM` of a saved model with prefix caching (the engine's forks share their prompt's KV),
    `vllm_args`' memory share, context length and eager mode (`rollout.arguments.VLLMArguments`), and `options`
    for the rest (e.g. `tensor_parallel_size`, `logprobs_mode`)."""
    from vllm import LLM

    return LLM(
        model=path,
        revision=revision,
        dtype=dtype or "auto",
        seed=seed,
        enable_prefix_caching=True,
        gpu_memory_utilization=vllm_args.vllm_gpu_memory_utilization,
        max_model_len=vllm_args.vllm_max_model_length,
        enforce_eager=vllm_args.vllm_enforce_eager,
        **options,
    )
