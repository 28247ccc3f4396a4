"""Another base family by YAML alone: a Llama-style base with no spare embedding rows, no chat template and no
padding token (recipes/Llama-3.2-3B/), on a tiny stand-in of that shape: the "-Special" base is made by a resize and
the plain chat template, then the recipes' SFT and GRPO each train a step through their scripts."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import processors
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from parallel_r1.configs import grpo_parser, sft_parser
from parallel_r1.data import PLAIN_CHAT_TEMPLATE, prompt_ids
from parallel_r1.tags.tokens import TAGS, tag_ids
from parallel_r1.testing.tiny import EOS, IM_START, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "Llama-3.2-3B"
BOS = IM_START  # the stand-in's begin-of-text token


@pytest.fixture(scope="module")
def bare_llama(tmp_path_factory):
    """A tiny Llama: tokenizer without tags, chat template or padding token; embedding rows = tokenizer entries."""
    folder = tmp_path_factory.mktemp("llama") / "base"
    tokenizer = build_tokenizer(with_tags=False)
    tokenizer.chat_template = None
    tokenizer.pad_token = None
    tokenizer.bos_token = BOS  # and it writes a BOS before every text, as Llama's does
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tokenizer.convert_tokens_to_ids(BOS))]
    )
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=None)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_special(base: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "scripts/add_special_tokens.py", "--model_name_or_path", str(base),
               "--output_dir", str(out), *flags]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def special_llama(bare_llama):
    out = bare_llama.parent / "special"
    result = make_special(bare_llama, out, "--chat_template", "plain")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_the_special_base_gets_the_tags_by_a_resize_and_the_plain_template(bare_llama, special_llama):
    before = AutoTokenizer.from_pretrained(bare_llama)
    tokenizer = AutoTokenizer.from_pretrained(special_llama)
    model = AutoModelForCausalLM.from_pretrained(special_llama)
    assert model.config.model_type == "llama"
    assert model.get_input_embeddings().num_embeddings == len(before) + len(TAGS) == len(tokenizer)
    assert sorted(tag_ids(tokenizer).values()) == list(range(len(before), len(before) + len(TAGS)))
    assert tokenizer.chat_template == PLAIN_CHAT_TEMPLATE and tokenizer.pad_token == tokenizer.eos_token == EOS
    chat = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "<Parallel>A"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    assert text == f"{BOS}Q?\n\n<Parallel>A{EOS}"
    assert tokenizer.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True) == f"{BOS}Q?\n\n"
    ids = prompt_ids(tokenizer, chat[:1])  # as GRPO and evaluation tokenize a prompt: one BOS, not two
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id


def test_a_base_without_a_chat_template_is_refused_in_one_line(bare_llama, tmp_path):
    result = make_special(bare_llama, tmp_path / "out")
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "--chat_template plain" in result.stderr and "Traceback" not in result.stderr


def script(name: str):
    return runpy.run_path(str(ROOT / "scripts" / f"{name}.py"))["main"]


CPU = ["--use_cpu", "true", "--bf16", "false", "--dtype", "float32", "--gradient_checkpointing", "false",
       "--save_strategy", "no", "--report_to", "none", "--max_steps", "1"]  # fmt: skip


def test_the_llama_recipes_train_a_step_of_sft_and_of_grpo(special_llama, tmp_path, capsys):
    sft_out = tmp_path / "sft"
    args = ["--config", str(RECIPES / "sft" / "unseen.yaml"), "--model_name_or_path", str(special_llama),
            "--dataset_name", "parallel_gsm8k_sample", "--max_train_samples", "2", "--output_dir", str(sft_out),
            "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--max_length", "1200",
            "--eos_token", EOS, "--learning_rate", "1e-3", "--warmup_steps", "0", *CPU]  # fmt: skip
    script("sft")(*sft_parser().parse_args_and_config(args))
    assert "'train_loss'" in capsys.readouterr().out  # transformers' end-of-training report
    before, after = (
        AutoModelForCausalLM.from_pretrained(d).model.layers[0].mlp.up_proj.weight for d in (special_llama, sft_out)
    )
    assert not torch.equal(before, after)
    tokenizer = AutoTokenizer.from_pretrained(sft_out)
    assert tokenizer.chat_template == PLAIN_CHAT_TEMPLATE and tag_ids(tokenizer) == tag_ids(
        AutoTokenizer.from_pretrained(special_llama))  # fmt: skip

    grpo_out = tmp_path / "grpo"
    args = ["--config", str(RECIPES / "grpo" / "unseen_s2.yaml"), "--model_name_or_path", str(sft_out),
            "--dataset_name", "gsm8k", "--max_train_samples", "4", "--max_prompt_length", "512",
            "--output_dir", str(grpo_out), "--use_vllm", "false", "--num_generations", "2",
            "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--steps_per_generation", "1",
            "--max_completion_length", "48", "--max_path_tokens", "16", "--max_summary_tokens", "16", *CPU,
            "--save_strategy", "steps", "--save_steps", "1"]  # fmt: skip
    script("grpo")(*grpo_parser().parse_args_and_config(args))
    step = json.loads((grpo_out / "checkpoint-1" / "trainer_state.json").read_text())["log_history"][0]
    # The engine sampled on the Llama shape what the isolated forward recomputes (its rewards, all -1 on a random
    # model, make this one update zero: the SFT step above is the one that moves weights)
    assert step["step"] == 1 and step["sampling/sampling_logp_difference/max"] < 1e-5
    out = capsys.readouterr().out
    assert "'parallel/ratio'" in out and "'train_loss'" in out  # a GRPO step with the engine's metrics
    trained = AutoModelForCausalLM.from_pretrained(grpo_out)
    assert trained.config.model_type == "llama" and (grpo_out / "model.safetensors").exists()
