"""Every recipe parses into its script's dataclasses with TrlParser; the paper recipes carry the paper's numbers."""

from pathlib import Path

import pytest
import torch
import yaml
from peft import LoraConfig
from trl import ModelConfig, get_peft_config

from parallel_r1.cold_start import ColdStartConfig
from parallel_r1.configs import (
    GRPOScriptArguments,
    SFTScriptArguments,
    cold_start_parser,
    eval_parser,
    grpo_parser,
    sft_parser,
)
from parallel_r1.data import load_sft_traces
from parallel_r1.evaluation import EvaluationConfig
from parallel_r1.rewards import get_reward_funcs
from parallel_r1.trainers import ParallelGRPOConfig, ParallelSFTConfig

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
GPUS_PER_NODE = 8  # the accelerate configs launch one node of 8 GPUs

# stage -> (recipe files, parser); a new stage adds one line here
STAGES = {
    "sft": (sorted(RECIPES.glob("*/sft/*.yaml")) + [RECIPES / "tiny" / "sft.yaml"], sft_parser),
    "grpo": (sorted(RECIPES.glob("*/grpo/*.yaml")) + [RECIPES / "tiny" / "grpo.yaml"], grpo_parser),
}
CLASSES = {"sft": (SFTScriptArguments, ParallelSFTConfig), "grpo": (GRPOScriptArguments, ParallelGRPOConfig)}
ALL = [(stage, path) for stage, (paths, _) in STAGES.items() for path in paths]
PAPER_SFT = sorted((RECIPES / "Qwen3-4B-Base" / "sft").glob("*.yaml"))
PAPER_GRPO = sorted((RECIPES / "Qwen3-4B-Base" / "grpo").glob("*.yaml"))


def parse(stage, path, *cli):
    """Parse a recipe; without a GPU, `--use_cpu` lets TrainingArguments accept the GPU recipes' bf16."""
    device = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    return STAGES[stage][1]().parse_args_and_config(["--config", str(path), *device, *cli])


EVAL = sorted(RECIPES.glob("*/eval/*.yaml")) + [RECIPES / "tiny" / "eval.yaml"]
COLD_START = sorted(RECIPES.glob("*/cold_start/*.yaml")) + [RECIPES / "tiny" / "cold_start.yaml"]


def test_every_recipe_is_covered():
    yamls = set(RECIPES.rglob("*.yaml"))
    assert yamls == {path for _, path in ALL} | set(EVAL) | set(COLD_START), "a recipe no stage parses"
    assert len(PAPER_SFT) >= 3 and (RECIPES / "tiny" / "sft.yaml").exists()
    names = {p.stem for p in PAPER_GRPO}
    assert names >= {"unseen_s1", "unseen_s2", "seen_gsm8k", "seen_dapo", "baseline_dapo", "mid_training"}


@pytest.mark.parametrize("stage, path", ALL, ids=[str(p.relative_to(RECIPES)) for _, p in ALL])
def test_recipe_parses(stage, path):
    script_args, training_args, model_args = parse(stage, path)
    script_class, config_class = CLASSES[stage]
    assert isinstance(script_args, script_class)
    assert isinstance(training_args, config_class) and isinstance(model_args, ModelConfig)
    assert model_args.model_name_or_path and script_args.dataset_name
    raw = yaml.safe_load(path.read_text())
    assert training_args.attention == raw["attention"]  # every recipe names its variant


@pytest.mark.parametrize("path", PAPER_SFT, ids=[p.name for p in PAPER_SFT])
def test_paper_sft_settings(path):
    script_args, args, model_args = parse("sft", path)
    assert script_args.dataset_name == "Parallel-R1/parallel-r1-cold-start-filter"  # 5.91k rows, not the pilot's 341
    assert model_args.model_name_or_path == "Qwen/Qwen3-4B-Base"
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * GPUS_PER_NODE == 128
    assert (args.num_train_epochs, args.lr_scheduler_type.value, args.warmup_steps) == (5, "cosine", 0.1)
    assert (args.adam_beta1, args.adam_beta2, args.weight_decay, args.max_grad_norm) == (0.9, 0.95, 0.01, 1.0)
    assert (args.max_length, args.completion_only_loss, args.bf16, args.gradient_checkpointing) == (
        4096,
        True,
        True,
        True,
    )
    if not model_args.use_peft:
        assert args.learning_rate == 1e-5
    expected = "isolated" if "unseen" in path.name else "causal"
    assert args.attention == expected
    header = path.read_text().split("\n\n")[0]
    assert f"scripts/sft.py --config recipes/{path.relative_to(RECIPES)}" in header  # the launch command


def test_lora_recipe_builds_a_lora_config():
    _, _, model_args = parse("sft", RECIPES / "Qwen3-4B-Base" / "sft" / "unseen_lora.yaml")
    config = get_peft_config(model_args)
    assert isinstance(config, LoraConfig) and config.target_modules == "all-linear"


def test_tiny_recipe_runs_offline_on_cpu():
    script_args, args, model_args = parse("sft", RECIPES / "tiny" / "sft.yaml")
    assert yaml.safe_load((RECIPES / "tiny" / "sft.yaml").read_text())["use_cpu"] is True
    assert not args.bf16 and args.attention == "isolated"
    assert model_args.model_name_or_path == "outputs/tiny-qwen3" and args.output_dir == "outputs/tiny-sft"
    assert len(load_sft_traces(script_args.dataset_name, limit=3)) == 3  # shipped data, no Hub


def test_command_line_overrides_the_recipe():
    _, args, model_args = parse(
        "sft", RECIPES / "tiny" / "sft.yaml", "--learning_rate", "0.5", "--attention", "causal"
    )
    assert args.learning_rate == 0.5 and args.attention == "causal"


def test_unknown_recipe_key_fails(tmp_path):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text((RECIPES / "tiny" / "sft.yaml").read_text() + "\nlearning_rat: 0.1\n")
    with pytest.raises(ValueError, match="learning_rat"):
        parse("sft", recipe)


def test_unknown_flag_fails():
    with pytest.raises(ValueError, match="--no_such_flag"):
        parse("sft", RECIPES / "tiny" / "sft.yaml", "--no_such_flag", "1")


def test_isolated_recipe_with_padding_free_fails_at_parse(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text((RECIPES / "tiny" / "sft.yaml").read_text() + "\npadding_free: true\n")
    with pytest.raises(ValueError, match="padding_free"):
        parse("sft", recipe)


# the paper's RL settings (REFERENCE §2 step 4, §3), per recipe: (reward specs, epsilon_high, dataset)
PAPER_RL = {
    "unseen_s1": (["accuracy"], 0.2, "BytedTsinghua-SIA/DAPO-Math-17k", "isolated"),
    "unseen_s2": (
        ["alternating(accuracy, tiered, window=10, a_steps=8)"],
        0.28,
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "isolated",
    ),
    "mid_training": (
        ["switch(alternating(accuracy, tiered, window=10, a_steps=8), accuracy, at_step=200)"],
        0.28,
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "isolated",
    ),
    "seen_dapo": (["accuracy"], 0.2, "BytedTsinghua-SIA/DAPO-Math-17k", "causal"),
    "baseline_dapo": (["accuracy"], 0.2, "BytedTsinghua-SIA/DAPO-Math-17k", "causal"),
    "seen_gsm8k": (["accuracy_times_parallel", "accuracy"], 0.2, "openai/gsm8k", "causal"),
}


@pytest.mark.parametrize("path", PAPER_GRPO, ids=[p.name for p in PAPER_GRPO])
def test_paper_grpo_settings(path):
    script_args, args, model_args = parse("grpo", path)
    rewards, epsilon_high, dataset, attention = PAPER_RL[path.stem]
    assert script_args.reward_funcs == rewards and script_args.dataset_name == dataset
    assert len(get_reward_funcs(script_args.reward_funcs)) == len(rewards)  # every spec builds
    assert (args.epsilon, args.epsilon_high, args.attention) == (0.2, epsilon_high, attention)
    assert (args.learning_rate, args.beta, args.loss_type, args.temperature) == (1e-6, 0.0, "dapo", 1.0)
    assert args.lr_scheduler_type.value == "constant" and args.max_completion_length == 3000
    assert script_args.max_prompt_length == 2000 and args.use_vllm and args.bf16
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * GPUS_PER_NODE
    per_generation = args.per_device_train_batch_size * args.steps_per_generation * GPUS_PER_NODE
    if path.stem == "seen_gsm8k":  # 1,024 prompts x 5 rollouts, one optimizer step each, 35 steps
        assert (args.num_generations, per_generation, per_step, args.max_steps) == (5, 5120, 5120, 35)
    else:  # 256 prompts x 8 rollouts per generation, 2 optimizer steps per generation
        assert (args.num_generations, per_generation, per_step) == (8, 2048, 1024)
    if path.stem == "baseline_dapo":
        assert args.rollout_mode == "trl" and script_args.prompt_template == "plain"
    else:
        assert args.max_blocks == 4 and args.num_paths == 2 and script_args.prompt_template == "parallel"
    header = path.read_text().split("\n\n")[0]
    assert f"scripts/grpo.py --config recipes/{path.relative_to(RECIPES)}" in header
    assert f"scripts/slurm/grpo.slurm recipes/{path.relative_to(RECIPES)}" in header


def test_slurm_launcher_is_valid_bash_and_refuses_a_missing_recipe(tmp_path):
    import subprocess

    script = ROOT / "scripts" / "slurm" / "grpo.slurm"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    result = subprocess.run(["bash", str(script), str(tmp_path / "nope.yaml")], capture_output=True, text=True)
    assert result.returncode == 2 and "recipe not found" in result.stderr


@pytest.mark.parametrize("path", EVAL, ids=[str(p.relative_to(RECIPES)) for p in EVAL])
def test_eval_recipe_parses(path):
    config, model_args = eval_parser().parse_args_and_config(["--config", str(path)])
    assert isinstance(config, EvaluationConfig) and model_args.model_name_or_path
    assert config.benchmark_specs()


def test_paper_eval_recipe_is_the_papers_protocol():
    config, _ = eval_parser().parse_args_and_config(
        ["--config", str(RECIPES / "Qwen3-4B-Base" / "eval" / "paper.yaml")]
    )
    assert config.benchmark_specs() == [("aime24", 16), ("aime25", 16), ("amc23", 16), ("math500", 1)]  # §2 step 5
    assert config.temperature == 1.0 and config.top_p == 1.0 and config.prompt_template == "parallel"
    _, training, _ = parse("grpo", RECIPES / "Qwen3-4B-Base" / "grpo" / "unseen_s2.yaml")
    rollout = ("attention", "rollout_mode", "num_paths", "max_blocks", "max_path_tokens", "max_summary_tokens")
    assert [getattr(config, key) for key in rollout] == [getattr(training, key) for key in rollout]  # as in training
    assert config.max_completion_tokens == training.max_completion_length == 3000


@pytest.mark.parametrize("path", COLD_START, ids=[str(p.relative_to(RECIPES)) for p in COLD_START])
def test_cold_start_recipe_parses(path):
    (config,) = cold_start_parser().parse_args_and_config(["--config", str(path)])
    assert isinstance(config, ColdStartConfig) and config.model_name_or_path and config.output_dir
    header = path.read_text().split("\n\n")[0]
    assert f"scripts/generate_cold_start.py --config recipes/{path.relative_to(RECIPES)}" in header


def test_the_papers_teacher_recipe_is_the_papers_pipeline():
    path = RECIPES / "DeepSeek-R1-0528-Qwen3-8B" / "cold_start" / "gsm8k.yaml"
    (config,) = cold_start_parser().parse_args_and_config(["--config", str(path)])
    assert config.model_name_or_path == "deepseek-ai/DeepSeek-R1-0528-Qwen3-8B"  # REFERENCE §2 step 2
    assert (config.dataset_name, config.dataset_split, config.num_samples) == ("gsm8k", "train", 1)
    assert (config.student_tokenizer, config.max_length, config.prompt_template) == (
        "Qwen/Qwen3-4B-Base", 4096, "parallel")  # fmt: skip
    assert config.require_well_formed and config.require_final_answer and config.drop_reasoning
    assert "vllm serve deepseek-ai/DeepSeek-R1-0528-Qwen3-8B --data-parallel-size 8" in path.read_text()
