"""The OpenAI-compatible HTTP API over a `Scheduler`, on FastAPI: `/v1/chat/completions`, `/v1/completions`,
`/v1/models` and `/health`.

- A request's completions carry their tags as text. With `"return_structure": true` (an extra field of the body:
  `extra_body` in the `openai` client) each choice also carries `parallel`: the blocks read from its ids (each
  block's paths, its summary, whether it closed), the final answer and whether the completion is well formed.
- `stream: true` answers with server-sent events, a chunk each time a completion grows (the engine commits a
  main stretch, a block's paths or a summary at once), then `data: [DONE]`. Text that could still become a stop
  string is held back until it cannot.
- A chat request's last user turn is wrapped in the prompt template the model was trained with (`prompt_template`,
  recorded in its config), then the conversation goes through the tokenizer's chat template; a completions request's
  prompt is read as it is (text or token ids).
- Bad input gets a 4xx whose body is OpenAI's error shape, naming the field (`param`): a body that is not JSON, an
  unknown field, an out-of-range value, an unknown model (404), a prompt that leaves no room in the context. Past
  the scheduler's queue a request gets 429; one that reaches a scheduler that has begun to drain, 503 (uvicorn
  closes its socket first). A client that goes away frees its completions at the scheduler's next step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..answers import extract_answer
from ..data import build_prompt
from ..rollout.backend import Sampling, completion_seeds
from ..tags.language import Block
from .scheduler import Busy, Closed, Job, Scheduler, Update

DISCONNECT_POLL_S = 0.5  # how often a request that waits for its answer checks that its client is still there
DRAIN_GRACE_S = 10  # after uvicorn has drained (and cut what outlived its timeout): the scheduler's last grace


# ---------------------------------------------------------------------------------------------------- requests


class _Request(BaseModel):
    """What the two generation endpoints share. A field OpenAI defines that would change what is sampled and that
    this server does not do (logprobs, nonzero penalties, logit_bias, best_of, echo, suffix, tools, a response format
    other than text) is refused by name; one given the value that changes nothing (`logprobs: false`,
    `presence_penalty: 0`, `response_format: {"type": "text"}`, null for a default) is accepted."""

    model_config = ConfigDict(extra="forbid")

    model: str
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what torch's generator takes
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    user: str | None = None
    return_structure: bool = False
    logprobs: Literal[False] | None = None
    presence_penalty: Literal[0] | None = None
    frequency_penalty: Literal[0] | None = None
    response_format: dict | None = None

    @field_validator("n", "stream", "return_structure", mode="before")
    @classmethod
    def _null_is_default(cls, value, info):
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value):
        if value not in (None, {"type": "text"}):
            raise ValueError("only {'type': 'text'} is served")
        return value

    def stops(self) -> tuple:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4 or any(not stop for stop in stops):
            raise BadRequest("stop takes up to 4 non-empty strings", "stop")
        return tuple(stops)


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for this endpoint


class ChatMessage(BaseModel):
    """A turn; its content as text or as OpenAI's list of text parts (joined), `developer` read as `system`."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict]
    name: str | None = None

    def turn(self) -> dict:
        content = self.content
        if isinstance(content, list):
            if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in content):
                raise BadRequest("only text parts ({'type': 'text', 'text': ...}) are served", "messages")
            content = "".join(part["text"] for part in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class BadRequest(Exception):
    """A request the server cannot answer: its message and the field it names (400 unless `status` says)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    """OpenAI's error body."""
    kind = {404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


# ---------------------------------------------------------------------------------------------------- the server


@dataclass
class Served:
    """What the API answers with: the `policy` (tokenizer, settings, structure), the `scheduler` that decodes, the
    name clients give as `model`, the `sampling` a request's unset fields take, and `context`, the most tokens a
    prompt and its completion may hold together."""

    policy: object
    scheduler: Scheduler
    name: str
    sampling: Sampling
    context: int


def create_app(served: Served) -> FastAPI:
    """The FastAPI app over `served`, whose scheduler has started: it drains when the app shuts down (after uvicorn
    has let the requests in flight finish)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(served.scheduler.drain, DRAIN_GRACE_S)

    app = FastAPI(title="parallel-r1", lifespan=lifespan)
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        first = error.errors()[0]
        if first.get("type") == "json_invalid":
            return error_response(400, f"the body is not valid JSON: {first.get('msg')}")
        where = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(where) or None
        return error_response(400, f"{param or 'body'}: {first.get('msg')}", param)

    @app.exception_handler(BadRequest)
    async def bad(request: Request, error: BadRequest):
        response = error_response(error.status, error.message, error.param, error.code)
        if error.status == 429:
            response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception):
        return error_response(500, f"the server failed: {type(error).__name__}: {error}")

    @app.get("/health")
    async def health():
        """Ok, with the completions decoding now and the requests waiting for a slot; 503 once the scheduler has
        stopped."""
        scheduler = served.scheduler
        if not scheduler.alive():
            return error_response(503, "the scheduler is not running")
        return {"status": "ok", "running": scheduler.running(), "waiting": scheduler.waiting()}

    @app.get("/v1/models")
    async def models():
        card = {"id": served.name, "object": "model", "created": created, "owned_by": "parallel-r1"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_model(served, body)
        return await _answer(served, body, _completion_prompt(served, body.prompt), request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        _check_model(served, body)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        return await _answer(served, body, _chat_prompt(served, body.messages), request, chat=True)

    return app


def _completion_prompt(served: Served, prompt) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise BadRequest("a batch of prompts is not served: send one prompt a request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt = served.policy.tokenizer.encode(prompt, add_special_tokens=False)
        if not prompt:
            raise BadRequest("the prompt is empty", "prompt")
        return prompt
    vocabulary = len(served.policy.tokenizer)
    if not prompt or any(not 0 <= token < vocabulary for token in prompt):
        raise BadRequest(f"token ids must be a non-empty list of ids in [0, {vocabulary})", "prompt")
    return list(prompt)


def _chat_prompt(served: Served, messages: list[ChatMessage]) -> list[int]:
    """The conversation with its last user turn in the model's prompt template, through the chat template."""
    users = [i for i, message in enumerate(messages) if message.role == "user"]
    if not users:
        raise BadRequest("messages hold no user turn", "messages")
    turns = [message.turn() for message in messages]
    try:
        (turns[users[-1]],) = build_prompt(turns[users[-1]]["content"], served.policy.settings.prompt_template)
    except ValueError as error:
        raise BadRequest(str(error), f"messages.{users[-1]}.content") from None
    tokenizer = served.policy.tokenizer
    try:
        return list(tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=False))
    except Exception as error:  # the model's chat template refuses the conversation (e.g. roles that do not alternate)
        raise BadRequest(f"the model's chat template refused the messages: {error}", "messages") from None


def _check_model(served: Served, body: _Request) -> None:
    if body.model != served.name:
        raise BadRequest(f"the model {body.model!r} does not exist: this server serves {served.name!r}", "model",
                         404, "model_not_found")  # fmt: skip


def _job_settings(served: Served, body: _Request, prompt: list[int]) -> dict:
    """The request's cap, sampling and seeds, checked against the model and the server."""
    limit = served.policy.settings.max_completion_length
    cap = min(body.max_tokens or limit, limit)  # the model's recorded budget bounds a completion
    room = served.context - len(prompt)
    if room < 1:
        raise BadRequest(f"the prompt holds {len(prompt)} tokens; the context holds {served.context}", "prompt",
                         code="context_length_exceeded")  # fmt: skip
    cap = min(cap, room)
    default = served.sampling
    sampling = Sampling(
        temperature=default.temperature if body.temperature is None else body.temperature,
        top_p=default.top_p if body.top_p is None else body.top_p,
        top_k=default.top_k,
    )
    if body.n > served.scheduler.max_running:
        raise BadRequest(f"n={body.n}: the server decodes at most {served.scheduler.max_running} completions at once",
                         "n")  # fmt: skip
    seeds = None
    if body.seed is not None:
        seeds = completion_seeds(torch.Generator().manual_seed(body.seed), body.n)
    return {"cap": cap, "sampling": sampling, "seeds": seeds, "stop": body.stops()}


async def _answer(served: Served, body: _Request, prompt: list[int], request: Request, chat: bool):
    settings = _job_settings(served, body, prompt)
    loop, updates = asyncio.get_running_loop(), asyncio.Queue()
    job = Job(prompt, lambda update: loop.call_soon_threadsafe(updates.put_nowait, update), n=body.n, **settings)
    try:
        served.scheduler.submit(job)
    except Busy as error:
        raise BadRequest(f"the server is at capacity: {error}; retry later", status=429) from None
    except Closed as error:
        raise BadRequest(str(error), status=503) from None
    reply = _Reply(served, body, prompt, chat, settings["stop"])
    if body.stream:
        return _Events(_stream(served, job, updates, reply), lambda: served.scheduler.cancel(job))
    getter = asyncio.ensure_future(updates.get())  # one pending get, kept across polls: no update is dropped
    try:
        ended = 0
        while ended < body.n:
            if not (await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S))[0]:
                if await request.is_disconnected():
                    served.scheduler.cancel(job)
                    return None
                continue
            update, getter = getter.result(), asyncio.ensure_future(updates.get())
            reply.take(update)
            ended += update.finish is not None
    except asyncio.CancelledError:
        served.scheduler.cancel(job)
        raise
    finally:
        getter.cancel()
    if reply.error:
        raise BadRequest(reply.error, status=500)
    return reply.whole()


async def _stream(served: Served, job: Job, updates: asyncio.Queue, reply: _Reply):
    """Server-sent events: each update's new text as a chunk, the last chunk of a completion with its finish reason
    (and its structure when asked), usage when `stream_options.include_usage`, then [DONE]. A client that goes away
    cancels the request."""
    ended = 0
    try:
        if reply.chat:
            yield _event(reply.chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                       "finish_reason": None} for i in range(job.n)]))  # fmt: skip
        while ended < job.n:
            update = await updates.get()
            delta = reply.take(update)
            ended += update.finish is not None
            if update.finish == "error":
                yield _event({"error": {"message": reply.error, "type": "server_error", "param": None, "code": None}})
                return
            if delta or update.finish:
                yield _event(reply.chunk([reply.choice_delta(update.index, delta, update.finish)]))
        if (reply.body.stream_options or {}).get("include_usage"):
            yield _event({**reply.chunk([]), "usage": reply.usage()})
        yield "data: [DONE]\n\n"
    finally:  # after the last event, a no-op; after a disconnect, the completions are stopped
        served.scheduler.cancel(job)


class _Events(StreamingResponse):
    """Server-sent events that cancel their request once the response is over, however it ended: the generator's own
    `finally` covers a stream it has started, not one cancelled before its first step (a client gone before the
    headers were sent)."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream")
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class _Reply:
    """What a request's answer holds so far: each completion's text, ids and finish, and the text streamed of it."""

    def __init__(self, served: Served, body: _Request, prompt: list[int], chat: bool, stops: tuple):
        self.served, self.body, self.prompt, self.chat = served, body, prompt, chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.texts, self.ids = [""] * body.n, [()] * body.n
        self.finishes, self.sent = [None] * body.n, [0] * body.n
        self.error = None
        self.hold = max((len(stop) for stop in stops), default=1) - 1

    def take(self, update: Update) -> str:
        """Keep `update`; return the text to stream now (none held back that a stop string could still claim, nor
        a half-decoded character)."""
        i = update.index
        if update.error:
            self.error = update.error
        self.texts[i], self.ids[i], self.finishes[i] = update.text, update.completion_ids, update.finish
        text = update.text
        if update.finish is None:
            text = text[: len(text) - self.hold] if self.hold else text
            text = text.rstrip("\ufffd")
        delta = text[self.sent[i] :] if len(text) > self.sent[i] else ""
        self.sent[i] = max(self.sent[i], len(text))
        return delta

    def chunk(self, choices: list) -> dict:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.served.name, "choices": choices}

    def choice_delta(self, index: int, delta: str, finish: str | None) -> dict:
        choice = {"index": index, "finish_reason": finish}
        if self.chat:
            choice["delta"] = {"content": delta} if delta else {}
        else:
            choice.update(text=delta, logprobs=None)
        if finish and self.body.return_structure:
            choice["parallel"] = structure(self.served.policy, self.ids[index], self.texts[index])
        return choice

    def usage(self) -> dict:
        completion = sum(len(ids) for ids in self.ids)
        prompt = len(self.prompt)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def whole(self) -> dict:
        choices = []
        for i in range(self.body.n):
            choice = {"index": i, "finish_reason": self.finishes[i]}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": self.texts[i]}
            else:
                choice.update(text=self.texts[i], logprobs=None)
            if self.body.return_structure:
                choice["parallel"] = structure(self.served.policy, self.ids[i], self.texts[i])
            choices.append(choice)
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.served.name,
                "choices": choices, "usage": self.usage()}  # fmt: skip


def structure(policy, completion_ids, text: str) -> dict:
    """A completion's structure, read from its ids (`ParallelPolicy.parse`): its blocks (each path's text, the
    summary, whether the block closed), its final answer (read from `text`, the completion as returned) and whether it
    is well formed."""
    parsed = policy.parse(list(completion_ids))
    decode = policy.tokenizer.decode

    def words(content) -> str:
        return decode(list(content), skip_special_tokens=True).strip()

    blocks = [
        {
            "paths": [words(path.body) for path in node.paths],
            "summary": None if node.summary is None else words(node.summary),
            "closed": node.closed and node.summary_closed,
        }
        for node in parsed.nodes
        if isinstance(node, Block)
    ]
    errors = [error.message for error in parsed.errors]
    return {"blocks": blocks, "answer": extract_answer(text), "well_formed": not errors, "format_errors": errors}
