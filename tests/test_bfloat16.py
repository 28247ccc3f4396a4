"""bfloat16, as the GPU recipes run, on the CPU: the sampler and the training forward agree up to bfloat16's rounding,
and one SFT and one GRPO step train, the tag rows at their own rate, with bfloat16 weights.

The tolerance. In float32 the trainer recomputes every sampled log-prob to 3e-6 (tests/test_rollout.py). In
bfloat16 both sides round every activation to 8 significant bits, and they round differently: the sampler runs one
token at a time over its cache, the trainer one forward over the whole sequence. A log-prob is a logit minus the
log of a sum of exponentials, so the gap it carries is about the rounding of the logits: here every gap is within
one bfloat16 rounding step of the largest logit (0.0625 at the tiny model's 11.6), and the mean is more than 20
times below what a wrong structure gives (the paths read causally instead of isolated, or the reverse), the kind
of mismatch the exactness tests are there to catch. docs/rollout.md, "bfloat16", says the same for users.
"""

import pytest
import torch
from rollout_helpers import engine, prompts, trainer_logprobs
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.configs import ParallelSFTConfig
from parallel_r1.data import SFTDataArguments, load_sft_traces
from parallel_r1.tags.tokens import tag_ids, tag_vocab
from parallel_r1.testing.tiny_grpo import arithmetic_dataset, length_reward, tiny_grpo_config
from parallel_r1.trainers import ParallelGRPOTrainer, ParallelSFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")
EXACT_PAIRS = [("isolated", "fork"), ("causal", "sequential")]
K = 10.0


def rounding_step(value: float) -> float:
    """bfloat16's distance from `value` to the next number up: one rounding step there."""
    rounded = torch.tensor(value, dtype=torch.bfloat16)
    return (torch.nextafter(rounded, torch.tensor(float("inf"), dtype=torch.bfloat16)) - rounded).item()


@pytest.fixture(scope="module")
def bf16_tag_prone(tag_prone_dir):
    """(directory, the tag-prone model in bfloat16, tokenizer, TagVocab), as `tag_prone` in float32."""
    tokenizer = AutoTokenizer.from_pretrained(tag_prone_dir)
    model = AutoModelForCausalLM.from_pretrained(tag_prone_dir, dtype=torch.bfloat16).eval()
    return tag_prone_dir, model, tokenizer, tag_vocab(tokenizer)


@pytest.mark.parametrize("attention, mode", EXACT_PAIRS)
def test_the_trainer_recomputes_what_was_sampled_within_a_rounding_step_of_the_logits(bf16_tag_prone, attention, mode):
    _, model, tokenizer, _ = bf16_tag_prone
    rollouts = engine(bf16_tag_prone, attention=attention, rollout_mode=mode).generate(prompts(tokenizer))
    assert sum(r.blocks for r in rollouts) >= 3
    other = "causal" if attention == "isolated" else "isolated"
    gaps, wrong = [], []
    for rollout in rollouts:
        sampled, logprobs = torch.tensor(rollout.env_mask).bool(), torch.tensor(rollout.logprobs)
        recomputed = trainer_logprobs(bf16_tag_prone, rollout, attention).float()
        misread = trainer_logprobs(bf16_tag_prone, rollout, other).float()
        gaps.append((recomputed - logprobs)[sampled].abs())
        wrong.append((misread - logprobs)[sampled].abs())
    gaps, wrong = torch.cat(gaps), torch.cat(wrong)
    with torch.no_grad():
        largest = max(model(torch.tensor([ids])).logits.abs().max().item() for ids in prompts(tokenizer))
    assert gaps.max().item() <= rounding_step(largest), (gaps.max().item(), largest)
    assert 20 * gaps.mean() < wrong.mean(), (gaps.mean().item(), wrong.mean().item())


def test_one_grpo_step_trains_in_bfloat16_with_the_tag_rows_at_their_rate(tmp_path, tag_prone_dir):
    """bfloat16 weights and autocast, fork-join rollouts on the transformers backend: the logged sampler/trainer gap
    stays within the rounding of the logits, and the step trains. The head's rows of the tags the model samples
    (<Parallel>, </Path>, </Summary>: the others are banned wherever it samples, so they get no gradient) move by
    K times the rate: AdamW's first step moves each value by the rate. Their values lie between 0.25 and 1, where a
    bfloat16 step is 2e-3 or 4e-3: the optimizer's own step of 4e-4 rounds to nothing, and before the rows kept a
    float32 copy, k times nothing stayed nothing; K times it is one or two bfloat16 steps."""
    lr = 4e-4
    args = tiny_grpo_config(tmp_path, bf16=True, max_steps=1, tag_lr_multiplier=K, learning_rate=lr)
    model = AutoModelForCausalLM.from_pretrained(tag_prone_dir, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(tag_prone_dir)
    sampled = [tag_ids(tokenizer)[tag] for tag in ("<Parallel>", "</Path>", "</Summary>")]
    start = model.get_output_embeddings().weight.detach()[sampled].float()
    assert 0.25 <= start.abs().median() < 1
    trainer = ParallelGRPOTrainer(
        model=model, reward_funcs=[length_reward], args=args, processing_class=tokenizer,
        train_dataset=arithmetic_dataset(),
    )  # fmt: skip
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert torch.isfinite(torch.tensor([entry["loss"], entry["grad_norm"]])).all() and entry["grad_norm"] > 0
    assert entry["sampling/sampling_logp_difference/max"] <= rounding_step(16.0)  # logits stay under 16 here
    moved = (trainer.model.get_output_embeddings().weight.detach()[sampled].float() - start).abs()
    assert 0.5 < (moved / (K * lr)).median() < 2  # the copy's move, rounded to the nearest bfloat16


def test_one_sft_step_in_bfloat16_has_the_float32_loss_within_its_rounding(tmp_path, tiny_dir):
    """The isolated SFT forward in bfloat16 weights and autocast gives the float32 loss of the same batch to 1%
    (bfloat16's 8 significant bits, summed over a few hundred tokens), and its step trains."""
    traces = load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample")).select(range(2))
    losses = {}
    for dtype in (torch.float32, torch.bfloat16):
        args = ParallelSFTConfig(
            output_dir=str(tmp_path / str(dtype)), per_device_train_batch_size=2, max_length=480, max_steps=1,
            learning_rate=1e-3, bf16=dtype == torch.bfloat16, use_cpu=True, report_to="none", save_strategy="no",
            logging_steps=1, seed=0, dataset_num_proc=None, attention="isolated", tag_lr_multiplier=K,
        )  # fmt: skip
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=dtype, attn_implementation="sdpa")
        trainer = ParallelSFTTrainer(
            model, args, train_dataset=traces, processing_class=AutoTokenizer.from_pretrained(tiny_dir)
        )
        trainer.train()
        (entry,) = [e for e in trainer.state.log_history if "loss" in e]
        assert entry["grad_norm"] > 0
        losses[dtype] = entry["loss"]
    assert losses[torch.bfloat16] == pytest.approx(losses[torch.float32], rel=1e-2)
