"""The model card (README.md) a training run saves: ours, not TRL's generic one, at each checkpoint and at the end."""

import contextlib
import io
import json
import re
import runpy
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.configs import ParallelSFTConfig
from parallel_r1.data import SFTDataArguments, load_sft_traces
from parallel_r1.rollout import RolloutArguments
from parallel_r1.tags.tokens import tag_ids
from parallel_r1.trainers import ParallelSFTTrainer
from parallel_r1.trainers.card import eval_command, eval_recipe, hub_id

ROOT = Path(__file__).resolve().parents[1]
CARD_TAGS = {"trl", "parallel-r1", "parallel-thinking"}

pytestmark = pytest.mark.usefixtures("one_thread")


def run_script(monkeypatch, name: str, *argv: str) -> None:
    """`scripts/<name>.py` as its command line runs it (`cli`), in this process, from the repository's root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [f"scripts/{name}.py", *argv])
    runpy.run_path(str(ROOT / "scripts" / f"{name}.py"))["cli"]()


def rows(text: str, heading: str | None = None) -> dict:
    """The `| name | value |` rows of the table under `## heading` (None: the one before the first heading), names
    and values without their backquotes."""
    section = text.split(f"## {heading}\n", 1)[1] if heading else text
    lines = [line for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    cells = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in lines[2:]]
    return {name: value for name, value in cells}


def code_block(text: str, language: str) -> str:
    return re.search(rf"```{language}\n(.*?)```", text, re.S).group(1)


def test_sft_saves_a_card_of_the_run_without_any_checkpoint(monkeypatch, tiny_dir, tmp_path):
    out = tmp_path / "sft"
    run_script(monkeypatch, "sft", "--config", "recipes/tiny/sft.yaml", "--model_name_or_path", str(tiny_dir),
               "--output_dir", str(out), "--max_steps", "2", "--logging_steps", "1", "--max_train_samples", "2",
               "--per_device_train_batch_size", "1", "--log_level", "warning")  # fmt: skip
    assert not list(out.glob("checkpoint-*"))  # save_strategy "no": the card comes from train_and_save
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and CARD_TAGS | {"sft"} <= set(card.data.tags)
    assert card.data.base_model is None and card.data.datasets is None  # a local folder and a shipped set
    text = card.text
    assert "fine-tuned version of" not in text  # TRL's generic card is gone
    overview = rows(text)
    assert overview["Stage"] == "SFT" and overview["Recipe"] == "recipes/tiny/sft.yaml"
    assert overview["Data"] == "parallel_gsm8k_sample" and overview["Base model"].startswith(str(tiny_dir))
    assert overview["Attention"].startswith("isolated`: Unseen")
    ids = tag_ids(AutoTokenizer.from_pretrained(out))
    assert rows(text, "Tags") == {tag: str(i) for tag, i in ids.items()}
    assert "How their embedding rows started is not recorded." in text  # the tiny model's tags came with it
    recorded = json.loads((out / "config.json").read_text())["parallel_r1"]
    assert recorded["attention"] == "isolated" and rows(text, "Rollout settings") == {
        k: str(v) for k, v in recorded.items()
    }
    training = rows(text, "Training")
    assert (
        training["steps"] == "2 of 2"
        and training["learning_rate"] == "0.001"
        and training["lr_scheduler_type"] == "cosine"
        and training["max_length"] == "1024"
        and training["tag_lr_multiplier"] == "1.0"
    )
    assert "## Rewards" not in text
    last = json.loads((out / "trainer_state.json").read_text())["log_history"][-2]  # before the end-of-run summary
    assert "At step 2 " in text and float(rows(text, "Last logged metrics")["loss"]) == pytest.approx(
        last["loss"], rel=1e-3
    )
    assert f'ParallelSampler("{out}")' in code_block(text, "python")
    assert code_block(text, "bash").splitlines() == [
        f'python scripts/generate.py --model_name_or_path {out} --prompt "What is 17 * 23?"',
        f"python scripts/evaluate.py --config recipes/tiny/eval.yaml --model_name_or_path {out}"
        + "".join(f" --{k} {v}" for k, v in vars(RolloutArguments(**recorded)).items() if v is not None),
    ]


def test_grpo_writes_the_card_at_each_checkpoint_and_its_snippet_samples_the_model(monkeypatch, tag_prone_dir,
                                                                                     tmp_path):  # fmt: skip
    saved = []  # (path, text) of every card written
    original = ModelCard.save
    monkeypatch.setattr(ModelCard, "save", lambda card, path: (saved.append((path, str(card))), original(card, path)))
    out = tmp_path / "grpo"
    run_script(monkeypatch, "grpo", "--config", "recipes/tiny/grpo.yaml", "--model_name_or_path", str(tag_prone_dir),
               "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1",
               "--max_train_samples", "4", "--per_device_train_batch_size", "4", "--max_completion_length", "48",
               "--max_path_tokens", "12", "--max_summary_tokens", "6", "--log_level", "warning")  # fmt: skip
    assert [Path(p) for p, _ in saved] == [out / "README.md"] * 3  # checkpoints 1 and 2 (TRL's hook), then the end
    assert "At step 1 " in saved[0][1] and "At step 2 " in saved[-1][1]
    card = ModelCard.load(out / "README.md")
    assert CARD_TAGS | {"grpo"} <= set(card.data.tags) and card.data.base_model is None
    text = card.text
    assert rows(text, "Rewards") == {"alternating(accuracy,tiered,window=4,a_steps=3)": "1.0", "well_formed": "0.5"}
    rollout = rows(text, "Rollout settings")
    assert (
        rollout["rollout_mode"] == "fork"
        and rollout["max_path_tokens"] == "12"
        and rollout["min_paths"] == rollout["max_paths"] == "2"
    )
    assert rows(text, "Training")["loss_type"] == "dapo" and rows(text, "Training")["num_generations"] == "4"
    metrics = rows(text, "Last logged metrics")
    assert {"loss", "reward", "parallel/ratio", "rewards/well_formed/mean"} <= set(metrics) and len(metrics) < 16
    assert list((out / "completions").glob("completions_*.parquet"))  # log_completions: TRL's parquet (README)
    printed, snippet = io.StringIO(), {}
    with contextlib.redirect_stdout(printed):
        exec(code_block(text, "python"), snippet)  # the card's snippet, as a user would paste it
    # it sampled the saved model (a completion may be a lone EOS after two steps) and printed the text of it
    assert snippet["rollout"].completion_ids and snippet["sampler"].backend.model.config._name_or_path == str(out)
    assert printed.getvalue() == snippet["sampler"].text(snippet["rollout"]) + "\n"


def test_a_card_before_any_log_names_hub_models_and_datasets_in_its_metadata(tiny_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype="float32")
    model.config._name_or_path = "Qwen/Qwen3-4B-Base"  # as if loaded from the Hub
    args = ParallelSFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                             max_length=600, dataset_num_proc=None)  # fmt: skip
    traces = load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"), limit=1)
    trainer = ParallelSFTTrainer(
        model, args, train_dataset=traces, processing_class=AutoTokenizer.from_pretrained(tiny_dir)
    )
    trainer.create_model_card(dataset_name="openai/gsm8k")
    card = ModelCard.load(tmp_path / "out" / "README.md")
    assert card.data.base_model == "Qwen/Qwen3-4B-Base" and card.data.datasets == ["openai/gsm8k"]
    assert "Nothing was logged." in card.text and "None recorded" in card.text  # no run through train_and_save yet
    assert "[Qwen/Qwen3-4B-Base](https://huggingface.co/Qwen/Qwen3-4B-Base)" in card.text


def test_hub_ids_are_owner_slash_name_and_not_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "run").mkdir(parents=True)
    assert hub_id("Qwen/Qwen3-4B-Base") == "Qwen/Qwen3-4B-Base" and hub_id("openai/gsm8k") == "openai/gsm8k"
    for local in ("outputs/run", str(tmp_path), "./run", "gsm8k", "a/b/c.parquet", "", None):
        assert hub_id(local) is None, local


def test_the_evaluation_command_takes_a_neighbouring_recipe_and_the_recorded_settings(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert eval_recipe("recipes/tiny/grpo.yaml") == "recipes/tiny/eval.yaml"
    # the recipe's isolated/fork lose; an unset setting (None) is no flag, which the parser could not read back
    seen = {"attention": "causal", "rollout_mode": "sequential", "max_paths": 2, "summary_temperature": None}
    assert eval_command("recipes/Qwen3-4B-Base/sft/seen.yaml", "you/m", seen) == (
        "python scripts/evaluate.py --config recipes/Qwen3-4B-Base/eval/paper.yaml --model_name_or_path you/m"
        " --attention causal --rollout_mode sequential --max_paths 2"
    )
    assert eval_command(None, "out", None).endswith("--model_name_or_path out")
    assert eval_recipe("recipes/Qwen3-4B-Base/grpo/unseen_s2.yaml") == "recipes/Qwen3-4B-Base/eval/paper.yaml"
    assert eval_recipe("recipes/Llama-3.2-3B/sft/unseen.yaml") == eval_recipe(None)  # none of its own: the paper's
