"""User-facing edges of the scripts: resuming, a missing model folder, sampling, --help (one-line errors: test_errors)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi

from parallel_r1 import cli
from parallel_r1.cli import HUB_TIMEOUT_S, check_model_path, hub_problem
from parallel_r1.training import resume_target

ROOT = Path(__file__).resolve().parents[1]
REAL_MODEL_INFO = HfApi.model_info


def test_resume_true_takes_the_newest_complete_checkpoint(tmp_path, caplog):
    for step in (2, 10, 4, 12):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if step != 12:  # checkpoint-12: a save cut short, the weights written but not the trainer state
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-14").mkdir()
    (tmp_path / "checkpoint-14" / "trainer_state.json").write_text('{"global_step": 1')  # cut mid-write
    (tmp_path / "checkpoint-x").mkdir()
    assert resume_target("true", str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert "Skipping checkpoint-14, checkpoint-12" in caplog.text
    assert resume_target("last", str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert resume_target(str(tmp_path / "checkpoint-2"), str(tmp_path)) == str(tmp_path / "checkpoint-2")
    assert resume_target(None, str(tmp_path)) is None and resume_target("false", str(tmp_path)) is None


@pytest.mark.parametrize(
    "value, message", [("true", "no complete checkpoint-\\* folder in"), ("nope", "no such checkpoint")]
)
def test_resume_with_nothing_to_resume_is_refused(tmp_path, value, message):
    with pytest.raises(FileNotFoundError, match=message):
        resume_target(value, str(tmp_path / "empty"))


def test_a_missing_local_model_folder_is_refused_before_any_hub_lookup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    for name in (str(tmp_path / "missing"), "./missing", "outputs/missing", "a/b/c"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            check_model_path(name)
    check_model_path(str(tmp_path))  # a folder that is there


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The Hub as `hub_problem` asks it: an empty cache, online, and a `model_info` the test sets (called once)."""
    from huggingface_hub import HfApi, constants

    hub_problem.cache_clear()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    asked = []

    def answer_with(reply):
        def model_info(self, name, timeout=None, **kwargs):
            asked.append((name, timeout))
            if isinstance(reply, BaseException):
                raise reply
            return reply

        monkeypatch.setattr(HfApi, "model_info", model_info)
        return asked

    yield answer_with
    hub_problem.cache_clear()


def _http_error(cls, status):
    import httpx

    response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/a/b"))
    return cls("no", response=response)


def test_a_hub_id_is_asked_of_the_hub_once(hub):
    asked = hub(object())
    check_model_path("Qwen/Qwen3-4B-Base")
    check_model_path("Qwen/Qwen3-4B-Base")
    assert asked == [("Qwen/Qwen3-4B-Base", HUB_TIMEOUT_S)]  # once, with the short timeout


@pytest.mark.parametrize(
    "reply, said",
    [
        ("RepositoryNotFoundError", "the Hub has no such model"),
        ("GatedRepoError", None),  # there, behind a licence: loading it says so
        (ConnectionError("Name or service not known"), "the Hub could not be reached to look for it (Name or service"),
        (TimeoutError("timed out"), "the Hub could not be reached to look for it (timed out)"),
    ],
)
def test_what_the_hub_answers_decides(hub, reply, said):
    from huggingface_hub import errors

    if isinstance(reply, str):
        reply = _http_error(getattr(errors, reply), 404)
    hub(reply)
    if said is None:
        check_model_path("you/gated")
        return
    with pytest.raises(FileNotFoundError, match="model you/typo is not a local folder, and ") as raised:
        check_model_path("you/typo")
    assert said in str(raised.value)


def test_offline_only_the_cache_counts(hub, monkeypatch, tmp_path):
    from huggingface_hub import constants

    asked = hub(object())
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="offline .HF_HUB_OFFLINE. the Hugging Face cache does not hold it"):
        check_model_path("you/model")
    snapshot = tmp_path / "cache" / "models--you--cached" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "cache" / "models--you--cached" / "refs").mkdir()
    (tmp_path / "cache" / "models--you--cached" / "refs" / "main").write_text("0" * 40)
    check_model_path("you/cached")  # in the cache: taken, offline or not
    assert asked == []  # and the Hub was never asked


def test_a_hub_that_never_answers_is_given_up_in_seconds(hub, monkeypatch):
    """A node whose firewall drops packets: the one question times out, it does not hang the run."""
    import socket

    from huggingface_hub import HfApi, constants

    monkeypatch.setattr(HfApi, "model_info", REAL_MODEL_INFO)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()  # accepts, never answers
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setattr(cli, "HUB_TIMEOUT_S", 1.0)
    began = time.monotonic()
    try:
        with pytest.raises(FileNotFoundError, match="could not be reached"):
            check_model_path("you/silent")
    finally:
        server.close()
    assert time.monotonic() - began < 5


@pytest.mark.slow  # measured: 10-27 s with its setup (make test-quick leaves it out); vLLM: about a minute more
@pytest.mark.parametrize("backend", ["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_generate_samples_with_the_recorded_settings_and_keeps_the_tags(tag_prone_dir, tmp_path, backend):
    import json
    import shutil

    from parallel_r1.model_settings import read_settings
    from parallel_r1.rollout import RolloutArguments
    from parallel_r1.tags.language import TAGS, parse
    from parallel_r1.tags.tokens import tag_vocab

    model = tmp_path / "model"
    shutil.copytree(tag_prone_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["parallel_r1"] = {**vars(RolloutArguments(min_paths=3, max_paths=3, max_path_tokens=12, max_summary_tokens=6,
                                                     max_completion_length=80))}  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    assert (
        read_settings(str(model)).max_paths == 3 and read_settings(str(model), min_paths=4, max_paths=4).min_paths == 4
    )
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"problem": q}) + "\n" for q in ["What is 2+2?", "x", "Tell me.", "a b c"]))
    out = tmp_path / "answers.jsonl"
    command = [sys.executable, "scripts/generate.py", "--model_name_or_path", str(model), "--file", str(problems),
               "--prompt", "Compute 17*3 please.", "--output", str(out), "--backend", backend]  # fmt: skip
    if backend == "vllm":
        command += ["--vllm_enforce_eager", "true", "--vllm_max_model_length", "1024"]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["problem"] for a in answers] == ["Compute 17*3 please.", "What is 2+2?", "x", "Tell me.", "a b c"]
    from transformers import AutoTokenizer

    vocab = tag_vocab(AutoTokenizer.from_pretrained(model))
    blocks = [b for a in answers for b in parse(a["completion_ids"], vocab).blocks]
    closed = [b for b in blocks if b.closed]
    assert closed and all(len(b.paths) == 3 for b in closed)  # the recorded width
    assert any(tag in a["completion"] for a in answers for tag in TAGS)  # tags printed whole
    assert all(len(a["completion_ids"]) <= 80 for a in answers)
    bad = subprocess.run([*command[:4], "--file", str(tmp_path / "none.txt")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: --file")


def test_settings_are_read_from_parallel_r1_json_and_a_plain_model_decodes_without_the_engine(tiny_dir, tmp_path):
    import json
    import shutil

    from parallel_r1.model_settings import read_settings, write_settings
    from parallel_r1.rollout import RolloutArguments
    from parallel_r1.sampling import ParallelSampler

    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    write_settings(
        str(model), RolloutArguments(rollout_mode="plain", prompt_template="plain", max_completion_length=16)
    )
    assert read_settings(str(model)).rollout_mode == "plain"  # no key in config.json: the file (a PEFT folder)
    sampler = ParallelSampler(str(model), temperature=1.0, seed=0)
    rollouts = sampler.answer(["What is 2+2?", "x"])
    assert sampler.policy.tokens is None and all(0 < len(r.completion_ids) <= 16 for r in rollouts)
    assert json.loads((model / "parallel_r1.json").read_text())["prompt_template"] == "plain"


def test_a_folder_without_config_json_is_read_offline(tmp_path):
    """A PEFT adapter folder: its settings come from parallel_r1.json; a folder with neither: the defaults."""
    from parallel_r1.model_settings import read_settings, write_settings
    from parallel_r1.rollout import RolloutArguments

    (tmp_path / "adapter" / "adapter_config.json").parent.mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    write_settings(str(tmp_path / "adapter"), RolloutArguments(min_paths=5, max_paths=5))
    assert read_settings(str(tmp_path / "adapter"), max_blocks=1) == RolloutArguments(
        min_paths=5, max_paths=5, max_blocks=1
    )
    (tmp_path / "empty").mkdir()
    assert read_settings(str(tmp_path / "empty"), min_paths=None, max_paths=None) == RolloutArguments()
    assert read_settings(str(tmp_path / "empty"), min_paths=3, max_paths=3) == RolloutArguments(
        min_paths=3, max_paths=3
    )


@pytest.mark.parametrize("script", ["sft", "grpo", "evaluate", "generate_cold_start"])
def test_help_lists_the_recipe_flag_and_loads_no_trainer(script):
    """--help is quick because it loads only the parser: no TRL trainer, vLLM, datasets or evaluation runner."""
    result = subprocess.run([sys.executable, "-X", "importtime", f"scripts/{script}.py", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0 and "--config RECIPE.yaml" in result.stdout
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    assert "trl.trainer.base_config" in imported  # the import log is read (the check is meaningful)
    heavy = {"vllm", "trl.trainer.grpo_trainer", "trl.trainer.sft_trainer", "datasets", "parallel_r1.trainers"}
    assert not heavy & imported and "parallel_r1.evaluation.runner" not in imported


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: make gpu-check runs for real")
def test_gpu_check_says_in_one_line_that_it_needs_a_gpu():
    env = {**os.environ, "GPU_CHECK_INSTALL": "0", "PYTHON": sys.executable}
    result = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == f"error: no CUDA device is visible to torch {torch.__version__}; make gpu-check needs one"
    )
