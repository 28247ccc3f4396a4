"""A mistake in the user's input ends a script with one line `error: ...` that names it, exit code 2, no traceback:
a table of such mistakes, run in-process, and a few of them as a user runs them (a process, `accelerate launch`)."""

import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parallel_r1.cli import flag_values, named_model, recipe_settings
from parallel_r1.configs import refuse_renamed_settings

ROOT = Path(__file__).resolve().parents[1]
SFT, GRPO = ROOT / "recipes/tiny/sft.yaml", ROOT / "recipes/tiny/grpo.yaml"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tag_prone_dir):
    """Recipes, data files and a base without the tags, each broken in one way."""
    from parallel_r1.testing.tiny import build_model, build_tokenizer

    folder = tmp_path_factory.mktemp("bad_inputs")
    recipe = f"model_name_or_path: {tag_prone_dir}\ndataset_name: gsm8k\nuse_cpu: true\nbf16: false\n"
    (folder / "unknown_key.yaml").write_text(recipe + "learning_rat: 1.0e-5\n")
    (folder / "on_a_gpu.yaml").write_text(
        f"model_name_or_path: {tag_prone_dir}\ndataset_name: parallel_gsm8k_sample\n"
    )
    (folder / "not_yaml.yaml").write_text("model_name_or_path: [unclosed\n")
    (folder / "old_key.yaml").write_text(
        f"model_name_or_path: {tag_prone_dir}\noutput_dir: out\nmax_completion_tokens: 5\n"
    )
    (folder / "old_cold_start.yaml").write_text("output_dir: out\nmodel_name_or_path: t\ndataset_split: train\n")
    (folder / "list.yaml").write_text("- output_dir\n")
    (folder / "columns.jsonl").write_text('{"q": "What is 2+2?", "a": "4"}\n')
    tokenizer = build_tokenizer(with_tags=False)
    build_model(tokenizer).save_pretrained(folder / "no_tags")
    tokenizer.save_pretrained(folder / "no_tags")
    return folder, str(tag_prone_dir)


def rows(folder: Path, model: str) -> list[tuple[str, list[str], str | tuple[str, ...]]]:
    """(script, arguments, the start of the one line it must end with, or that start and what else it names)."""
    grpo = ["--config", str(GRPO), "--model_name_or_path", model, "--output_dir", str(folder / "out")]
    sft = ["--config", str(SFT), "--model_name_or_path", model, "--output_dir", str(folder / "out")]
    return [
        ("sft", ["--config", str(folder / "unknown_key.yaml")],
         f"error: recipe {folder / 'unknown_key.yaml'}: unknown setting learning_rat (did you mean learning_rate?)"),
        ("sft", [*sft, "--learning_rte", "1e-5"], "error: unknown flag --learning_rte (did you mean --learning_rate?)"),
        ("sft", [*sft, "--dataset_name", "gsm8kk"], ("error: unknown data source 'gsm8kk'", "did you mean gsm8k?")),
        ("sft", [*sft, "--dataset_name", str(folder / "none.jsonl")], "error: data file not found"),
        ("sft", ["--config", str(folder / "not_yaml.yaml")], f"error: recipe {folder / 'not_yaml.yaml'} is not valid YAML: while parsing a flow sequence"),
        ("sft", ["--config", str(folder / "none.yaml")], f"error: recipe {folder / 'none.yaml'} does not exist"),
        ("sft", ["--config", str(SFT), "--config", str(SFT)], "error: --config is given 2 times"),
        ("sft", ["--model_name_or_path", model, "--config"], "error: --config needs a recipe file"),
        ("sft", ["--config", str(folder)], f"error: recipe {folder} is not a file"),
        ("sft", [f"--config={SFT}", "--model_name_or_path", model, "--accelerator_config", str(folder / "none.json")], "error: [Errno 2] No such file or directory:"),
        ("grpo", [*grpo, "--min_paths", "two"], "error: argument --min_paths/--min-paths: invalid int value: 'two' (see --help)"),
        ("grpo", [*grpo, "--attention", "sideways"], "error: argument --attention: invalid choice: 'sideways'"),
        ("grpo", [*grpo, "--num_pathz", "3"], "error: unknown flag --num_pathz (did you mean --"),
        ("grpo", [*grpo, "--rollout_mode", "plain"], "error: rollout_mode='plain' samples plain causal text"),
        ("grpo", [*grpo, "--rollout_mode", "trl"], "error: rollout_mode: 'trl' is now called 'plain'"),
        ("grpo", [*grpo, "--num_paths", "3"], "error: num_paths is now called min_paths and max_paths (both K for K paths a block)"),
        ("grpo", [*grpo, "--min_paths", "3", "--max_paths", "2"], "error: max_paths must be at least min_paths (3), got 2"),
        ("grpo", [*grpo, "--rollout_mode=trl"], "error: rollout_mode: 'trl' is now called 'plain'"),
        ("evaluate", ["--config", str(folder / "old_key.yaml")],
         f"error: recipe {folder / 'old_key.yaml'}: max_completion_tokens is now called max_completion_length"),
        ("generate", ["--model_name_or_path", model, "--max_completion_tokens", "5"],
         "error: max_completion_tokens is now called max_completion_length"),
        ("grpo", [*grpo, "--top_p", "0.9"], "error: top_p=0.9 changes what the rollout samples"),
        ("grpo", [*grpo, "--max_path_tokens", "0"], "error: max_path_tokens must be at least 1, got 0"),
        ("sft", [*sft, "--packing", "true"], "error: attention='isolated' cannot be used with packing=True"),
        ("grpo", [*grpo, "--model_name_or_path", str(folder / "typo")], f"error: model folder {folder / 'typo'} does not exist"),
        ("grpo", [*grpo, "--model_name_or_path", ""], "error: model_name_or_path is required"),
        ("grpo", [*grpo, "--reward_funcs", "acuracy"], "error: unknown reward 'acuracy'"),
        ("grpo", [*grpo, "--dataset_name", str(folder / "none.jsonl")], "error: data file not found"),
        ("grpo", [*grpo, "--dataset_name", str(folder / "columns.jsonl")], "error: no question column: expected one of"),
        ("grpo", [*grpo, "--model_name_or_path", str(folder / "no_tags")],
         ("error: These tags are not single tokens", "scripts/add_special_tokens.py")),
        ("grpo", [*grpo, "--resume_from_checkpoint", "true"], "error: --resume_from_checkpoint true: no complete checkpoint-*"),
        ("evaluate", ["--config", str(ROOT / "recipes/tiny/eval.yaml"), "--model_name_or_path", model,
                      "--benchmarks", "gsm8k"], "error: benchmark 'gsm8k' must be written name@k"),
        ("generate_cold_start", ["--config", str(ROOT / "recipes/tiny/cold_start.yaml"), "--teacher", "x"],
         "error: unknown flag --teacher"),
        ("generate_cold_start", ["--config", str(ROOT / "recipes/tiny/cold_start.yaml"), "--max_problems", "3"],
         "error: max_problems is now called max_train_samples"),
        ("generate_cold_start", ["--config", str(folder / "old_cold_start.yaml")],
         f"error: recipe {folder / 'old_cold_start.yaml'}: dataset_split is now called dataset_train_split"),
        ("generate_cold_start", ["--config", str(folder / "list.yaml")],
         f"error: recipe {folder / 'list.yaml'} is not a mapping of setting names to values"),
    ]  # fmt: skip


def test_each_mistake_ends_in_one_line_that_names_it(inputs, capsys, monkeypatch):
    folder, model = inputs
    for script, arguments, expected in rows(folder, model):
        start, *named = (expected,) if isinstance(expected, str) else expected
        monkeypatch.setattr(sys, "argv", [f"scripts/{script}.py", *arguments])
        with pytest.raises(SystemExit) as ended:
            runpy.run_path(str(ROOT / "scripts" / f"{script}.py"), run_name="__main__")
        stderr = capsys.readouterr().err
        lines = stderr.strip().splitlines()
        assert ended.value.code == 2, (script, arguments, stderr[-2000:])
        assert "Traceback" not in stderr and "usage:" not in stderr, (script, arguments, stderr[-2000:])
        assert lines[-1].startswith(start) and all(name in lines[-1] for name in named), (script, arguments, lines)
        assert [line for line in lines if line.startswith("error:")] == [lines[-1]]  # said once, last


def run_script(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("named", [["--model_name_or_path", "./typo"], ["--model-name-or-path=./typo"], []])
def test_a_missing_model_folder_fails_before_the_parse(tmp_path, named):
    """The folder a flag or the recipe names is checked before the parse: the process never imports torch, TRL or
    transformers (which is what makes it fail in a fraction of a second), and the line is all it says."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(GRPO.read_text().replace("model_name_or_path: outputs/tiny-sft", "model_name_or_path: ./typo"))
    assert "./typo" in recipe.read_text()
    command = [sys.executable, "-X", "importtime", str(ROOT / "scripts/grpo.py"), "--config", str(recipe), *named,
               "--output_dir", str(tmp_path / "out")]  # fmt: skip
    result = run_script(command, tmp_path)
    assert result.returncode == 2
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    assert "parallel_r1.cli" in imported  # the import log is read (the check is meaningful)
    assert not {"torch", "trl", "transformers", "vllm", "datasets"} & imported
    said = [line for line in result.stderr.splitlines() if not line.startswith("import time")]
    assert said == ["error: model folder ./typo does not exist (a Hub id is written owner/name)"]


def test_the_model_a_command_line_names():
    assert named_model(["--config", str(GRPO)]) == "outputs/tiny-sft"  # the recipe's
    assert named_model(["--config", str(GRPO), "--model_name_or_path", "a/b"]) == "a/b"  # the flag wins
    assert named_model(["--model_name_or_path", "a/b", "--model-name-or-path=c/d"]) == "c/d"  # the last flag
    assert named_model(["--output_dir", "x"]) is None and named_model(["--model_name_or_path"]) is None


def test_flags_are_read_in_both_spellings_and_the_last_one_wins():
    assert flag_values(["--a", "1", "--b-c=2", "pos", "--a", "3", "--d"]) == {"a": "3", "b_c": "2", "d": None}
    assert flag_values(["--a", "--b", "x"]) == {"a": "--b", "b": "x"}  # what follows a flag, as argparse would try


def test_a_recipe_is_read_once_before_the_parse(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: a/b\n")
    before = recipe_settings.cache_info().misses
    assert named_model(["--config", str(recipe)]) == "a/b"
    refuse_renamed_settings([], str(recipe))
    assert recipe_settings.cache_info().misses == before + 1


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (["--model_name_or_path", "./typo"], "error: model folder ./typo does not exist"),
        (["--max_paths", "two"], "error: argument --max_paths/--max-paths: invalid int value: 'two'"),
    ],
)
def test_under_accelerate_launch_quiet_the_line_is_the_end(tmp_path, tag_prone_dir, arguments, expected):
    """`accelerate launch -q` prints the child's output and no launcher traceback; it exits 1 for any failed child
    (its own code), and without -q it adds its traceback (CalledProcessError) after the line."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "-q", "--config_file",
               str(ROOT / "accelerate_configs/cpu.yaml"), str(ROOT / "scripts/grpo.py"), "--config", str(GRPO),
               "--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(tag_prone_dir), *arguments]  # fmt: skip
    result = run_script(command, tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(expected)


@pytest.mark.parametrize("offline", ["0", "1"])
def test_a_model_name_neither_here_nor_reachable_is_one_line(tmp_path, offline):
    """In a fresh clone there is no outputs/ folder, so `outputs/no-such-model-dir` has the form of a Hub id. Whether
    the Hub is unreachable (here) or HF_HUB_OFFLINE forbids it, the run ends in seconds with one line, exit 2, saying
    the name is neither a local folder nor to be had from the Hub (transformers took 57 s and raised OSError)."""
    command = [sys.executable, str(ROOT / "scripts/sft.py"), "--config", str(SFT), "--model_name_or_path",
               "outputs/no-such-model-dir", "--output_dir", str(tmp_path / "out")]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": offline, "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    began = time.monotonic()
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert time.monotonic() - began < 10
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: model outputs/no-such-model-dir is not a local folder, and ")
    assert ("HF_HUB_OFFLINE" in line) and ("cache" in line)


# --------------------------------------------------------------------------- the newcomer's path (issue 43)

MISSING_TRACKER = [  # (what a command line gives, the one line it ends with); neither package is installed here
    (["--report_to", "wandb"], "error: report_to wandb needs the wandb package, which is not installed: pip install wandb"),
    (["--report_to", "none", "tensorboard"],
     "error: report_to tensorboard needs the tensorboard package, which is not installed: pip install tensorboard"),
    (["--report_to=wandb"], "error: report_to wandb needs the wandb package, which is not installed: pip install wandb"),
]  # fmt: skip


@pytest.mark.parametrize("arguments, expected", MISSING_TRACKER)
def test_a_tracker_that_is_not_installed_is_one_line_before_the_parse(tmp_path, arguments, expected):
    import importlib.util

    if importlib.util.find_spec("wandb") or importlib.util.find_spec("tensorboard"):
        pytest.skip("wandb or tensorboard is installed here: the missing-package line cannot be seen")
    command = [sys.executable, "-X", "importtime", str(ROOT / "scripts/sft.py"), "--config", str(SFT),
               "--model_name_or_path", str(tmp_path), "--output_dir", str(tmp_path / "out"), *arguments]  # fmt: skip
    result = run_script(command, tmp_path)
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    assert "parallel_r1.cli" in imported and not {"torch", "trl", "transformers"} & imported
    said = [line for line in result.stderr.splitlines() if not line.startswith("import time")]
    assert result.returncode == 2 and said == [expected]


def test_trackers_are_read_from_the_recipe_too_and_trackio_names_the_extra(tmp_path, monkeypatch):
    from parallel_r1.cli import check_trackers

    monkeypatch.setitem(sys.modules, "trackio", None)  # installed here: made unimportable
    recipe = tmp_path / "r.yaml"
    recipe.write_text("report_to: [trackio]\n")
    with pytest.raises(ValueError) as raised:
        check_trackers(["--config", str(recipe)])
    assert str(raised.value) == (
        'report_to trackio needs the trackio package, which is not installed: pip install "parallel_r1[tracking]" '
        "(make install brings it)"
    )
    for fine in (["--config", str(recipe), "--report_to", "none"], ["--report_to", "all"], []):
        check_trackers(fine)  # none, or whatever is installed, or nothing named
    (tmp_path / "one.yaml").write_text("report_to: wandb\n")  # a name, not a list (recipes are read once a process)
    with pytest.raises(ValueError, match="pip install wandb"):
        check_trackers(["--config", str(tmp_path / "one.yaml")])


@pytest.mark.parametrize("offline", ["0", "1"])
def test_the_smollm2_recipe_offline_names_make_real_model(tmp_path, offline):
    """The first command docs/real-model.md gives, on a machine without the Hub and without the converted model."""
    command = [sys.executable, str(ROOT / "scripts/sft.py"), "--config",
               str(ROOT / "recipes/SmolLM2-135M-Instruct/sft/unseen.yaml"), "--output_dir", str(tmp_path / "out")]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": offline, "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: model HuggingFaceTB/SmolLM2-135M-Instruct is not a local folder, and ")
    assert "make real-model" in line and "--model_name_or_path" in line


def test_a_recipes_output_folder_not_yet_written_names_the_stage_that_writes_it(tmp_path):
    """The GRPO recipe run before SFT, in a clone with no outputs/ folder: no Hub advice, the folder and its stage."""
    command = [sys.executable, str(ROOT / "scripts/grpo.py"), "--config",
               str(ROOT / "recipes/SmolLM2-135M-Instruct/grpo/unseen_s2.yaml"), "--output_dir", str(tmp_path / "out")]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: model folder outputs/SmolLM2-135M-Instruct-Parallel-SFT-Unseen does not exist: it is the output_dir "
        "of recipes/SmolLM2-135M-Instruct/sft/unseen.yaml (scripts/sft.py): run that stage first"
    ]


def test_a_misspelt_dataset_is_refused_by_the_parse_before_any_model_loads(inputs):
    from parallel_r1.configs import grpo_parser, sft_parser

    folder, model = inputs
    for parser, recipe, typo in ((sft_parser, SFT, "parallel_gsm8k_sampel"), (grpo_parser, GRPO, "gsm8kk")):
        arguments = ["--config", str(recipe), "--model_name_or_path", model, "--dataset_name", typo]
        with pytest.raises(ValueError, match=f"unknown data source '{typo}'.*did you mean"):
            parser().parse_args_and_config(arguments)


@pytest.mark.parametrize("script", ["sft", "grpo"])
def test_a_missing_data_file_is_said_before_the_model_loads(inputs, capsys, monkeypatch, script):
    import parallel_r1.training

    folder, model = inputs

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the data")

    monkeypatch.setattr(parallel_r1.training, "load_model", refuse)
    recipe = {"sft": SFT, "grpo": GRPO}[script]
    monkeypatch.setattr(sys, "argv", [f"scripts/{script}.py", "--config", str(recipe), "--model_name_or_path", model,
                                      "--output_dir", str(folder / "out"), "--dataset_name", str(folder / "none.jsonl")])  # fmt: skip
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(ROOT / "scripts" / f"{script}.py"), run_name="__main__")
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: data file not found: {folder / 'none.jsonl'}"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="bf16 is supported on this machine's GPU")
def test_a_recipe_without_bf16_false_on_a_cpu_names_it(inputs):
    from parallel_r1.configs import grpo_parser, sft_parser

    folder, _ = inputs
    for parser in (sft_parser, grpo_parser):
        with pytest.raises(ValueError) as raised:
            parser().parse_args_and_config(["--config", str(folder / "on_a_gpu.yaml"), "--dataset_name", "gsm8k"])
        assert "bf16: false" in str(raised.value) and "use_cpu" not in str(raised.value)


def test_a_shortened_grpo_run_generates_no_more_than_it_trains(caplog):
    """TRL generates steps_per_generation micro-batches at once; the SmolLM2 recipe's 16 are two optimizer steps."""
    from parallel_r1.configs import grpo_parser

    recipe = ["--config", str(ROOT / "recipes/SmolLM2-135M-Instruct/grpo/unseen_s2.yaml")]
    _, full, _ = grpo_parser().parse_args_and_config(recipe)
    assert full.steps_per_generation == 16 and full.generation_batch_size == 128
    _, short, _ = grpo_parser().parse_args_and_config([*recipe, "--max_steps", "1"])
    assert short.steps_per_generation == 8 and short.generation_batch_size == 64  # one optimizer step's micro-batches
    assert "steps_per_generation 16 is lowered to 8" in caplog.text
    # micro-batches of 4 hold half a group of 8: one trained micro-batch takes two, the fewest that hold a group
    _, halves, _ = grpo_parser().parse_args_and_config(
        [*recipe, "--max_steps", "1", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"]
    )
    assert halves.steps_per_generation == 2 and halves.generation_batch_size == 8


@pytest.mark.slow  # measured: about 30 s (two processes import torch and TRL)
def test_a_two_process_launch_says_the_line_once(tmp_path, tag_prone_dir, free_port):
    """Each process meets the same bad setting; only the main one says it (the others wait to be stopped). What
    remains is accelerate's: with -q, torch's launcher report of the failed processes (no traceback)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "-q", "--config_file",
               str(ROOT / "accelerate_configs/cpu.yaml"), "--multi_gpu", "--num_processes", "2", "--main_process_port",
               str(free_port()), str(ROOT / "scripts/grpo.py"), "--config", str(GRPO), "--output_dir",
               str(tmp_path / "out"), "--model_name_or_path", str(tag_prone_dir), "--max_paths", "two"]  # fmt: skip
    result = run_script(command, tmp_path)
    assert result.returncode == 1
    said = [line for line in result.stderr.splitlines() if "error:" in line]
    assert said == ["error: argument --max_paths/--max-paths: invalid int value: 'two' (see --help)"], result.stderr
    assert "Traceback" not in result.stderr
