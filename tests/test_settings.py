"""The rollout, sampling and vLLM settings are declared once (`rollout.arguments`); every config that needs them
inherits them or the variant derived from them, and old names are refused with the new one named."""

import ast
import dataclasses
import json
import runpy
from pathlib import Path

import pytest
from trl import GRPOConfig

from parallel_r1.cold_start.config import ColdStartConfig
from parallel_r1.configs import GRPOScriptArguments, ParallelGRPOConfig, ParallelSFTConfig, grpo_parser
from parallel_r1.data import DataArguments, SFTDataArguments
from parallel_r1.evaluation.config import EvaluationConfig
from parallel_r1.model_settings import read_settings
from parallel_r1.rollout import ParallelArguments, RecordedRolloutArguments, RolloutArguments
from parallel_r1.rollout.arguments import RolloutBudgets, SamplingArguments, VLLMArguments

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [f.name for f in dataclasses.fields(RolloutArguments)]
GROUPS = (RolloutArguments, SamplingArguments, VLLMArguments)
OWNER = {
    f.name: f"parallel_r1/rollout/arguments.py:{group.__name__}" for group in GROUPS for f in dataclasses.fields(group)
}
OWNER.update(
    dict.fromkeys(("attention", "min_paths", "max_paths"), "parallel_r1/rollout/arguments.py:ParallelArguments")
)
OWNER.update(
    dict.fromkeys(
        ("max_blocks", "max_path_tokens", "max_summary_tokens", "max_completion_length"),
        "parallel_r1/rollout/arguments.py:RolloutBudgets",
    )
)
OWNER["prompt_template"] = "parallel_r1/data/arguments.py:PromptArguments"
OWNER.update(
    question_column="parallel_r1/data/arguments.py:ColumnArguments",
    max_train_samples="parallel_r1/data/sources.py:DataArguments",
)
OWNER["answer_column"] = "parallel_r1/data/arguments.py:ColumnArguments"


def declarations(name: str) -> list[str]:
    """Where a class body of the package or the scripts declares a setting `name`: a field with help (file:class)."""
    found = []
    for path in sorted([*(ROOT / "parallel_r1").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    target = getattr(statement, "target", None)
                    value = getattr(statement, "value", None)
                    helped = isinstance(value, ast.Call) and any(k.arg == "metadata" for k in value.keywords)
                    if isinstance(target, ast.Name) and target.id == name and helped:
                        found.append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


@pytest.mark.parametrize("name", sorted(OWNER))
def test_each_rollout_sampling_vllm_and_data_setting_is_declared_once(name):
    assert declarations(name) == [OWNER[name]]


@pytest.mark.parametrize("name", ["dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split"])
def test_the_dataset_fields_are_trls_own(name):
    """SFT, GRPO and the cold start take them from `trl.ScriptArguments` (through `DataArguments`)."""
    assert declarations(name) == []
    for config in (SFTDataArguments, GRPOScriptArguments, ColdStartConfig):
        assert name in {f.name for f in dataclasses.fields(config)} and issubclass(config, DataArguments)


def test_the_configs_inherit_the_settings_or_their_unset_variant():
    generate = runpy.run_path(str(ROOT / "scripts" / "generate.py"))["GenerateArguments"]
    assert issubclass(ParallelGRPOConfig, RolloutArguments) and issubclass(ParallelSFTConfig, ParallelArguments)
    assert issubclass(ParallelSFTConfig, RolloutBudgets)  # what an SFT run records for the stages after it
    assert issubclass(EvaluationConfig, RecordedRolloutArguments) and issubclass(generate, RecordedRolloutArguments)
    assert all(issubclass(c, SamplingArguments) for c in (EvaluationConfig, ColdStartConfig, generate))
    assert issubclass(EvaluationConfig, VLLMArguments) and issubclass(ColdStartConfig, VLLMArguments)
    unset = {f.name: f for f in dataclasses.fields(RecordedRolloutArguments)}
    assert list(unset) == SETTINGS and all(f.default is None for f in unset.values())
    assert "Unset: the model's recorded value, else 'isolated'." in unset["attention"].metadata["help"]


def test_grpo_takes_the_completion_cap_under_trls_name_and_keeps_trls_positional_order(tmp_path):
    ours = ParallelGRPOConfig(str(tmp_path), use_cpu=True, bf16=False)
    assert ours.output_dir == str(tmp_path) and ours.max_completion_length == RolloutArguments().max_completion_length
    assert "max_completion_length" in {f.name for f in dataclasses.fields(GRPOConfig)}  # the name TRL reads


def test_literal_settings_offer_their_choices_in_help():
    help_text = " ".join(grpo_parser().format_help().split())
    assert "--rollout_mode {fork,sequential,plain}" in help_text and "--attention {isolated,causal,tree}" in help_text


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(rollout_mode="trl"), "'trl' is now called 'plain'"),
        (dict(attention="sideways"), "attention must be one of"),
        (dict(rollout_mode="sequential", attention="tree"), "attention='causal'"),
        (dict(min_paths=1, max_paths=1), "min_paths must be at least 2"),
        (dict(min_paths=3, max_paths=2), "max_paths must be at least min_paths"),
        (dict(max_blocks=-1), "max_blocks must be >= 0"),
        (dict(max_completion_length=0), "max_completion_length must be at least 1"),
        (dict(prompt_template="fancy"), "template"),
    ],
)
def test_bad_settings_are_refused_by_every_config_that_holds_them(tmp_path, values, message):
    with pytest.raises(ValueError, match=message):
        RolloutArguments(**values)
    with pytest.raises(ValueError, match=message):
        RecordedRolloutArguments(**values)
    with pytest.raises(ValueError, match=message):
        EvaluationConfig(output_dir=str(tmp_path), **values)


def test_unset_settings_pass_the_checks_until_filled():
    assert dataclasses.asdict(RecordedRolloutArguments(rollout_mode="sequential")) == {
        **dict.fromkeys(SETTINGS),
        "rollout_mode": "sequential",
    }


def test_a_model_that_recorded_an_old_name_is_read_under_the_new_one(tmp_path):
    old = {"attention": "causal", "rollout_mode": "sequential", "max_completion_tokens": 77, "gone": 1}
    (tmp_path / "config.json").write_text(json.dumps({"parallel_r1": old}))
    assert read_settings(str(tmp_path)) == RolloutArguments(
        attention="causal", rollout_mode="sequential", max_completion_length=77
    )


def test_a_model_that_recorded_a_fixed_width_keeps_it(tmp_path):
    """`num_paths: K`, recorded before a block's width could be chosen, reads as min_paths = max_paths = K."""
    (tmp_path / "config.json").write_text(json.dumps({"parallel_r1": {"num_paths": 3, "max_blocks": 2}}))
    assert read_settings(str(tmp_path)) == RolloutArguments(min_paths=3, max_paths=3, max_blocks=2)
    assert read_settings(str(tmp_path), max_paths=5) == RolloutArguments(min_paths=3, max_paths=5, max_blocks=2)


def test_a_model_that_recorded_an_old_value_is_read_with_the_new_one(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"parallel_r1": {"attention": "causal", "rollout_mode": "trl"}}))
    assert read_settings(str(tmp_path)).rollout_mode == "plain"


@pytest.mark.parametrize("values", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_sampling_is_refused_by_evaluation_generation_and_the_cold_start(tmp_path, values):
    generate = runpy.run_path(str(ROOT / "scripts" / "generate.py"))
    with pytest.raises(ValueError, match="temperature must be >= 0 and top_p in"):
        generate["GenerateArguments"](model_name_or_path="m", **values)
    with pytest.raises(ValueError, match="temperature must be >= 0 and top_p in"):
        EvaluationConfig(output_dir=str(tmp_path), **values)
    with pytest.raises(ValueError, match="temperature must be >= 0 and top_p in"):
        ColdStartConfig(output_dir=str(tmp_path), model_name_or_path="teacher", dataset_name="gsm8k", **values)


SETTINGS_CLASSES = [
    *(ParallelArguments, RolloutArguments, RecordedRolloutArguments, SamplingArguments, VLLMArguments),
    *(ParallelGRPOConfig, EvaluationConfig, ColdStartConfig, DataArguments, GRPOScriptArguments, SFTDataArguments),
]


@pytest.mark.parametrize("settings", SETTINGS_CLASSES, ids=lambda c: c.__name__)
def test_each_settings_class_documents_its_own_fields_with_type_default_and_help(settings):
    own = settings.__dict__.get("__annotations__", {})
    documented = [f for f in dataclasses.fields(settings) if f.name in own and "help" in f.metadata]
    doc = " ".join(settings.__doc__.split())
    assert documented and "Parameters:" in doc
    for f in documented:
        assert f"{f.name} (`" in doc and " ".join(f.metadata["help"].split())[:60] in doc, f.name
