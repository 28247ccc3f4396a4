"""Stage 1 SFT: the Seen/Unseen trainer on the tiny model, its refusals, LoRA on the tag rows, and the script."""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.integrations import HfDeepSpeedConfig, unset_hf_deepspeed_config
from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

from parallel_r1.configs import ParallelSFTConfig
from parallel_r1.data import SFTDataArguments, load_sft_traces
from parallel_r1.tags.language import TAGS, Block, parse
from parallel_r1.tags.tokens import tag_ids
from parallel_r1.testing.tiny import build_model, build_tokenizer
from parallel_r1.trainers import ParallelSFTTrainer
from parallel_r1.trainers.summary_loss import IGNORE, completion_starts

ROOT = Path(__file__).resolve().parents[1]
NO_BLOCK_INDICES = ("93", "137")  # shipped traces with no <Parallel> block
# One row of ~420 prompt tokens and its first ~60 completion tokens, at a high learning rate: seconds a step on CPU.
SHORT_RUN = dict(per_device_train_batch_size=1, max_length=480, learning_rate=3e-3)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def traces():
    return load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"))


def settings(tmp_path) -> dict:
    """CPU, fp32, no saving: for a handful of steps."""
    return dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        max_length=640,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
        dataset_num_proc=None,
    )


def config(tmp_path, **overrides) -> ParallelSFTConfig:
    return ParallelSFTConfig(**{**settings(tmp_path), **overrides})


def trainer_for(model_dir, tmp_path, dataset, attention="causal", **overrides) -> ParallelSFTTrainer:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32", attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = config(tmp_path, attention=attention, **{k: v for k, v in overrides.items() if k != "peft_config"})
    return ParallelSFTTrainer(
        model, args, train_dataset=dataset, processing_class=tokenizer, peft_config=overrides.get("peft_config")
    )


def token_log_probs(trainer, batch) -> torch.Tensor:
    """Log-probability of every token of row 0 given the ones before it, through the trainer's own forward.

    Entry c - 1 scores token c.
    """
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TRL deprecates return_outputs; it is the way to the logits
        _, outputs = trainer.compute_loss(trainer.model.eval(), dict(batch), return_outputs=True)
    log_probs = outputs.logits[0, :-1].log_softmax(-1)
    return log_probs.gather(-1, batch["input_ids"][0, 1:, None])[:, 0]


def first_block(trainer, batch) -> tuple[int, Block]:
    start = int(completion_starts(batch["labels"])[0])
    ids = batch["input_ids"][0, start:][batch["attention_mask"][0, start:].bool()].tolist()
    return start, parse(ids, trainer.policy.vocab).blocks[0]


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("attention", ["causal", "isolated"])
def test_loss_decreases_on_a_repeated_batch(tiny_dir, tmp_path, traces, attention):
    trainer = trainer_for(tiny_dir, tmp_path, traces.select(range(1)), attention, **SHORT_RUN, max_steps=5)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 5
    assert losses[-1] < losses[0] - 0.3, losses


def test_completion_starts_at_the_first_label_in_the_loss(tiny_dir, tmp_path, traces):
    trainer = trainer_for(tiny_dir, tmp_path, traces.select(range(2)), "isolated")
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    starts = completion_starts(batch["labels"])
    for row in range(2):
        text = trainer.processing_class.decode(batch["input_ids"][row, starts[row] :])
        assert text.startswith(traces[row]["completion"][0]["content"][:40])
        assert (batch["labels"][row, : starts[row]] == IGNORE).all()
    labels = torch.tensor([[IGNORE, IGNORE, 5, 6], [IGNORE] * 4])
    assert completion_starts(labels).tolist() == [2, 4]  # a row with nothing in the loss: nothing is parsed


@pytest.mark.parametrize("attention", ["causal", "isolated"])
def test_only_isolated_paths_are_blind_to_their_siblings(tiny_dir, tmp_path, traces, attention):
    """Perturbing path 1 leaves path 2's loss unchanged (isolated), and changes the summary's (both variants)."""
    trainer = trainer_for(tiny_dir, tmp_path, traces.select(range(1)), attention, max_length=2048)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    start, block = first_block(trainer, batch)
    path1, path2 = block.paths[0], block.paths[1]
    body1 = torch.arange(start + path1.open_at + 1, start + path1.end - 1)
    body2 = torch.arange(start + path2.open_at + 1, start + path2.end - 1)
    summary = torch.arange(start + block.close_at + 1, start + block.end)  # scored from after </Parallel>
    perturbed = {**batch, "input_ids": batch["input_ids"].clone()}
    ordinary = [i for i in range(200, 900) if i not in trainer.policy.vocab.ids.values()]
    perturbed["input_ids"][0, body1] = torch.tensor(ordinary[: len(body1)])

    before, after_perturbation = token_log_probs(trainer, batch), token_log_probs(trainer, perturbed)
    path2_same = torch.allclose(before[body2 - 1], after_perturbation[body2 - 1], atol=1e-6)
    assert path2_same == (attention == "isolated")
    assert not torch.allclose(before[summary - 1], after_perturbation[summary - 1], atol=1e-6)


def test_isolated_is_causal_when_there_is_no_block(tiny_dir, tmp_path, traces):
    rows = traces.filter(lambda row: row["id"] in NO_BLOCK_INDICES)
    causal = trainer_for(tiny_dir, tmp_path, rows, "causal", max_length=1024)
    isolated = trainer_for(tiny_dir, tmp_path, rows, "isolated", max_length=1024)
    batch = causal.data_collator([causal.train_dataset[i] for i in range(2)])
    assert (batch["attention_mask"] == 0).any()  # rows of different lengths: padding is exercised
    with torch.no_grad():
        expected = causal.compute_loss(causal.model.eval(), dict(batch))
        got = isolated.compute_loss(isolated.model.eval(), dict(batch))
    torch.testing.assert_close(got, expected)


def test_causal_is_stock_sft(tiny_dir, tmp_path, traces):
    ours = trainer_for(tiny_dir, tmp_path, traces.select(range(2)), "causal")
    stock_args = SFTConfig(**{**settings(tmp_path), "output_dir": str(tmp_path / "stock")})
    stock = SFTTrainer(
        AutoModelForCausalLM.from_pretrained(tiny_dir, dtype="float32"),
        stock_args,
        train_dataset=traces.select(range(2)),
        processing_class=AutoTokenizer.from_pretrained(tiny_dir),
    )
    batch = ours.data_collator([ours.train_dataset[i] for i in range(2)])
    assert set(batch) == set(stock.data_collator([stock.train_dataset[i] for i in range(2)]))
    with torch.no_grad():
        assert torch.equal(
            ours.compute_loss(ours.model.eval(), dict(batch)), stock.compute_loss(stock.model.eval(), dict(batch))
        )


# --------------------------------------------------------------------------- tags and LoRA


@pytest.mark.parametrize("init", ["spelling", "mean"])
def test_missing_tags_are_added_before_tokenization(bare_tiny_dir, tmp_path, traces, init):
    before = AutoModelForCausalLM.from_pretrained(bare_tiny_dir).get_input_embeddings().weight.detach().clone()
    bare = AutoTokenizer.from_pretrained(bare_tiny_dir)
    trainer = trainer_for(bare_tiny_dir, tmp_path, traces.select(range(1)), "isolated", tag_init=init)
    ids = [tag_ids(trainer.processing_class)[tag] for tag in TAGS]
    weight = trainer.model.get_input_embeddings().weight.detach()
    if init == "spelling":
        expected = torch.stack([before[bare.encode(tag, add_special_tokens=False)].mean(0) for tag in TAGS])
    else:
        expected = before[: len(bare)].mean(0).expand(len(ids), -1)
    torch.testing.assert_close(weight[ids], expected)
    assert set(ids) <= set(trainer.train_dataset[0]["input_ids"])  # the data was tokenized with the tags


@pytest.mark.parametrize("tied", [True, False])
def test_lora_trains_the_tag_rows_and_the_adapter_reloads(tmp_path, traces, tied):
    base = tmp_path / "base"
    tokenizer = build_tokenizer()
    build_model(tokenizer, tie_word_embeddings=tied).save_pretrained(base)
    tokenizer.save_pretrained(base)
    model_args = ModelConfig(use_peft=True, lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"])
    trainer = trainer_for(
        base, tmp_path, traces.select(range(1)), peft_config=get_peft_config(model_args), **SHORT_RUN, max_steps=2
    )
    trainer.train()
    ids = sorted(tag_ids(trainer.processing_class).values())
    others = [i for i in range(len(tokenizer)) if i not in ids]
    original = AutoModelForCausalLM.from_pretrained(base)
    layers = ["get_input_embeddings"] + ([] if tied else ["get_output_embeddings"])
    for layer in layers:
        trained = getattr(trainer.model, layer)().weight.detach()  # peft's merged view
        start = getattr(original, layer)().weight.detach()
        assert not torch.allclose(trained[ids], start[ids]), layer
        torch.testing.assert_close(trained[others], start[others])

    trainer.save_model(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter")
    for layer in layers:
        torch.testing.assert_close(
            getattr(reloaded, layer)().weight[ids], getattr(trainer.model, layer)().weight[ids].detach()
        )


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "option, value",
    [("padding_free", True), ("packing", True), ("eval_packing", True), ("completion_only_loss", False)],
)
def test_isolated_refuses_what_cannot_carry_isolation(tmp_path, option, value):
    with pytest.raises(ValueError, match=option):
        config(tmp_path, attention="isolated", **{option: value})
    config(tmp_path, attention="causal", **{option: value})  # fine for the causal variant


def test_unknown_attention_is_refused(tmp_path):
    with pytest.raises(ValueError, match="attention must be one of"):
        config(tmp_path, attention="sideways")


def test_isolated_refuses_eager_attention(tiny_dir, tmp_path, traces):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager")
    with pytest.raises(ValueError, match="sdpa"):
        ParallelSFTTrainer(
            model,
            config(tmp_path, attention="isolated"),
            train_dataset=traces.select(range(1)),
            processing_class=AutoTokenizer.from_pretrained(tiny_dir),
        )


def test_isolated_refuses_language_modeling_data(tiny_dir, tmp_path, traces):
    text = traces.select(range(1)).map(lambda row: {"text": row["completion"][0]["content"]})
    with pytest.raises(ValueError, match="prompt out of the loss"):
        trainer_for(tiny_dir, tmp_path, text.select_columns(["text"]), "isolated")


def test_trainer_takes_loaded_objects(tiny_dir, tmp_path, traces):
    with pytest.raises(TypeError, match="loaded model and tokenizer"):
        ParallelSFTTrainer(
            str(tiny_dir),
            config(tmp_path),
            train_dataset=traces,
            processing_class=AutoTokenizer.from_pretrained(tiny_dir),
        )


def test_zero3_refuses_a_resize_and_names_the_way_out(tmp_path, traces):
    tokenizer = build_tokenizer(with_tags=False)
    model = build_model(tokenizer, spare_rows=0)
    ds_config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        with pytest.raises(ValueError, match="add_special_tokens.py"):
            ParallelSFTTrainer(model, config(tmp_path), train_dataset=traces, processing_class=tokenizer)
    finally:
        unset_hf_deepspeed_config()
        del ds_config
    assert len(tokenizer.encode(TAGS[0], add_special_tokens=False)) > 1  # refused before touching anything


ZERO3_PROGRAM = textwrap.dedent(
    """
    import json, sys
    import deepspeed, torch, torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations import HfDeepSpeedConfig
    from parallel_r1.tags.language import TAGS
    from parallel_r1.tags.tokens import tag_ids
    from parallel_r1.trainers.sft import ensure_parallel_tokens

    keep = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    dist.init_process_group("gloo")
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
    weight = model.get_input_embeddings().weight
    partitioned = weight.numel() == 0
    pieces = [tokenizer.encode(tag, add_special_tokens=False) for tag in TAGS]
    added = ensure_parallel_tokens(tokenizer, model)
    ids = [tag_ids(tokenizer)[tag] for tag in TAGS]
    with deepspeed.zero.GatheredParameters([weight]):
        error = max((weight[i] - weight[p].mean(0)).abs().max().item() for i, p in zip(ids, pieces))
    print(json.dumps({"partitioned": partitioned, "added": added, "error": error}))
    """
)


@pytest.mark.slow
def test_zero3_adds_tags_to_a_partitioned_model(bare_tiny_dir):
    """Real DeepSpeed ZeRO-3 partitioning on CPU (one gloo process); the first run builds a DeepSpeed op (~1.5 min)."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "WORLD_SIZE": "1"}
    env.update(LOCAL_RANK="0", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", ZERO3_PROGRAM, str(bare_tiny_dir)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["partitioned"]  # the rows really were sharded when the tags were added
    assert report["added"] == list(TAGS)
    assert report["error"] < 1e-6  # every tag row is the mean of its spelling's rows


# --------------------------------------------------------------------------- the script


def launch_sft(out, model_dir, *flags):
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu.yaml"]
    command += ["--num_cpu_threads_per_process", "1", "scripts/sft.py", "--config", "recipes/tiny/sft.yaml"]
    command += ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_length", "1200", *flags]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.slow
def test_accelerate_launch_trains_saves_with_the_tags_and_resumes(tiny_dir, tmp_path):
    out = tmp_path / "sft"
    launch_sft(out, tiny_dir, "--max_steps", "2", "--max_train_samples", "4", "--save_strategy", "steps")
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tag_ids(tokenizer) == tag_ids(AutoTokenizer.from_pretrained(tiny_dir))
    trained = AutoModelForCausalLM.from_pretrained(out)
    recorded = json.loads((out / "config.json").read_text())["parallel_r1"]  # read back by scripts/generate.py
    assert recorded["attention"] == "isolated" and recorded["prompt_template"] == "parallel"
    initial = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert not torch.equal(trained.model.layers[0].mlp.up_proj.weight, initial.model.layers[0].mlp.up_proj.weight)

    resume = ["--resume_from_checkpoint", "true", "--save_strategy", "steps"]  # the newest checkpoint of output_dir
    log = launch_sft(out, tiny_dir, "--max_steps", "3", "--max_train_samples", "4", *resume)
    assert "Resuming training from checkpoint with epoch 2 and global step 2" in log  # transformers' own report
    assert json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3


@pytest.mark.parametrize("widths", [(2, 2), (2, 4)])
def test_a_chosen_width_is_trained_from_every_path(tiny_dir, tmp_path, traces, widths):
    """With min_paths < max_paths the isolated SFT scores a block's `</Parallel>` (the model's choice to stop at two
    paths) from its probe, which reads every path: perturbing path 1 moves it. With a fixed width it is the runtime's
    token, scored in line from path 2's `</Path>`, which cannot see path 1 (the trace is written as the engine
    writes, with no whitespace after `</Path>`)."""
    low, high = widths
    row = traces[0]
    content = row["completion"][0]["content"].replace("</Path>\n", "</Path>")  # the engine's layout: no tail
    rows = Dataset.from_list([{**row, "completion": [{**row["completion"][0], "content": content}]}])
    trainer = trainer_for(tiny_dir, tmp_path, rows, "isolated", max_length=2048, min_paths=low, max_paths=high)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    start, block = first_block(trainer, batch)
    assert len(block.paths) == 2
    path1 = block.paths[0]
    body1 = torch.arange(start + path1.open_at + 1, start + path1.end - 1)
    perturbed = {**batch, "input_ids": batch["input_ids"].clone()}
    ordinary = [i for i in range(200, 900) if i not in trainer.policy.vocab.ids.values()]
    perturbed["input_ids"][0, body1] = torch.tensor(ordinary[: len(body1)])
    close = start + block.close_at
    before, after = token_log_probs(trainer, batch)[close - 1], token_log_probs(trainer, perturbed)[close - 1]
    assert (abs(before - after) > 1e-5) == (low < high)
