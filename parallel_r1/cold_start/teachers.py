"""Teachers: ask a model for answers to chat prompts, through transformers, an offline vLLM or an OpenAI-compatible
server (or ask a Python function: a programmatic teacher), and hand each answer back as soon as it is there.

`make_teacher(config)` builds one; `teacher.ask(requests)` yields `(request, answer)` pairs, in any order, where an
answer is an `Answer` or, for a request that failed for good (a server that kept refusing), the exception. Every
request carries its own seed (`sample_seed`), so the answer to (problem, sample) does not depend on what else is
asked with it: a restarted run draws the same answers (token for token with transformers; vLLM's kernels are not
batch-invariant). The transformers and vLLM teachers decode through the rollout's backends
(`rollout.plain_decode`): answers come out, and are saved, as each one ends.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from ..model_settings import saved_eos_ids
from ..tags.tokens import eos_ids
from .config import ColdStartConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    question_id: str
    sample: int
    messages: list  # the chat prompt
    seed: int


@dataclass(frozen=True)
class Answer:
    text: str
    finish: str  # the backend's finish reason: "stop" (ended on its own), "length" (cut by max_new_tokens), ...
    tokens: int | None  # tokens the teacher wrote, when known


def sample_seed(seed: int, question_id: str, sample: int) -> int:
    return zlib.crc32(f"{seed}/{question_id}/{sample}".encode())


def make_teacher(config: ColdStartConfig):
    teachers = {
        "transformers": TransformersTeacher,
        "vllm": VLLMTeacher,
        "openai": EndpointTeacher,
        "function": FunctionTeacher,
    }
    return teachers[config.backend](config)


class FunctionTeacher:
    """A programmatic teacher: `model_name_or_path` names a function `package.module:name`, called as
    `name(messages, seed)` for each request; it returns the answer's text (a task with a known solution, such as
    the demo's)."""

    def __init__(self, config: ColdStartConfig):
        import importlib

        module, _, name = config.model_name_or_path.partition(":")
        try:
            self.function = getattr(importlib.import_module(module), name) if name else None
        except (ImportError, AttributeError) as error:
            raise ValueError(f"backend 'function': cannot load {config.model_name_or_path!r}: {error}") from None
        if not callable(self.function):
            raise ValueError(
                f"backend 'function' takes model_name_or_path as package.module:function, got "
                f"{config.model_name_or_path!r}"
            )

    def ask(self, requests: list[Request]) -> Iterator[tuple[Request, Answer]]:
        """Each request's text; a call that raises, or returns something else than a string, fails that request
        alone (reported at the end, as a server's failed request is)."""
        for request in requests:
            try:
                text = self.function(request.messages, request.seed)
            except Exception as error:  # the function's own bug or refusal: this request fails, the run goes on
                yield request, error
                continue
            if isinstance(text, str):
                yield request, Answer(text, "stop", None)
            else:
                yield request, TypeError(f"the function returned {type(text).__name__}, not the answer's text")


class TransformersTeacher:
    """The rollout's transformers backend, decoding plainly: `chunk_size` answers at once, the next request starting
    as soon as one ends; for small runs and tests."""

    def __init__(self, config: ColdStartConfig):
        from transformers import AutoTokenizer

        from ..policy import ParallelPolicy, load_for_sampling
        from ..rollout import Sampling

        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path, revision=config.model_revision)
        model = load_for_sampling(config.model_name_or_path, config.model_revision, config.dtype)
        self.eos = eos_ids(self.tokenizer, model.generation_config)
        if not self.eos:
            raise ValueError(f"{config.model_name_or_path} names no end-of-sequence token: it could not stop")
        sampling = Sampling(temperature=config.temperature, top_p=config.top_p)
        self.backend = ParallelPolicy.backend(sampling, model=model)

    def ask(self, requests: list[Request]) -> Iterator[tuple[Request, Answer]]:
        import torch

        with torch.no_grad():
            yield from _plain_answers(self.backend, self.tokenizer, self.eos, self.config, requests)


class VLLMTeacher:
    """An offline `vllm.LLM` (tensor parallel over `vllm_tensor_parallel_size` GPUs): `chunk_size` requests in its
    engine at once, the next one added as soon as one ends."""

    def __init__(self, config: ColdStartConfig):
        from ..policy import ParallelPolicy, load_llm
        from ..rollout import Sampling

        self.config = config
        llm = load_llm(
            config.model_name_or_path,
            config,
            config.model_revision,
            config.dtype,
            config.seed,
            tensor_parallel_size=config.vllm_tensor_parallel_size,
        )
        self.tokenizer = llm.get_tokenizer()
        self.eos = saved_eos_ids(self.tokenizer, config.model_name_or_path, config.model_revision)
        sampling = Sampling(temperature=config.temperature, top_p=config.top_p)
        self.backend = ParallelPolicy.backend(sampling, llm=llm)

    def ask(self, requests: list[Request]) -> Iterator[tuple[Request, Answer]]:
        yield from _plain_answers(self.backend, self.tokenizer, self.eos, self.config, requests)


def _plain_answers(backend, tokenizer, eos: set, config: ColdStartConfig, requests: list[Request]):
    """Each request's answer, decoded plainly from its chat prompt under its own seed, in the order they end."""
    from ..rollout import plain_decode

    prompts = [
        list(tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        for r in requests
    ]
    seeds = [r.seed for r in requests]
    for i, rollout in plain_decode(backend, prompts, config.max_new_tokens, eos, seeds, window=config.chunk_size):
        ids = rollout.completion_ids
        ended = rollout.finish == "eos"
        text = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
        yield requests[i], Answer(text, "stop" if ended else "length", len(ids))


class EndpointTeacher:
    """Chat completions from an OpenAI-compatible server through the `openai` client, `concurrency` in flight; the
    client retries refused or timed-out requests `max_retries` times with exponential back-off."""

    def __init__(self, config: ColdStartConfig):
        from openai import OpenAI

        self.config = config
        self.model = config.served_model_name or config.model_name_or_path
        self.client = OpenAI(
            base_url=config.base_url,
            api_key=os.environ.get(config.api_key_env) or "EMPTY",
            timeout=config.request_timeout,
            max_retries=config.max_retries,
        )

    def _one(self, request: Request) -> Answer:
        cfg = self.config
        response = self.client.chat.completions.create(
            model=self.model,
            messages=request.messages,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_new_tokens,
            seed=request.seed,
            n=1,
        )
        choice = response.choices[0]
        tokens = response.usage.completion_tokens if response.usage else None
        return Answer(choice.message.content or "", str(choice.finish_reason), tokens)

    def ask(self, requests: list[Request]) -> Iterator[tuple[Request, Answer | Exception]]:
        """The first request alone (a wrong URL, model name or key fails the run at once), then the rest."""
        try:
            yield requests[0], self._one(requests[0])
        except Exception as error:
            raise RuntimeError(
                f"the server at {self.config.base_url} did not answer a first request: {error}"
            ) from None
        pool = ThreadPoolExecutor(self.config.concurrency)
        try:
            futures = {pool.submit(self._one, r): r for r in requests[1:]}
            for future in as_completed(futures):
                try:
                    yield futures[future], future.result()
                except Exception as error:  # noqa: BLE001 - reported per request, the others go on
                    logger.warning(
                        "request %s/%d failed: %s", futures[future].question_id, futures[future].sample, error
                    )
                    yield futures[future], error
        finally:  # on an interrupt, the requests not sent are dropped and the ones in flight are not waited for
            pool.shutdown(wait=False, cancel_futures=True)
