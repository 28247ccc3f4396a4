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
    ParallelGRPOConfig,
    ParallelSFTConfig,
    cold_start_parser,
    eval_parser,
    grpo_parser,
    sft_parser,
)
from parallel_r1.data import SFTDataArguments, load_sft_traces
from parallel_r1.evaluation import EvaluationConfig

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
GPUS_PER_NODE = 8  # the accelerate configs launch one node of 8 GPUs

# stage -> (recipe files, parser); a new stage adds one line here
STAGES = {
    "sft": (sorted(RECIPES.glob("*/sft/*.yaml")) + [RECIPES / n / "sft.yaml" for n in ("tiny", "demo")], sft_parser),
    "grpo": (
        sorted(RECIPES.glob("*/grpo/*.yaml"))
        + [RECIPES / n / "grpo.yaml" for n in ("tiny", "demo")]
        + [RECIPES / "demo" / "grpo_plain.yaml", RECIPES / "demo" / "grpo_width.yaml"],
        grpo_parser,
    ),
}
CLASSES = {"sft": (SFTDataArguments, ParallelSFTConfig), "grpo": (GRPOScriptArguments, ParallelGRPOConfig)}
ALL = [(stage, path) for stage, (paths, _) in STAGES.items() for path in paths]
PAPER_SFT = sorted((RECIPES / "Qwen3-4B-Base" / "sft").glob("*.yaml"))
PAPER_GRPO = sorted((RECIPES / "Qwen3-4B-Base" / "grpo").glob("*.yaml"))


def parse(stage, path, *cli):
    """Parse a recipe; without a GPU, `--use_cpu` lets TrainingArguments accept the GPU recipes' bf16."""
    device = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    return STAGES[stage][1]().parse_args_and_config(["--config", str(path), *device, *cli])


EVAL = sorted(RECIPES.glob("*/eval/*.yaml")) + [RECIPES / n / "eval.yaml" for n in ("tiny", "demo")]
COLD_START = sorted(RECIPES.glob("*/cold_start/*.yaml")) + [RECIPES / n / "cold_start.yaml" for n in ("tiny", "demo")]
TRL_SFT = [RECIPES / "demo" / "base.yaml"]  # for TRL's own trl.scripts.sft


def test_every_recipe_is_covered():
    yamls = set(RECIPES.rglob("*.yaml"))
    assert yamls == {path for _, path in ALL} | set(EVAL) | set(COLD_START) | set(TRL_SFT), "a recipe no stage parses"
    assert len(PAPER_SFT) >= 3 and (RECIPES / "tiny" / "sft.yaml").exists()
    names = {p.stem for p in PAPER_GRPO}
    assert names >= {
        "unseen_s1",
        "unseen_s2",
        "seen_gsm8k",
        "seen_dapo",
        "baseline_dapo",
        "mid_training_a",
        "mid_training_b",
    }


def test_the_demo_base_recipe_parses_with_trls_own_sft_script():
    from trl import ScriptArguments, SFTConfig, TrlParser

    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(["--config", str(TRL_SFT[0])])
    assert script_args.dataset_name and model_args.model_name_or_path and training_args.max_steps == 600


@pytest.mark.parametrize("stage, path", ALL, ids=[str(p.relative_to(RECIPES)) for _, p in ALL])
def test_recipe_parses(stage, path):
    script_args, training_args, model_args = parse(stage, path)
    script_class, config_class = CLASSES[stage]
    assert isinstance(script_args, script_class)
    assert isinstance(training_args, config_class) and isinstance(model_args, ModelConfig)
    assert model_args.model_name_or_path and script_args.dataset_name
    raw = yaml.safe_load(path.read_text())
    assert training_args.attention == raw["attention"]  # every recipe names its variant


GRPO_RECIPES = STAGES["grpo"][0]


@pytest.mark.parametrize("path", GRPO_RECIPES, ids=[str(p.relative_to(RECIPES)) for p in GRPO_RECIPES])
def test_no_recipe_corrects_vllm_per_sequence(path):
    """A recipe that samples with vLLM corrects per token: a sequence mode sums a completion's gaps and drops long
    answers whole, from one side (the parallel runs and their baseline must be corrected alike)."""
    _, args, _ = parse("grpo", path)
    if args.use_vllm:
        assert args.vllm_importance_sampling_correction
        assert args.vllm_importance_sampling_mode in ("token_truncate", "token_mask"), path
    assert ParallelGRPOConfig.__dataclass_fields__["vllm_importance_sampling_mode"].default == "token_truncate"


def test_lora_recipe_builds_a_lora_config():
    _, _, model_args = parse("sft", RECIPES / "Qwen3-4B-Base" / "sft" / "unseen_lora.yaml")
    config = get_peft_config(model_args)
    assert isinstance(config, LoraConfig) and config.target_modules == "all-linear"


def test_tiny_recipe_runs_offline_on_cpu():
    script_args, args, model_args = parse("sft", RECIPES / "tiny" / "sft.yaml")
    assert yaml.safe_load((RECIPES / "tiny" / "sft.yaml").read_text())["use_cpu"] is True
    assert not args.bf16 and args.attention == "isolated"
    assert model_args.model_name_or_path == "outputs/tiny-qwen3" and args.output_dir == "outputs/tiny-sft"
    assert len(load_sft_traces(script_args, limit=3)) == 3  # shipped data, no Hub


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


SLURM = ROOT / "scripts" / "slurm" / "grpo.slurm"
S2_RECIPE = "recipes/Qwen3-4B-Base/grpo/unseen_s2.yaml"


def slurm(*args, **env):
    """Run the Slurm launcher with bash (no Slurm here), this venv's python first on PATH."""
    import os
    import subprocess
    import sys

    path = f"{Path(sys.executable).parent}:{env.pop('PATH', os.environ['PATH'])}"
    environment = {**os.environ, "VENV": "none", "PATH": path, **env}
    return subprocess.run(["bash", str(SLURM), *args], cwd=ROOT, env=environment, capture_output=True, text=True)


def test_slurm_launcher_is_valid_bash_and_refuses_a_missing_recipe(tmp_path):
    import subprocess

    assert subprocess.run(["bash", "-n", str(SLURM)]).returncode == 0
    result = slurm(str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "recipe not found" in result.stderr


@pytest.mark.parametrize("nodes, accumulation, per_generation", [("a b", 32, 64), ("a b c", 16, 32)])
def test_slurm_dry_run_serves_the_overridden_model_and_keeps_the_global_batch(nodes, accumulation, per_generation):
    result = slurm(S2_RECIPE, "--model_name_or_path", "me/sft", DRY_RUN="1", NODES=nodes)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    trainers = len(nodes.split()) - 1
    assert "trl vllm-serve --model me/sft " in out and "--max_model_len 5000" in out and "--dtype bfloat16" in out
    assert f"--gradient_accumulation_steps {accumulation} --steps_per_generation {per_generation}" in out
    assert f"x {trainers * 8} GPUs = 1024 completions per optimizer step, 2048 per generation" in out
    assert f"--num_processes {trainers * 8}" in out and "--model_name_or_path me/sft" in out


def test_slurm_passes_overrides_through_bash_c_intact():
    reward = "alternating(accuracy, tiered, window=10, a_steps=4)"
    result = slurm(S2_RECIPE, "--reward_funcs", reward, "--log_completions", DRY_RUN="1", NODES="a b")
    train = result.stdout.strip().splitlines()[-1].split(' bash -c "', 1)[1][:-1]  # what srun hands to bash -c
    echo = train.replace("accelerate launch", "printf '%s\\n'", 1)
    import subprocess

    words = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, check=True).stdout.splitlines()
    assert words[words.index("--reward_funcs") + 1] == reward and words[-1] == "--log_completions"


def test_slurm_refuses_an_override_without_its_value():
    result = slurm(S2_RECIPE, "--model_name_or_path", DRY_RUN="1", NODES="a b")
    assert result.returncode == 2 and "--model_name_or_path needs a value" in result.stderr


def test_slurm_refuses_a_node_count_that_changes_the_batch():
    result = slurm(S2_RECIPE, DRY_RUN="1", NODES="a b c d")  # 24 training GPUs do not divide 32 x 8
    assert result.returncode == 2 and "not divisible by 24 training GPUs" in result.stderr


def test_slurm_wait_for_the_server_times_out_with_a_message(tmp_path):
    """srun and scontrol are stand-ins: the 'server' never answers, the wait gives up after VLLM_WAIT seconds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/bash\nexec sleep 30\n")
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\necho 127.0.0.1\n")
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    from parallel_r1.testing.vllm_server import free_port

    result = slurm(S2_RECIPE, PATH=f"{bin_dir}:{__import__('os').environ['PATH']}", SLURM_JOB_NODELIST="x",
                   VLLM_PORT=str(free_port()), VLLM_WAIT="2", VLLM_POLL="1")  # fmt: skip
    assert result.returncode == 1
    assert "did not answer /health within 2s" in result.stderr


@pytest.mark.parametrize("path", EVAL, ids=[str(p.relative_to(RECIPES)) for p in EVAL])
def test_eval_recipe_parses(path):
    config, model_args = eval_parser().parse_args_and_config(["--config", str(path)])
    assert isinstance(config, EvaluationConfig) and model_args.model_name_or_path
    assert config.benchmark_specs()


def test_paper_eval_recipe_is_the_papers_protocol():
    config, _ = eval_parser().parse_args_and_config(
        ["--config", str(RECIPES / "Qwen3-4B-Base" / "eval" / "paper.yaml")]
    )
    # the paper's benchmarks and samples (docs/paper.md, the settings)
    assert config.benchmark_specs() == [("aime24", 16), ("aime25", 16), ("amc23", 16), ("math500", 1)]
    assert config.temperature == 1.0 and config.top_p == 1.0 and config.prompt_template == "parallel"
    _, training, _ = parse("grpo", RECIPES / "Qwen3-4B-Base" / "grpo" / "unseen_s2.yaml")
    rollout = (
        "attention",
        "rollout_mode",
        "min_paths",
        "max_paths",
        "max_blocks",
        "max_path_tokens",
        "max_summary_tokens",
    )
    assert [getattr(config, key) for key in rollout] == [getattr(training, key) for key in rollout]  # as in training
    assert config.max_completion_length == training.max_completion_length == 3000


@pytest.mark.parametrize("path", COLD_START, ids=[str(p.relative_to(RECIPES)) for p in COLD_START])
def test_cold_start_recipe_parses(path):
    (config,) = cold_start_parser().parse_args_and_config(["--config", str(path)])
    assert isinstance(config, ColdStartConfig) and config.model_name_or_path and config.output_dir
    header = path.read_text().split("\n\n")[0]
    assert f"scripts/generate_cold_start.py --config recipes/{path.relative_to(RECIPES)}" in header


def test_the_papers_teacher_recipe_is_the_papers_pipeline():
    path = RECIPES / "DeepSeek-R1-0528-Qwen3-8B" / "cold_start" / "gsm8k.yaml"
    (config,) = cold_start_parser().parse_args_and_config(["--config", str(path)])
    assert config.model_name_or_path == "deepseek-ai/DeepSeek-R1-0528-Qwen3-8B"  # docs/paper.md, the cold start
    assert (config.dataset_name, config.dataset_train_split, config.num_samples) == ("gsm8k", "train", 1)
    assert (config.student_tokenizer, config.max_length, config.prompt_template) == (
        "Qwen/Qwen3-4B-Base", 4096, "parallel")  # fmt: skip
    assert config.require_well_formed and config.require_final_answer and config.drop_reasoning
    assert "vllm serve deepseek-ai/DeepSeek-R1-0528-Qwen3-8B --data-parallel-size 8" in path.read_text()


BUDGETS = ("max_blocks", "max_path_tokens", "max_summary_tokens", "max_completion_length")


def test_an_sft_recipe_records_the_budgets_its_later_stages_sample_with():
    """What an SFT run records in its model (`exact_rollout`: generation and the model card's evaluation command
    sample with it) is what the GRPO recipes that start from its output, and the evaluation recipes of their
    outputs, use. A later stage's model is matched to an earlier stage's output_dir by its last part (the Qwen3
    recipes name a Hub copy, `<you>/...`)."""
    from parallel_r1.rollout.arguments import exact_rollout

    def budgets(settings):
        return {name: getattr(settings, name) for name in BUDGETS}

    def stem(name):
        return Path(name).name

    grpo = {path: yaml.safe_load(path.read_text()) for path in STAGES["grpo"][0]}
    evals = {path: yaml.safe_load(path.read_text()) for path in EVAL}
    pairs = 0
    for path in STAGES["sft"][0]:
        _, sft_args, _ = parse("sft", path)
        recorded = budgets(exact_rollout(sft_args))
        for grpo_path, grpo_recipe in grpo.items():
            if stem(grpo_recipe["model_name_or_path"]) != stem(sft_args.output_dir):
                continue
            _, grpo_args, _ = parse("grpo", grpo_path)
            assert budgets(grpo_args) == recorded, (path.relative_to(RECIPES), grpo_path.relative_to(RECIPES))
            pairs += 1
            for eval_path, eval_recipe in evals.items():
                if stem(eval_recipe["model_name_or_path"]) == stem(grpo_args.output_dir):
                    assert {k: eval_recipe[k] for k in BUDGETS} == recorded, eval_path.relative_to(RECIPES)
                    pairs += 1
    assert pairs >= 8  # SmolLM2 (GRPO, eval), tiny (GRPO, eval), demo (GRPO, eval), Qwen3 and Llama GRPO
