"""Tracking with trackio (`--report_to trackio`), offline: what a tracked run and the demo leave in the local store.

- GRPO on one process logs every number the trainer logs as a named scalar of its run (the `parallel/` shape and
  critical path, the sampler-trainer gap, the tags' learning rate, reward, KL, entropy), its settings (rollout ones
  included) as the run's config, and TRL's completions table with the tags in the text; under the network guard
  (`offline/sitecustomize.py`) nothing leaves the machine. SFT and the two-process runs: test_multiprocess.py.
- `scripts/demo.py` logs every training stage to one project in its output folder, one run a stage named as its
  output, and ends by printing the command that shows them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from launches import Launch, step_logs
from tracking import metric_names, not_in_store, read_store, refused, tracked_env

from parallel_r1.tags.language import TAGS

GRPO = ["scripts/grpo.py", "--config", "recipes/tiny/grpo.yaml", "--per_device_train_batch_size", "4"]
GRPO += ["--max_completion_length", "48", "--max_path_tokens", "12", "--max_summary_tokens", "6"]
GRPO += ["--max_train_samples", "8", "--seed", "0", "--max_steps", "2", "--beta", "0.04", "--tag_lr_multiplier", "2"]
GRPO += ["--report_to", "trackio", "--project", "tracked", "--run_name", "grpo-one"]


@pytest.mark.slow
def test_grpo_logs_its_metrics_settings_and_tagged_completions_to_trackio_offline(tmp_path, tag_prone_dir):
    out = tmp_path / "grpo"
    command = [sys.executable, *GRPO, "--model_name_or_path", str(tag_prone_dir), "--output_dir", str(out)]
    with Launch(command, tmp_path / "grpo.log", tracked_env(tmp_path / "trackio", tmp_path / "network")) as launch:
        assert launch.finish() == 0, launch.text()[-3000:]
    run = read_store(tmp_path / "trackio", "tracked")["grpo-one"]
    history = step_logs(out)
    assert [entry["step"] for entry in history] == [1, 2]
    assert not_in_store(run, history) == []
    assert {
        "train/reward", "train/kl", "train/entropy", "train/tag_learning_rate", "train/parallel/ratio",
        "train/parallel/blocks_per_completion", "train/parallel/paths_per_block", "train/parallel/tokens_critical",
        "train/parallel/critical_over_total", "train/sampling/sampling_logp_difference/mean",
        "train/sampling/sampling_logp_difference/max",
    } <= metric_names(run)  # fmt: skip
    settings = {"rollout_mode": "fork", "attention": "isolated", "max_path_tokens": 12, "max_summary_tokens": 6,
                "min_paths": 2, "max_paths": 2, "tag_lr_multiplier": 2.0, "output_dir": str(out)}  # fmt: skip
    assert {name: run["config"].get(name) for name in settings} == settings
    rows = run["tables"]["completions"]
    assert {row["step"] for row in rows} == {1, 2} and len(rows) == 8  # each generation's completions, once
    texts = [
        row["completion"][0]["content"] if isinstance(row["completion"], list) else row["completion"] for row in rows
    ]
    assert any(tag in text for text in texts for tag in TAGS), texts  # the tag-prone model writes tags: kept
    assert "<Parallel>" in launch.text() or "<Path>" in launch.text()  # and in the table printed on the console
    assert refused(tmp_path / "network") == []


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first of the tests of the quick demo jobs waits for all of them
def test_the_demo_logs_every_training_stage_to_one_trackio_project(quick_demos):
    out, done = quick_demos["matched"]
    assert done.returncode == 0, done.stdout[-3000:]
    runs = read_store(out / "trackio", "parallel-r1-demo")
    trained = {"base", "sft", "grpo-plain", "grpo", "sft-plain", "grpo-plain-matched", "grpo-sft-plain-matched"}
    assert set(runs) == trained
    for name in trained - {"base"}:  # TRL's SFT script, which trains the base, keeps no trainer_state.json
        assert not_in_store(runs[name], step_logs(out / name)) == [], name
    assert "train/loss" in metric_names(runs["base"]) and "train/parallel/ratio" in metric_names(runs["grpo"])
    show = f"TRACKIO_DIR={out / 'trackio'} {Path(sys.executable).parent / 'trackio'} show --project parallel-r1-demo"
    assert show in done.stdout
