"""The tag rows' own learning rate (`tag_lr_multiplier`): the step of a parameter group of their own at k times the
rate, for the tag rows only, with a tied head, an untied one and LoRA, in SFT and GRPO; the model stays ordinary."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.integrations import unset_hf_deepspeed_config
from trl import ModelConfig, get_peft_config

from parallel_r1.configs import ParallelSFTConfig
from parallel_r1.data import SFTDataArguments, load_sft_traces
from parallel_r1.tags.tokens import tag_ids
from parallel_r1.testing.tiny import build_model, build_tokenizer
from parallel_r1.testing.tiny_grpo import tiny_grpo_config, tiny_grpo_trainer
from parallel_r1.trainers import ParallelSFTTrainer
from parallel_r1.trainers.tag_rate import TagRate

pytestmark = pytest.mark.usefixtures("one_thread")

K = 10.0
ROWS = [2, 5]


def test_the_hooks_step_the_rows_as_a_group_of_their_own_at_k_times_the_rate():
    """AdamW with weight decay and a schedule, five steps: the hooked rows of one tensor end where a group of their
    own at K times the rate takes them, the other rows where the run's group does."""
    torch.manual_seed(0)
    start = torch.randn(8, 3)
    others = [r for r in range(8) if r not in ROWS]
    hooked = torch.nn.Parameter(start.clone())
    rows, rest = torch.nn.Parameter(start[ROWS].clone()), torch.nn.Parameter(start[others].clone())
    settings = dict(lr=0.01, weight_decay=0.1, betas=(0.9, 0.95))
    ours = torch.optim.AdamW([hooked], **settings)
    TagRate(ours, [(hooked, ROWS)], K)
    reference = torch.optim.AdamW([{"params": [rest]}, {"params": [rows], "lr": K * settings["lr"]}], **settings)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: 1 / (step + 1)) for o in (ours, reference)]
    for _ in range(5):
        grad = torch.randn(8, 3)
        hooked.grad, rows.grad, rest.grad = grad.clone(), grad[ROWS].clone(), grad[others].clone()
        for optimizer, schedule in zip((ours, reference), schedules):
            optimizer.step()
            schedule.step()
    torch.testing.assert_close(hooked.detach()[ROWS], rows.detach())
    torch.testing.assert_close(hooked.detach()[others], rest.detach())
    assert not torch.allclose(hooked.detach()[ROWS], start[ROWS])


def bf16_spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance from each value (rounded to `dtype`) to the next one up in `dtype`: one rounding step."""
    rounded = values.to(dtype)
    return (torch.nextafter(rounded, torch.full_like(rounded, torch.inf)) - rounded).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_low_precision_the_rows_move_as_a_float32_group_of_their_own_would(dtype):
    """Weights in bfloat16 (or float16) stepped by a torch optimizer, with no float32 copy (the SmolLM2 recipes' one
    GPU: --bf16 true --dtype bfloat16). An embedding's value near 0.03 has a bfloat16 step of 2.4e-4: a step of 1e-5
    rounds to nothing, so scaling the change after the step scaled zero. The rows keep a float32 copy of their own:
    after eight steps at 1e-5 and K=10 (decoupled weight decay and a schedule on), they sit within one rounding of
    where float32 rows in a group of their own at K times the rate end (the same gradients), and the other rows are
    stepped as without the hooks, bit for bit."""
    torch.manual_seed(0)
    start = (0.03 + 0.002 * torch.randn(8, 3)).to(dtype)
    others = [r for r in range(8) if r not in ROWS]
    hooked, plain = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    rows = torch.nn.Parameter(start[ROWS].float())  # the reference: float32 rows from the same values
    settings = dict(lr=1e-5, weight_decay=0.1, betas=(0.9, 0.95))
    ours, unhooked = torch.optim.AdamW([hooked], **settings), torch.optim.AdamW([plain], **settings)
    TagRate(ours, [(hooked, ROWS)], K)
    reference = torch.optim.AdamW([rows], **{**settings, "lr": K * settings["lr"]})
    optimizers = (ours, unhooked, reference)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: 1 / (1 + 0.1 * step)) for o in optimizers]
    for _ in range(8):
        grad = (2.0 + torch.randn(8, 3)).to(dtype)  # mostly one sign: the rows travel
        hooked.grad, plain.grad, rows.grad = grad.clone(), grad.clone(), grad[ROWS].float()
        for optimizer, schedule in zip(optimizers, schedules):
            optimizer.step()
            schedule.step()
    moved = (rows.detach() - start[ROWS].float()).abs()
    assert moved.min() > 2 * bf16_spacing(start[ROWS].float(), dtype).max()  # far enough for rounding to show
    step = bf16_spacing(rows.detach(), dtype)
    assert ((hooked.detach()[ROWS].float() - rows.detach()).abs() <= step).all()
    assert torch.equal(hooked.detach()[others], plain.detach()[others])


def test_in_low_precision_coupled_weight_decay_is_refused():
    """Adam's (or SGD's) weight decay adds to the gradient, through the rows the float32 copy stands for: refused."""
    weight = torch.nn.Parameter(torch.zeros(8, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="decoupled weight decay"):
        TagRate(torch.optim.Adam([weight], weight_decay=0.1), [(weight, ROWS)], K)
    TagRate(torch.optim.Adam([weight]), [(weight, ROWS)], K)  # no decay: nothing passes through the rows


def test_an_optimizer_whose_step_is_not_proportional_to_the_rate_is_refused():
    weight = torch.nn.Parameter(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="proportional to the learning rate"):
        TagRate(torch.optim.Adagrad([weight]), [(weight, ROWS)], K)
    with pytest.raises(ValueError, match="no trainable tensor holds the tag rows"):
        TagRate(torch.optim.AdamW([weight]), [], K)


def test_a_multiplier_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="tag_lr_multiplier must be positive"):
        ParallelSFTConfig(output_dir=str(tmp_path), use_cpu=True, tag_lr_multiplier=0)


# --------------------------------------------------------------------------- SFT and GRPO


@pytest.fixture(scope="module")
def traces():
    return load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample")).select(range(1))


def tiny_base(folder, tied: bool):
    tokenizer = build_tokenizer()
    build_model(tokenizer, tie_word_embeddings=tied).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def one_step(trainer) -> dict:
    """Train `trainer` one step; each trainable tensor's change."""
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    return {name: p.detach() - before[name] for name, p in trainer.model.named_parameters() if p.requires_grad}


def sft_trainer(folder, out, traces, multiplier: float, peft: bool) -> ParallelSFTTrainer:
    """One step at a constant rate, weight decay on; LoRA on q and v (the trainer adds the tag rows to it)."""
    torch.manual_seed(0)  # LoRA's random start, the same in every run
    args = ParallelSFTConfig(output_dir=str(out), per_device_train_batch_size=1, max_length=480, learning_rate=3e-3,
                             lr_scheduler_type="constant", weight_decay=0.1, max_steps=1, logging_steps=1,
                             use_cpu=True, bf16=False, report_to="none", save_strategy="no", dataset_num_proc=None,
                             seed=0, tag_lr_multiplier=multiplier)  # fmt: skip
    lora = ModelConfig(
        use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules=["q_proj", "v_proj"]
    )
    return ParallelSFTTrainer(
        AutoModelForCausalLM.from_pretrained(folder, dtype="float32"),
        args,
        train_dataset=traces,
        processing_class=AutoTokenizer.from_pretrained(folder),
        peft_config=get_peft_config(lora) if peft else None,
    )


def tag_rows_of(name: str, ids: list, tied: bool, peft: bool) -> list | None:
    """The rows of trained tensor `name` that are tag rows: the tag ids of the embedding and of an untied head; all
    rows of peft's trainable tag tokens (the trainer's indices are the tag ids alone); None for any other tensor."""
    if peft:
        return list(range(len(ids))) if "trainable_tokens_delta" in name else None
    if name == "model.embed_tokens.weight" or (name == "lm_head.weight" and not tied):
        return ids
    return None


def check_steps(steps: list, ids: list, tied: bool, peft: bool) -> None:
    """Run 2's step is K times run 1's on the tag rows and equal to it everywhere else."""
    holders = 0
    for name, step in steps[0].items():
        rows, other = tag_rows_of(name, ids, tied, peft), steps[1][name]
        if rows is not None:
            holders += 1
            torch.testing.assert_close(other[rows], K * step[rows], rtol=1e-4, atol=1e-9)
            assert step[rows].abs().max() > 0, name
            keep = torch.ones(step.shape[0], dtype=torch.bool)
            keep[rows] = False
            step, other = step[keep], other[keep]
        # 1% of a step (learning rates of 1e-3 and 3e-3): Adam divides a tiny gradient's rounding noise by the
        # gradient's own size, and the rounding differs by CPU (one of 8,192 entries 2.6e-6 apart on one machine)
        torch.testing.assert_close(other, step, rtol=1e-4, atol=1e-5)
    assert holders == (1 if tied or peft else 2)


@pytest.mark.parametrize("tied, peft", [(True, False), (False, False), (True, True)], ids=["tied", "untied", "lora"])
def test_sft_moves_only_the_tag_rows_k_times_as_far(tmp_path, traces, tied, peft):
    """The same step at 1 and at K: the tag rows move K times as far (their weight decay too), everything else the
    same; the log holds the tag rows' rate; what is saved has the base's tensors and no others."""
    folder = tiny_base(tmp_path / "base", tied)
    trainers = [sft_trainer(folder, tmp_path / f"k{k}", traces, k, peft) for k in (1.0, K)]
    steps = [one_step(trainer) for trainer in trainers]
    check_steps(steps, sorted(tag_ids(trainers[0].processing_class).values()), tied, peft)
    (entry,) = [e for e in trainers[1].state.log_history if "loss" in e]
    assert entry["tag_learning_rate"] == pytest.approx(K * entry["learning_rate"])
    keys = AutoModelForCausalLM.from_pretrained(folder).state_dict().keys()
    model = trainers[1].model.merge_and_unload() if peft else trainers[1].model
    assert model.state_dict().keys() == keys


def test_grpo_moves_only_the_tag_rows_k_times_as_far(tmp_path, tag_prone_dir):
    """The same for one GRPO step (an untied head)."""
    trainers = [
        tiny_grpo_trainer(tag_prone_dir, tiny_grpo_config(tmp_path / f"k{k}", max_steps=1, tag_lr_multiplier=k))
        for k in (1.0, K)
    ]
    steps = [one_step(trainer) for trainer in trainers]
    check_steps(steps, sorted(tag_ids(trainers[0].processing_class).values()), tied=False, peft=False)
    (entry,) = [e for e in trainers[1].state.log_history if "loss" in e]
    assert entry["tag_learning_rate"] == pytest.approx(K * entry["learning_rate"])


def test_an_optimizer_made_by_deepspeeds_config_is_refused(tmp_path, traces):
    ds_config = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1,
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}  # fmt: skip
    try:
        with pytest.raises(ValueError, match="the DeepSpeed config makes its own"):
            args = ParallelSFTConfig(output_dir=str(tmp_path), use_cpu=True, deepspeed=ds_config, tag_lr_multiplier=K)
            ParallelSFTTrainer(
                build_model(build_tokenizer()), args, train_dataset=traces, processing_class=build_tokenizer()
            )
    finally:
        unset_hf_deepspeed_config()


def test_an_optimizer_created_again_gets_the_hooks_too(tmp_path, tag_prone_dir):
    """The trainer may create its optimizer again (a `model_init` run, hyperparameter search): the new one scales
    the tag rows as the first did (the hooks once followed only the first optimizer)."""
    trainer = tiny_grpo_trainer(tag_prone_dir, tiny_grpo_config(tmp_path, max_steps=1, tag_lr_multiplier=K))
    first = trainer.create_optimizer()
    trainer.optimizer = None
    second = trainer.create_optimizer()
    assert second is not first and trainer.tag_rate.optimizer is second
    embedding = trainer.model.get_input_embeddings().weight
    tags, start = sorted(tag_ids(trainer.processing_class).values()), embedding.detach().clone()
    for param in trainer.model.parameters():
        param.grad = torch.ones_like(param)
    second.step()
    moved = (embedding.detach() - start).abs()
    others = [i for i in range(moved.shape[0]) if i not in tags]
    torch.testing.assert_close(moved[tags], K * moved[others][: len(tags)], rtol=1e-4, atol=0)


@pytest.mark.parametrize(
    "zero, bf16, refusal",
    [
        ({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}, False, "offloaded to NVMe"),
        ({"stage": 0}, True, "ZeRO stage 0 with bf16"),
        ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, False, "replaces the trainer's optimizer"),
        ({"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": True}}, False, "super_offload"),
    ],
    ids=["nvme", "stage0-bf16", "cpu-offload", "super-offload"],
)
def test_deepspeed_setups_whose_float32_copy_the_hooks_cannot_reach_are_refused(tmp_path, traces, zero, bf16, refusal):
    """NVMe offload (reading a partition would swap it in beside the one being stepped), stage 0 in mixed precision
    (its optimizer steps float32 copies of the weights that no hook sees), CPU offload with DeepSpeed's CPU Adam
    (accelerate puts it in place of the trainer's optimizer) and super_offload: refused at start."""
    ds_config = {"zero_optimization": zero, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": bf16}}
    try:
        with pytest.raises(ValueError, match=refusal):
            args = ParallelSFTConfig(
                output_dir=str(tmp_path), use_cpu=True, bf16=bf16, deepspeed=ds_config, tag_lr_multiplier=K
            )
            ParallelSFTTrainer(
                build_model(build_tokenizer()), args, train_dataset=traces, processing_class=build_tokenizer()
            )
    finally:
        unset_hf_deepspeed_config()


def test_a_step_the_hooks_did_not_see_stops_the_run(tmp_path, tag_prone_dir):
    """An optimizer that replaced the trainer's (as accelerate does with DeepSpeed's CPU Adam) would train the tag
    rows at the run's rate while the log says K times it: the first optimizer step the hooks did not see stops the
    run, naming the optimizer they are on."""
    trainer = tiny_grpo_trainer(tag_prone_dir, tiny_grpo_config(tmp_path, max_steps=1, tag_lr_multiplier=K))
    hooked = trainer.create_optimizer()
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)  # another, without the hooks
    trainer.create_optimizer = lambda model=None: trainer.optimizer
    assert trainer.tag_rate.optimizer is hooked
    with pytest.raises(RuntimeError, match="an optimizer step ran without the tag rows' hooks"):
        trainer.train()
