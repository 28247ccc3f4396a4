"""Serving (`scripts/serve.py`, `parallel_r1.serving`): the official `openai` client against a server on localhost,
the scheduler's continuous batching, and every bad input and fault the API answers."""

import json
import signal
import threading
import time

import httpx
import openai
import pytest

from parallel_r1.model_settings import write_settings
from parallel_r1.rollout import RolloutArguments
from parallel_r1.testing.vllm_server import parallel_r1_server

SETTINGS = {"max_path_tokens": 12, "max_summary_tokens": 6, "max_completion_length": 3000}
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def served_model(tag_prone_dir, tmp_path_factory):
    """The tag-prone tiny model with its rollout recorded (fork, 2 paths, short paths and summaries)."""
    import shutil

    model = tmp_path_factory.mktemp("served") / "tiny-parallel"
    shutil.copytree(tag_prone_dir, model)
    write_settings(str(model), RolloutArguments(**SETTINGS))
    return model


@pytest.fixture(scope="module")
def endless_model(served_model, tmp_path_factory):
    """The served model with its EOS pinned far below every other token: each completion runs to its cap."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parallel_r1.testing.tiny import pin_logits

    model, tokenizer = AutoModelForCausalLM.from_pretrained(served_model), AutoTokenizer.from_pretrained(served_model)
    pin_logits(model, {tokenizer.eos_token_id: -100.0})
    folder = tmp_path_factory.mktemp("endless") / "tiny-parallel"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_settings(str(folder), RolloutArguments(**SETTINGS))
    return folder


@pytest.fixture(scope="module")
def server(served_model, tmp_path_factory):
    """`scripts/serve.py` on the tiny model: 8 completions at once, 32 requests may wait."""
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    with parallel_r1_server(served_model, "--max_running", "8", "--max_waiting", "32", log=log) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)


def chat(client, **request):
    return client.chat.completions.create(model="tiny-parallel", messages=QUESTION, **request)


def test_the_openai_client_lists_the_model_and_gets_tagged_completions_with_their_structure(
    client, server, served_model
):
    from transformers import AutoTokenizer

    from parallel_r1.data import build_prompt, prompt_ids
    from parallel_r1.tags.language import TAGS

    assert [model.id for model in client.models.list()] == ["tiny-parallel"]
    assert httpx.get(f"{server}/health").json() == {"status": "ok", "running": 0, "waiting": 0}
    answer = chat(client, seed=1, n=4, max_tokens=120, extra_body={"return_structure": True})
    assert len(answer.choices) == 4 and answer.model == "tiny-parallel"
    with_block = [c for c in answer.choices if "<Parallel>" in c.message.content]
    assert with_block, "the tag-prone model opens a block in some of 4 completions"
    for choice in answer.choices:
        structure = choice.model_extra["parallel"]
        blocks = structure["blocks"]
        assert len(blocks) == choice.message.content.count("<Parallel>")
        for block in blocks:
            assert len(block["paths"]) == 2 if block["closed"] else len(block["paths"]) <= 2  # min == max paths: 2
            assert all(path in choice.message.content and not any(t in path for t in TAGS) for path in block["paths"])
        assert choice.finish_reason in ("stop", "length")
        assert all(block["closed"] for block in blocks) or choice.finish_reason == "length"  # cut only by the cap
    # the chat prompt is the model's recorded template around the user's turn, as generate.py and evaluation build it
    tokenizer = AutoTokenizer.from_pretrained(served_model)
    expected = len(prompt_ids(tokenizer, build_prompt(QUESTION[0]["content"], "parallel")))
    assert answer.usage.prompt_tokens == expected
    text = client.completions.create(model="tiny-parallel", prompt="2 + 3 =", max_tokens=5, seed=0)
    assert text.choices[0].finish_reason in ("stop", "length") and text.usage.completion_tokens <= 5
    assert text.usage.prompt_tokens == len(tokenizer.encode("2 + 3 =", add_special_tokens=False))


def test_a_seeded_completion_is_the_same_alone_streamed_and_under_32_concurrent_clients(client):
    from concurrent.futures import ThreadPoolExecutor

    request = {"seed": 7, "n": 2, "max_tokens": 150, "temperature": 0.9}
    alone = [c.message.content for c in chat(client, **request).choices]
    assert alone[0] != alone[1], "the n completions of one request draw from streams of their own"

    streamed = ["", ""]
    finishes = {}
    chunks = 0
    for chunk in chat(client, stream=True, **request):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        chunks += 1
    assert streamed == alone and set(finishes) == {0, 1}
    assert chunks > 4, "a completion is streamed as it grows, not in one piece"

    def one(i: int):
        if i == 13:
            return [c.message.content for c in chat(client, **request).choices]
        return chat(client, seed=100 + i, n=1, max_tokens=150).choices[0].message.content

    with ThreadPoolExecutor(32) as pool:
        under_load = list(pool.map(one, range(32)))
    assert under_load[13] == alone
    assert len(set(map(str, under_load))) > 16, "the other clients' seeds give other completions"


def test_a_stop_string_ends_the_completion_where_it_first_appears(client):
    full = chat(client, seed=3, max_tokens=400).choices[0].message.content
    assert "<Summary>" in full, "seed 3 opens a block (pick another seed if the tiny model changes)"
    answer = chat(
        client, seed=3, max_tokens=400, stop=["<Summary>", "never there"], extra_body={"return_structure": True}
    )
    stopped = answer.choices[0]
    assert stopped.message.content == full[: full.index("<Summary>")] and stopped.finish_reason == "stop"
    # what is counted and parsed is what is returned: the tokens up to the stop string, not the phase decoded past it
    blocks = stopped.model_extra["parallel"]["blocks"]
    assert len(blocks) == stopped.message.content.count("<Parallel>") and not blocks[-1]["closed"]
    assert blocks[-1]["summary"] is None and all(path in stopped.message.content for path in blocks[-1]["paths"])
    assert answer.usage.completion_tokens < chat(client, seed=3, max_tokens=400).usage.completion_tokens
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(client, seed=3, max_tokens=400,
                                                                       stop="<Summary>", stream=True) if c.choices)  # fmt: skip
    assert streamed == stopped.message.content


def test_bad_requests_get_an_openai_error_naming_the_field_and_the_server_goes_on(client, server):
    def error_of(response: httpx.Response) -> dict:
        return response.json()["error"]

    malformed = httpx.post(f"{server}/v1/chat/completions", content=b'{"model": "tiny-parallel", "messages": [',
                           headers={"content-type": "application/json"})  # fmt: skip
    assert malformed.status_code == 400 and "not valid JSON" in error_of(malformed)["message"]
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert unknown.value.body["param"] == "model" and unknown.value.body["code"] == "model_not_found"
    cases = {
        "temperature": {"temperature": -1.0},
        "top_p": {"top_p": 0.0},
        "max_tokens": {"max_tokens": 0},
        "n": {"n": 9},  # more than the server decodes at once
        "stop": {"stop": ["a", "b", "c", "d", "e"]},
        "seed": {"seed": 2**64},
        "logprobs": {"logprobs": True},  # what we do not sample is refused, not ignored
    }
    for param, request in cases.items():
        with pytest.raises(openai.BadRequestError) as bad:
            chat(client, **request)
        assert bad.value.body["param"] == param and bad.value.body["type"] == "invalid_request_error", param
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="tiny-parallel", prompt=[5] * 5000, max_tokens=4)
    assert long.value.body["param"] == "prompt" and long.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as ids:
        client.completions.create(model="tiny-parallel", prompt=[10**6], max_tokens=4)
    assert ids.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as empty:
        client.completions.create(model="tiny-parallel", prompt="", max_tokens=4)
    assert empty.value.body["param"] == "prompt"
    assert httpx.get(f"{server}/health").json()["running"] == 0  # nothing of a refused request stays behind
    # what changes nothing is accepted as OpenAI clients send it
    plain = chat(client, seed=0, max_tokens=8).choices[0].message.content
    same = chat(client, seed=0, max_tokens=8, logprobs=False, presence_penalty=0, frequency_penalty=0,
                response_format={"type": "text"}, n=None)  # fmt: skip
    parts = client.chat.completions.create(model="tiny-parallel", seed=0, max_tokens=8, messages=[
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "What is "},
                                                                                   {"type": "text", "text": "2 + 3?"}]}])  # fmt: skip
    with_system = client.chat.completions.create(model="tiny-parallel", seed=0, max_tokens=8, messages=[
        {"role": "system", "content": "Be brief."}, *QUESTION])  # fmt: skip
    assert same.choices[0].message.content == plain
    assert parts.choices[0].message.content == with_system.choices[0].message.content
    assert parts.usage.prompt_tokens == with_system.usage.prompt_tokens


def wait_until_idle(server: str, timeout: float = 10) -> float:
    began = time.monotonic()
    while httpx.get(f"{server}/health").json()["running"]:
        assert time.monotonic() - began < timeout, "the server kept decoding for a client that left"
        time.sleep(0.05)
    return time.monotonic() - began


def test_a_client_that_leaves_frees_its_completions(endless_model, tmp_path):
    long = {"seed": 11, "max_tokens": 3000, "n": 4}  # a minute or more to the end
    with parallel_r1_server(endless_model, log=tmp_path / "serve.log") as (server, _):
        leave_mid_stream(server, long)
        assert wait_until_idle(server) < 3.0
        leave_before_the_first_event(server, long)
        assert wait_until_idle(server) < 3.0
        quick = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=0.3)
        with pytest.raises(openai.APITimeoutError):
            chat(quick, **long)
        assert wait_until_idle(server) < 3.0
        answer = chat(openai.OpenAI(base_url=f"{server}/v1", api_key="none"), seed=1, max_tokens=50)
        assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 50


def leave_mid_stream(server: str, request: dict) -> None:
    """Start a streamed request, read up to its first text, and close the connection."""
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=60,
                      json={"model": "tiny-parallel", "messages": QUESTION, "stream": True, **request}) as response:  # fmt: skip
        lines = response.iter_lines()  # held: a dropped iterator would close the connection now
        for line in lines:  # up to the first text: the completions are decoding
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0].get("delta", {}).get("content"):
                break
        assert httpx.get(f"{server}/health").json()["running"] == request["n"]


def leave_before_the_first_event(server: str, request: dict) -> None:
    """Start a streamed completion, take its headers, and close the connection before any event. No role chunk comes
    first on this endpoint, and a stop string of 2,000 characters holds back the text until there is more than that:
    hundreds of tokens, over a second of decoding for each of these completions. (With the headers sent, the stream's
    generator has started and waits for its first text: its own `finally` cancels the request.)"""
    body = {"model": "tiny-parallel", "prompt": "What is 2+2?", "stream": True, "stop": "~" * 2000, **request}
    with httpx.stream("POST", f"{server}/v1/completions", timeout=60, json=body) as response:
        assert response.status_code == 200
        while httpx.get(f"{server}/health").json()["running"] < request["n"]:
            time.sleep(0.02)


def test_past_the_queue_a_request_gets_429_and_the_others_are_answered(client, server):
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int):
        try:
            return chat(client, seed=i, max_tokens=200).choices[0].finish_reason
        except openai.RateLimitError as error:
            assert error.body["type"] == "rate_limit_error" and error.response.headers["retry-after"] == "1"
            return 429

    with ThreadPoolExecutor(64) as pool:  # 32 may wait (and 8 decode once started): the rest are refused
        answers = list(pool.map(one, range(64)))
    assert answers.count(429) >= 1 and sum(a in ("stop", "length") for a in answers) == 64 - answers.count(429) >= 32
    wait_until_idle(server)


@pytest.mark.slow  # measured: about 12 s
def test_sigterm_drains_the_requests_in_flight_then_exits(endless_model, tmp_path):
    with parallel_r1_server(endless_model, log=tmp_path / "serve.log") as (url, process):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        answers = []
        asking = threading.Thread(target=lambda: answers.append(chat(client, seed=5, n=2, max_tokens=800)))
        asking.start()
        while httpx.get(f"{url}/health").json()["running"] < 2:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.HTTPError):  # draining: no new request is taken
            httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny-parallel", "messages": QUESTION}, timeout=5)
        asking.join(timeout=120)
        assert process.wait(timeout=60) == -signal.SIGTERM  # uvicorn re-raises the signal once it has drained
    (answer,) = answers
    assert [(c.finish_reason, len(c.message.content) > 0) for c in answer.choices] == [("length", True)] * 2
    assert answer.usage.completion_tokens == 2 * 800


# ---------------------------------------------------------------------------------------------------- the scheduler


@pytest.fixture(scope="module")
def policy_and_backend(served_model):
    from parallel_r1.sampling import ParallelSampler

    sampler = ParallelSampler(str(served_model), temperature=1.0, seed=0)
    return sampler.policy, sampler.backend


@pytest.mark.parametrize("mode", ["fork", "plain"])
def test_requests_joining_a_running_batch_get_what_they_get_alone(served_model, mode):
    """Continuous batching: a request that arrives while others decode gets the completions it gets alone."""
    from parallel_r1.data import build_prompt, prompt_ids
    from parallel_r1.policy import ParallelPolicy, load_for_sampling
    from parallel_r1.rollout import Sampling
    from parallel_r1.rollout.hf_backend import TransformersBackend
    from parallel_r1.serving import Job, Scheduler

    policy = ParallelPolicy.from_pretrained(str(served_model), rollout_mode=mode if mode == "plain" else None,
                                            max_completion_length=120)  # fmt: skip
    model = load_for_sampling(str(served_model), device="cpu")
    prompts = [prompt_ids(policy.tokenizer, build_prompt(q, "parallel")) for q in ["1 + 1?", "7 * 6?", "Name it."]]
    sampling = Sampling(temperature=0.8, top_p=0.9)
    alone = [policy.engine(TransformersBackend(model, sampling)).generate([p], [seed])[0] for seed, p in
             enumerate(prompts)]  # fmt: skip

    scheduler = Scheduler(lambda: policy.engine(TransformersBackend(model, Sampling())), policy.tokenizer.decode, 4, 8)
    done, updates = threading.Event(), {}

    def listener(seed):
        def hear(update):
            updates.setdefault(seed, []).append(update)
            if len(updates) == 3 and all(u[-1].finish for u in updates.values()):
                done.set()

        return hear

    scheduler.start()
    for seed, prompt in enumerate(prompts):  # each arrives while the earlier ones decode
        assert seed == 0 or scheduler.running() > 0, "the earlier requests had ended: nothing was joined"
        scheduler.submit(Job(prompt, listener(seed), seeds=[seed], sampling=sampling))
        while scheduler.running() == 0 and not updates.get(seed):
            time.sleep(0.001)
    assert done.wait(60)
    scheduler.drain(10)
    for seed, rollout in enumerate(alone):
        final = updates[seed][-1]
        assert list(final.completion_ids) == rollout.completion_ids
        assert final.finish == ("stop" if rollout.finish == "eos" else "length")
        assert [len(u.completion_ids) for u in updates[seed]] == sorted({len(u.completion_ids) for u in updates[seed]})


def test_the_scheduler_refuses_past_its_queue_and_after_drain(policy_and_backend):
    from parallel_r1.serving import Busy, Closed, Job, Scheduler

    policy, backend = policy_and_backend
    scheduler = Scheduler(lambda: policy.engine(backend), policy.tokenizer.decode, max_running=2, max_waiting=1)
    prompt = policy.tokenizer.encode("2 + 2", add_special_tokens=False)
    with pytest.raises(ValueError, match="n=3"):
        scheduler.submit(Job(prompt, print, n=3))
    scheduler.submit(Job(prompt, lambda u: None, n=2))  # not started yet: it waits
    with pytest.raises(Busy):
        scheduler.submit(Job(prompt, lambda u: None))
    scheduler.start()
    scheduler.drain(60)
    assert scheduler.running() == 0 and scheduler.waiting() == 0
    with pytest.raises(Closed):
        scheduler.submit(Job(prompt, lambda u: None))
    assert not scheduler.alive()
    long, heard = Scheduler(lambda: policy.engine(backend), policy.tokenizer.decode).start(), []
    long.submit(Job(prompt, heard.append, n=2, cap=3000))
    while long.running() < 2:
        time.sleep(0.01)
    long.drain(timeout=0.05)  # past its timeout a drain ends what is left, with an error
    assert not long.alive() and long.running() == 0
    assert {u.index for u in heard if u.finish} == {0, 1}  # each ended: on its own, or by the drain
    assert any(u.finish == "error" and "shut down" in u.error for u in heard)
    with pytest.raises(FileNotFoundError, match="no such model"):  # an engine that cannot be built: said at start

        def missing():
            raise FileNotFoundError("no such model")

        Scheduler(missing, policy.tokenizer.decode).start()


def test_a_structure_is_read_from_the_ids(policy_and_backend):
    from parallel_r1.serving import structure

    policy, _ = policy_and_backend
    tokenizer = policy.tokenizer
    text = "Let me see.<Parallel><Path>2 + 3 = 5</Path><Path>3 + 2 = 5</Path></Parallel>\n<Summary>5</Summary>"
    text += "Final Answer: 5"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert structure(policy, ids, text) == {
        "blocks": [{"paths": ["2 + 3 = 5", "3 + 2 = 5"], "summary": "5", "closed": True}],
        "answer": "5",
        "well_formed": True,
        "format_errors": [],
    }
    spelled = tokenizer.encode("<", add_special_tokens=False) + tokenizer.encode("Parallel>", add_special_tokens=False)
    assert structure(policy, spelled, "<Parallel>")["blocks"] == []  # a tag spelled in ordinary tokens is text


# ---------------------------------------------------------------------------------------------------- vLLM, SmolLM2


def same_alone_and_under_load(client, model: str, clients: int = 32, **request) -> tuple[list, list]:
    """The completions of `request` alone, and again as one of `clients` concurrent requests (the others seeded
    otherwise)."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(seed: int) -> list:
        answer = client.chat.completions.create(model=model, messages=QUESTION, **{**request, "seed": seed})
        return [choice.message.content for choice in answer.choices]

    alone = ask(request["seed"])
    with ThreadPoolExecutor(clients) as pool:
        loaded = list(pool.map(ask, [request["seed"] if i == clients // 2 else 1000 + i for i in range(clients)]))
    return alone, loaded[clients // 2]


@pytest.mark.slow  # measured: about 60 s (the engine's start)
@pytest.mark.vllm
def test_the_vllm_backend_serves_the_same_seeded_completion_alone_and_under_32_clients(served_model, tmp_path):
    flags = ["--backend", "vllm", "--vllm_enforce_eager", "true", "--vllm_max_model_length", "1024"]
    with parallel_r1_server(served_model, *flags, log=tmp_path / "serve.log") as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        alone, loaded = same_alone_and_under_load(client, "tiny-parallel", seed=7, n=2, max_tokens=150)
        assert alone == loaded and any("<Parallel>" in text for text in alone)
        streamed = ["", ""]
        for chunk in client.chat.completions.create(model="tiny-parallel", messages=QUESTION, seed=7, n=2,
                                                    max_tokens=150, stream=True):  # fmt: skip
            for choice in chunk.choices:
                streamed[choice.index] += choice.delta.content or ""
        assert streamed == alone


@pytest.mark.slow  # measured: about 40 s
def test_the_real_model_answers_the_openai_client(real_model_dir, tmp_path):
    """SmolLM2-135M-Instruct as it is: served plain (it has no tags until the cold start teaches them), its chat
    turn as the user wrote it (`prompt_template: none`)."""
    flags = ["--rollout_mode", "plain", "--prompt_template", "none", "--served_model_name", "smollm2",
             "--max_completion_length", "64"]  # fmt: skip
    with parallel_r1_server(real_model_dir, *flags, log=tmp_path / "serve.log") as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        answer = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0
        )
        assert "Paris" in answer.choices[0].message.content
        alone, loaded = same_alone_and_under_load(client, "smollm2", clients=8, seed=3, max_tokens=32)
        assert alone == loaded


def test_a_failed_step_fails_the_requests_it_was_decoding_and_the_scheduler_goes_on(policy_and_backend):
    from parallel_r1.serving import Job, Scheduler

    policy, backend = policy_and_backend

    class Flaky:  # the real backend, whose third step fails once
        def __init__(self, inner):
            self.inner, self.steps = inner, 0

        def step(self):
            self.steps += 1
            if self.steps == 3:
                raise RuntimeError("the device fell over")
            return self.inner.step()

        def __getattr__(self, name):
            return getattr(self.inner, name)

    scheduler = Scheduler(lambda: policy.engine(Flaky(backend)), policy.tokenizer.decode, max_running=4).start()
    prompt = policy.tokenizer.encode("2 + 2", add_special_tokens=False)
    first, second = [], []
    scheduler.submit(Job(prompt, first.append, n=2, seeds=[1, 2], cap=60))
    deadline = time.monotonic() + 60
    while sum(u.finish is not None for u in first) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [u.finish for u in first if u.finish] == ["error", "error"]
    assert "the device fell over" in first[-1].error and scheduler.running() == 0
    scheduler.submit(Job(prompt, second.append, seeds=[1], cap=60))
    scheduler.drain(60)
    assert second[-1].finish in ("stop", "length") and second[-1].error is None
