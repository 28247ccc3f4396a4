"""Training on two processes (gloo on CPU), as every user runs the project: DDP and DeepSpeed ZeRO-3.

The rules checked, each through the scripts under `accelerate launch`:
- SFT on 2 processes with per-device batch b ends where 1 process with batch 2b ends: the same logged losses and
  gradient norms, the same weights, to float tolerance; under DDP, ZeRO-3 (`accelerate_configs/zero3_cpu.yaml`)
  and ZeRO-2 (`zero2_cpu.yaml`). The base lacks the tags, so each run adds them (under ZeRO-3 into the
  partitioned embedding's spare rows) and trains their rows at 10 times the rate (`tag_lr_multiplier`, under
  DeepSpeed in each process's part of its float32 copy; under ZeRO-2 the second process holds none of the
  embedding, where the earlier whole-tensor gathers hung): the rows start and move as on one process.
- GRPO with fork-join rollouts, isolated and tree, under DDP and ZeRO-3: every step logs a finite loss and reward
  and the shape of the completions, the two processes sample different completions of a group, the weights move,
  the whole model is saved with its tags.
- ZeRO-3 GRPO (tree) killed by SIGKILL after its checkpoint 2 and launched again with `--resume_from_checkpoint
  true` logs the rewards and ends with the weights of the unbroken 2-process run.
- `ds3_gather_for_generation=false` under ZeRO-3 with the engine on transformers is refused at start.
- SFT on one process and two and DDP GRPO (isolated) also run with `--report_to trackio`, behind the network guard
  (tests/tracking.py): every number they log is a scalar of their trackio run, and no request leaves the machine.

DDP on CPU is torchrun's launcher (`--multi_gpu`) with the recipes' `use_cpu: true`, which makes the processes
gloo ones (accelerate's MULTI_CPU). The ten launches run three or four at a time (a launch alone keeps about one of two
cores busy: most of it is imports): about 3.5 minutes on 2 cores. The first ZeRO-3 launch on a machine builds
DeepSpeed's CPU communication op (~2 min, cached in ~/.cache/torch_extensions, shared with test_sft.py's ZeRO-3 test).
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import ExitStack
from pathlib import Path

import pandas as pd
import pytest
import torch
from launches import GLOBAL_BATCH_4, Launches, complete, step_logs, weights_differ
from safetensors.torch import load_file
from tracking import metric_names, not_in_store, read_store, refused, tracked_env
from transformers import AutoTokenizer

from parallel_r1.configs import ParallelGRPOConfig
from parallel_r1.tags.language import TAGS
from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.tiny_grpo import tiny_grpo_config
from parallel_r1.trainers import ParallelGRPOTrainer
from parallel_r1.trainers.grpo import _without_zero3_step_hook, check_zero3_generation

LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--num_cpu_threads_per_process", "1"]
SETUPS = {
    "one": ["--config_file", "accelerate_configs/cpu.yaml"],
    "ddp": ["--config_file", "accelerate_configs/cpu.yaml", "--multi_gpu", "--num_processes", "2"],
    "zero3": ["--config_file", "accelerate_configs/zero3_cpu.yaml", "--num_processes", "2"],
    "zero2": ["--config_file", "accelerate_configs/zero2_cpu.yaml", "--num_processes", "2"],
}

SFT_STEPS, SFT_BATCH = 4, 2  # 8 traces: an epoch is 2 steps of 2 x 2 (or 1 x 4), so the runs cross one
TAG_RATE = 10
SFT = ["scripts/sft.py", "--config", "recipes/tiny/sft.yaml", "--max_length", "1200", "--max_train_samples", "8"]
SFT += ["--max_steps", str(SFT_STEPS), "--logging_steps", "1", "--seed", "0", "--tag_lr_multiplier", str(TAG_RATE)]

GRPO_STEPS, DRILL_STEPS, KILL_AFTER = 3, 4, 2
# 2 completions a process, 4 a group: each step is one prompt whose group is split over the two processes
GRPO = ["scripts/grpo.py", "--config", "recipes/tiny/grpo.yaml", "--per_device_train_batch_size", "2"]
GRPO += ["--max_completion_length", "48", "--max_path_tokens", "12", "--max_summary_tokens", "6"]
GRPO += ["--max_train_samples", "8", "--seed", "0"]
TRACKED = ("sft-one", "sft-ddp", "ddp-isolated")  # the launches that also log to trackio, behind the network guard


def tracking(name: str) -> tuple:
    """The flags of a launch that logs to trackio as run `name` of project `multiprocess`."""
    return ("--report_to", "trackio", "--project", "multiprocess", "--run_name", name) if name in TRACKED else ()


def command(setup: str, port: int, script: list, *flags: str) -> list:
    return [*LAUNCH, *SETUPS[setup], "--main_process_port", str(port), *script, *flags]


def drill_ready(out: Path) -> bool:
    """Checkpoint 2 whole for both processes: the trainer state (the main process writes it last) and each
    process's RNG states (each writes its own, with no barrier before the trainer state)."""
    checkpoint = out / f"checkpoint-{KILL_AFTER}"
    if not complete(checkpoint):
        return False
    for name in ("rng_state_{}.pth", "engine_rng_state_{}.pth"):
        for rank in (0, 1):
            try:
                torch.load(checkpoint / name.format(rank), weights_only=False)
            except Exception:  # not there yet, or half written
                return False
    return True


@pytest.fixture(scope="module")
def runs(bare_tiny_dir, tag_prone_dir, tmp_path_factory, free_port):
    """Every launch of the module, three or four at a time; each run's output folder, log and exit code by name."""
    base = tmp_path_factory.mktemp("multiprocess")
    sft = lambda setup, batch: command(  # noqa: E731
        setup, free_port(), SFT, "--model_name_or_path", str(bare_tiny_dir), "--output_dir", str(base / f"sft-{setup}"),
        "--per_device_train_batch_size", str(batch), *tracking(f"sft-{setup}"),
    )  # fmt: skip
    grpo = lambda setup, name, steps, *flags: command(  # noqa: E731
        setup, free_port(), GRPO, "--model_name_or_path", str(tag_prone_dir), "--output_dir", str(base / name),
        "--max_steps", str(steps), *tracking(name), *flags,
    )  # fmt: skip
    drill = ("--attention", "tree", "--save_strategy", "steps", "--save_steps", "1")
    done = {}

    def finish(name: str, launch: Launches, out: str | None = None) -> None:
        done[name] = dict(out=base / (out or name), code=launch.finish(), log=launch.text())

    with ExitStack() as stack:
        start = lambda name, cmd: stack.enter_context(  # noqa: E731
            Launches(cmd, base / f"{name}.log", tracked_env(base / "trackio", base / f"{name}.network"))
            if name in TRACKED else Launches(cmd, base / f"{name}.log")
        )  # fmt: skip
        # 1: the unbroken and the killed drill runs (ZeRO-3, tree), SFT on one process with batch 2b
        unbroken = start("zero3-tree", grpo("zero3", "zero3-tree", DRILL_STEPS, *drill))
        victim = start("killed", grpo("zero3", "killed", DRILL_STEPS, *drill))
        one = start("sft-one", sft("one", 2 * SFT_BATCH))
        victim.kill_when(lambda: drill_ready(base / "killed"), f"checkpoint-{KILL_AFTER} whole for both processes")
        finish("zero3-tree", unbroken)
        finish("sft-one", one)
        # what the killed run left, tens of seconds after the kill: nothing of it may have run on
        left = sorted(int(p.name.split("-")[1]) for p in (base / "killed").glob("checkpoint-*"))
        killed = dict(left=left, finished=(base / "killed" / "model.safetensors").exists())
        # 2: the drill resumed, SFT on two processes with batch b
        resumed = start("resumed", grpo("zero3", "killed", DRILL_STEPS, *drill, "--resume_from_checkpoint", "true"))
        ddp_sft, zero3_sft = start("sft-ddp", sft("ddp", SFT_BATCH)), start("sft-zero3", sft("zero3", SFT_BATCH))
        zero2_sft = start("sft-zero2", sft("zero2", SFT_BATCH))
        finish("resumed", resumed, "killed")
        finish("sft-ddp", ddp_sft)
        finish("sft-zero3", zero3_sft)
        finish("sft-zero2", zero2_sft)
        # 3: GRPO isolated and tree under DDP, isolated under ZeRO-3 (tree under ZeRO-3 is the drill's unbroken run)
        launches = {
            "ddp-isolated": start("ddp-isolated", grpo("ddp", "ddp-isolated", GRPO_STEPS)),
            "ddp-tree": start("ddp-tree", grpo("ddp", "ddp-tree", GRPO_STEPS, "--attention", "tree")),
            "zero3-isolated": start("zero3-isolated", grpo("zero3", "zero3-isolated", GRPO_STEPS)),
        }
        for name, launch in launches.items():
            finish(name, launch)
    done["killed"] = killed
    for name in TRACKED:
        done[name]["refused"] = refused(base / f"{name}.network")
    done["trackio"] = read_store(base / "trackio", "multiprocess")
    return done


def succeeded(run: dict) -> Path:
    assert run["code"] == 0, run["log"][-3000:]
    return run["out"]


def finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


# --------------------------------------------------------------------------- SFT


@pytest.mark.slow
@pytest.mark.parametrize("setup", ["ddp", "zero3", "zero2"])
def test_sft_on_two_processes_with_batch_b_matches_one_process_with_batch_2b(runs, bare_tiny_dir, setup):
    one, two = succeeded(runs["sft-one"]), succeeded(runs[f"sft-{setup}"])
    assert GLOBAL_BATCH_4 in runs[f"sft-{setup}"]["log"] and GLOBAL_BATCH_4 in runs["sft-one"]["log"]
    logs = [step_logs(out) for out in (one, two)]
    assert [e["step"] for e in logs[0]] == [e["step"] for e in logs[1]] == list(range(1, SFT_STEPS + 1))
    for alone, shared in zip(*logs):
        assert finite(alone["loss"], alone["grad_norm"])
        assert shared["num_tokens"] == alone["num_tokens"]  # the same traces in each step
        assert shared["learning_rate"] == alone["learning_rate"]
        assert shared["tag_learning_rate"] == alone["tag_learning_rate"] == TAG_RATE * alone["learning_rate"]
        for key in ("loss", "mean_token_accuracy", "entropy"):
            assert shared[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-6), (alone["step"], key)
        # sums of squares over sharded (ZeRO-3) or reduced gradients: seen 2e-6 apart
        assert shared["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-4), alone["step"]
    weights = [load_file(out / "model.safetensors") for out in (one, two)]
    extra = weights[1].keys() - weights[0].keys()  # ZeRO-2 saves the tied head under its own name as well
    assert extra <= ({"lm_head.weight"} if setup == "zero2" else set())
    for name in extra:
        assert torch.equal(weights[1][name], weights[1]["model.embed_tokens.weight"]), name
    assert weights[0].keys() <= weights[1].keys()  # ZeRO-3 gathered the whole model into the saved file
    for name, tensor in weights[0].items():
        assert weights[1][name].shape == tensor.shape, name
        torch.testing.assert_close(weights[1][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    start = load_file(Path(bare_tiny_dir) / "model.safetensors")
    assert any(not torch.equal(weights[0][k], start[k]) for k in start)  # the runs trained
    # the tags were added by the run (under ZeRO-3: into the partitioned embedding), each row from its spelling's,
    # and those rows moved about TAG_RATE times as far as the others (AdamW: about the rate a step; a tied head)
    assert json.loads((two / "config.json").read_text())["parallel_r1_tag_init"] == "spelling"
    bare, embedding = AutoTokenizer.from_pretrained(bare_tiny_dir), "model.embed_tokens.weight"
    ids = [tag_vocab(AutoTokenizer.from_pretrained(two)).ids[tag] for tag in TAGS]
    tag_start = torch.stack([start[embedding][bare.encode(tag, add_special_tokens=False)].mean(0) for tag in TAGS])
    tag_moved = (weights[1][embedding][ids] - tag_start).abs().median()
    row_moved = (weights[1][embedding][: len(bare)] - start[embedding][: len(bare)]).abs().median()
    assert TAG_RATE / 2 < tag_moved / row_moved < TAG_RATE * 2


# --------------------------------------------------------------------------- GRPO


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp-isolated", "ddp-tree", "zero3-isolated", "zero3-tree"])
def test_grpo_with_fork_join_rollouts_trains_on_two_processes(runs, tag_prone_dir, name):
    out = succeeded(runs[name])
    assert GLOBAL_BATCH_4 in runs[name]["log"]
    steps = GRPO_STEPS if name != "zero3-tree" else DRILL_STEPS
    logs = step_logs(out)
    assert [e["step"] for e in logs] == list(range(1, steps + 1))
    for entry in logs:
        assert finite(entry["loss"], entry["reward"], entry["grad_norm"], entry["parallel/ratio"]), entry
    assert max(e["parallel/blocks_per_completion"] for e in logs) > 0  # the engine forked
    if name.endswith("tree"):
        assert max(e["parallel/tree_extra_tokens"] for e in logs) > 0  # and the tree forward copied paths
    assert max(e["grad_norm"] for e in logs) > 0
    halves = []
    for step in range(1, steps + 1):  # one group a step, its four completions gathered from both processes
        group = pd.read_parquet(out / "completions" / f"completions_{step:05d}.parquet")
        texts = [c[0]["content"] for c in group["completion"]]
        assert len(texts) == 4 and group["prompt"].map(str).nunique() == 1
        halves.append((texts[:2], texts[2:]))  # process 0's, process 1's
    assert any(first != second for first, second in halves)  # each process draws from its own stream
    saved, start = load_file(out / "model.safetensors"), load_file(Path(tag_prone_dir) / "model.safetensors")
    assert saved.keys() == start.keys() and all(saved[k].shape == start[k].shape for k in start)
    assert any(not torch.equal(saved[k], start[k]) for k in start)  # the weights moved
    saved_tags, given_tags = (tag_vocab(AutoTokenizer.from_pretrained(d)).ids for d in (out, tag_prone_dir))
    assert saved_tags == given_tags


@pytest.mark.slow
@pytest.mark.parametrize("name", TRACKED)
def test_launches_with_report_to_trackio_log_every_metric_offline(runs, name):
    """SFT on one process and two, GRPO on two: every number the trainer logged (loss, reward, KL, entropy, the
    tags' learning rate, GRPO's `parallel/` shape and critical path, the sampler-trainer gap) is a scalar of the
    run's trackio store, step by step; the run's config holds its settings; nothing left the machine."""
    out, run = succeeded(runs[name]), runs["trackio"][name]
    history = step_logs(out)
    assert not_in_store(run, history) == []
    expected = {"train/loss", "train/learning_rate", "train/entropy"}
    if name.startswith("sft"):
        expected |= {"train/tag_learning_rate"}
    else:
        expected |= {"train/reward", "train/parallel/ratio", "train/parallel/paths_per_block",
                     "train/parallel/tokens_critical", "train/parallel/critical_over_total",
                     "train/sampling/sampling_logp_difference/mean"}  # fmt: skip
    assert expected <= metric_names(run)
    assert run["config"]["output_dir"] == str(out) and run["config"]["attention"] in ("isolated", "tree")
    if not name.startswith("sft"):
        assert run["config"]["rollout_mode"] == "fork" and run["config"]["max_path_tokens"] == 12
    assert runs[name]["refused"] == []


@pytest.mark.slow
def test_zero3_grpo_killed_after_a_checkpoint_resumes_to_the_unbroken_run(runs):
    unbroken, resumed = succeeded(runs["zero3-tree"]), succeeded(runs["resumed"])
    killed = runs["killed"]
    # killed in step 3 (10 ms after checkpoint 2; a step takes seconds), every process of it: no later checkpoint
    # and no final model appeared in the tens of seconds before the resume
    assert killed["left"] == list(range(1, KILL_AFTER + 1)) and not killed["finished"], killed
    assert f"Resuming from {resumed / f'checkpoint-{KILL_AFTER}'}" in runs["resumed"]["log"]
    assert f"global step {KILL_AFTER}" in runs["resumed"]["log"]  # transformers skipped the steps done
    logs = [step_logs(out) for out in (unbroken, resumed)]
    assert [e["step"] for e in logs[1]] == list(range(1, DRILL_STEPS + 1))  # each step logged once
    rewards = [{e["step"]: e["reward"] for e in log} for log in logs]
    assert rewards[0] == rewards[1]  # steps 1-2 from the checkpoint's log, 3-4 sampled anew as unbroken
    losses = [{e["step"]: e["loss"] for e in log if e["step"] > KILL_AFTER} for log in logs]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert not weights_differ(unbroken, resumed)
    for step in range(KILL_AFTER + 1, DRILL_STEPS + 1):  # the checkpoints written after the resume
        assert not weights_differ(unbroken / f"checkpoint-{step}", resumed / f"checkpoint-{step}")


# --------------------------------------------------------------------------- ds3_gather_for_generation


def zero3_args(tmp_path, **overrides) -> ParallelGRPOConfig:
    ds_config = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}
    return tiny_grpo_config(tmp_path, **{"deepspeed": ds_config, "ds3_gather_for_generation": False, **overrides})


@pytest.fixture
def zero3_config():
    """ZeRO-3 configs in this process; the global DeepSpeed config they register is dropped afterwards."""
    from transformers.integrations import unset_hf_deepspeed_config

    yield zero3_args
    unset_hf_deepspeed_config()


def test_zero3_without_the_gather_refuses_the_engine_on_transformers(tmp_path, tag_prone_dir, zero3_config):
    args = zero3_config(tmp_path)
    with pytest.raises(ValueError, match=r"^ds3_gather_for_generation=false under DeepSpeed ZeRO-3") as refused:
        ParallelGRPOTrainer(model=str(tag_prone_dir), reward_funcs=[], args=args)  # before anything is built
    assert "\n" not in str(refused.value)  # one line: the scripts print it as `error: ...` and exit 2
    for mode, attention in (("fork", "isolated"), ("fork", "tree"), ("sequential", "causal")):
        with pytest.raises(ValueError, match="set ds3_gather_for_generation true"):
            check_zero3_generation(zero3_config(tmp_path, rollout_mode=mode, attention=attention))
    # in step by construction: TRL's own generation (synced_gpus), vLLM (no collective), the gather on (with the
    # start-of-forward hook taken off: the next test)
    check_zero3_generation(zero3_config(tmp_path, rollout_mode="plain", attention="causal"))
    check_zero3_generation(zero3_config(tmp_path, use_vllm=True))
    check_zero3_generation(zero3_config(tmp_path, ds3_gather_for_generation=True))
    check_zero3_generation(tiny_grpo_config(tmp_path, ds3_gather_for_generation=False))  # no DeepSpeed


def test_generation_runs_without_zero3s_collective_start_of_forward_hook():
    """ZeRO-3 keeps a hook on the top module whose `reset_step` is a collective until its trace is complete: two
    processes whose engines make different numbers of forwards (one of them a single forward, its completions all
    ended at their first token) waited on each other forever. The hook is off while the engine samples and back
    first in line after; DeepSpeed's object is laid out as `engine.optimizer.parameter_offload.fwd_pre_hook`."""
    import inspect
    from types import SimpleNamespace

    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    # where the installed DeepSpeed keeps the hook (an upgrade that moves it fails here, by name)
    assert "self.parameter_offload = " in inspect.getsource(DeepSpeedZeroOptimizer_Stage3)
    hooks = inspect.getsource(DeepSpeedZeRoOffload.setup_zero_stage3_hooks)
    assert "self.fwd_pre_hook = self.module.register_forward_pre_hook(_start_of_forward_hook)" in hooks

    calls = []
    module = torch.nn.Linear(2, 2)
    module.register_forward_pre_hook(lambda m, args: calls.append("module"))  # a ZeRO-3 module hook (TRL's to remove)
    offload = SimpleNamespace(module=module)
    offload.fwd_pre_hook = module.register_forward_pre_hook(lambda m, args: calls.append("reset_step"), prepend=True)
    engine = SimpleNamespace(optimizer=SimpleNamespace(parameter_offload=offload))
    with _without_zero3_step_hook(engine):
        module(torch.zeros(2))
    assert calls == ["module"]
    module(torch.zeros(2))
    assert calls == ["module", "reset_step", "module"]  # back, and before the module's own hooks
    with _without_zero3_step_hook(SimpleNamespace(optimizer=None)), _without_zero3_step_hook(module):
        module(torch.zeros(2))  # DDP, one process, or before DeepSpeed set its hooks up: nothing to take off
    assert calls[-2:] == ["reset_step", "module"]
