"""ParallelGRPOTrainer on the tiny model, CPU: rewards see tags, inserted tokens get no gradient,
the isolated forward is the structure's, metrics are logged, resumes continue the schedule."""

import json
import math
import os
import re
import signal
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
from launches import Launch, succeeded
from safetensors.torch import load_file
from transformers import AutoTokenizer, TrainerCallback

from parallel_r1.data import build_prompt
from parallel_r1.rewards import get_reward_funcs
from parallel_r1.rollout.arguments import ParallelArguments
from parallel_r1.structure import isolated_inputs
from parallel_r1.tags.grammar import Grammar, masked_logps
from parallel_r1.tags.language import TAGS, parse
from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.tiny_grpo import arithmetic_dataset, length_reward, tiny_grpo_config, tiny_grpo_trainer
from parallel_r1.trainers import ParallelGRPOTrainer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture
def dataset():
    return arithmetic_dataset()


def config(tmp_path, **overrides):
    return tiny_grpo_config(tmp_path / "out", **overrides)


@pytest.mark.parametrize("attention, mode", [("isolated", "fork"), ("causal", "sequential"), ("tree", "fork")])
def test_training_steps_log_shapes_and_an_exact_sampler(tmp_path, tag_prone_dir, dataset, attention, mode):
    seen = []

    def recording_reward(completions, **kwargs):
        seen.extend(c[0]["content"] for c in completions)
        return length_reward(completions)

    # the block limit is reached often (tag-prone model): its ban is re-applied by the trainer's forward
    args = config(tmp_path, attention=attention, rollout_mode=mode, max_blocks=1)
    trainer = tiny_grpo_trainer(tag_prone_dir, args, dataset, [recording_reward])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "parallel/ratio" in entry]
    assert len(logs) == 2
    for entry in logs:
        for key in ("parallel/blocks_per_completion", "parallel/format_valid", "parallel/tokens_critical"):
            assert key in entry
        # the sampler's log-probs are the trainer's: exact pairs (engine, structure and grammar agree)
        assert entry["sampling/sampling_logp_difference/max"] < 1e-4
    assert max(entry["parallel/blocks_per_completion"] for entry in logs) > 0
    # the reward functions received the completions with their tags as text, and so did the completions table
    assert any(tag in text for text in seen for tag in TAGS)
    table = [str(completion) for completion in trainer._logs["completion"]]
    assert any(tag in text for text in table for tag in TAGS)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_a_summary_temperature_is_sampled_and_trained_exactly(tmp_path, tag_prone_dir, dataset):
    """The summary drawn at its own temperature and scored at it: the sampler's log-probs stay the trainer's."""
    args = config(tmp_path, temperature=0.9, summary_temperature=0.5, max_blocks=1)
    trainer = tiny_grpo_trainer(tag_prone_dir, args, dataset, [length_reward])
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "parallel/ratio" in entry]
    assert max(entry["parallel/blocks_per_completion"] for entry in logs) > 0
    assert all(entry["sampling/sampling_logp_difference/max"] < 1e-4 for entry in logs)


@pytest.mark.parametrize("attention", ["isolated", "tree"])
def test_chosen_widths_train_exactly_and_log_their_width(tmp_path, tag_prone_dir, dataset, attention):
    """min_paths 2, max_paths 4: the width decisions are sampled tokens in TRL's tool mask (gradient), the trainer's
    log-probs are the sampler's (probe or in line, grammar's allow-list), and the width metrics are logged."""
    from parallel_r1.tags.language import decision_points

    args = config(tmp_path, attention=attention, min_paths=2, max_paths=4, max_blocks=1, max_completion_length=96)
    trainer = tiny_grpo_trainer(tag_prone_dir, args, dataset, [length_reward])
    batch = _batch(trainer, copies=4)
    vocab = tag_vocab(trainer.processing_class)
    decisions, widths = 0, []
    for ids, mask, tools in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"]):
        real = ids[mask.bool()].tolist()
        for i in decision_points(real, vocab, ParallelArguments(min_paths=2, max_paths=4)):
            assert tools[i] == 1
            decisions += 1
        widths += [len(block.paths) for block in parse(real, vocab).blocks]
    assert decisions > 0
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "parallel/ratio" in entry]
    for entry in logs:
        assert entry["sampling/sampling_logp_difference/max"] < 1e-5
        if entry["parallel/blocks_per_completion"] > 0:  # a step without blocks logs 0 for the widths
            assert 2 <= entry["parallel/paths_per_block_min"] <= entry["parallel/paths_per_block"]
            assert entry["parallel/paths_per_block"] <= entry["parallel/paths_per_block_max"] <= 4
        assert 0 <= entry["parallel/openings_alike"] <= 1 and 0 <= entry["parallel/self_bleu"] <= 1
    # a block wider than two was chosen somewhere (the tag-prone model often goes past two; 24 completions)
    assert max(widths + [entry["parallel/paths_per_block_max"] for entry in logs]) > 2


def _batch(trainer, copies: int = 1):
    """One generated and scored batch, as the training step receives it (of `copies` times the four problems)."""
    inputs = arithmetic_dataset().to_list() * copies
    trainer.model.train()
    return trainer._generate_and_score_completions(inputs)


def test_inserted_tokens_get_no_gradient(tmp_path, tag_prone_dir, dataset):
    """d loss / d log-prob is zero on every inserted token and not on the sampled ones."""
    trainer = tiny_grpo_trainer(tag_prone_dir, config(tmp_path), dataset)
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets before compute_loss
    batch = _batch(trainer)
    real = batch["completion_mask"].bool()
    inserted, sampled = real & (batch["tool_mask"] == 0), real & (batch["tool_mask"] == 1)
    assert inserted.any() and sampled.any()
    delta = torch.zeros(batch["completion_ids"].shape, requires_grad=True)
    original = ParallelGRPOTrainer._get_per_token_logps_and_entropies

    def shifted(self, *args, **kwargs):
        logps, entropies, aux = original(self, *args, **kwargs)
        return logps + delta, entropies, aux

    trainer._get_per_token_logps_and_entropies = shifted.__get__(trainer)
    trainer.compute_loss(trainer.model, batch).backward()
    assert delta.grad[inserted].abs().max() == 0.0
    assert delta.grad[sampled].abs().max() > 0.0


def test_isolated_log_probs_are_the_structure_forward(tmp_path, tag_prone_dir, dataset):
    trainer = tiny_grpo_trainer(tag_prone_dir, config(tmp_path, max_completion_length=64), dataset)
    batch = _batch(trainer)
    vocab = tag_vocab(trainer.processing_class)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width = batch["completion_ids"].size(1)
    trainer.model.eval()
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width)
        structure = isolated_inputs(ids, mask, ids.size(1) - width, vocab)
        logits = trainer.model(input_ids=ids, **structure).logits[:, -width - 1 : -1].float()
        plain = trainer.model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1].float()
    real = batch["completion_mask"].bool()
    grammar = Grammar(vocab, frozenset({trainer.processing_class.eos_token_id}), trainer.args.max_blocks, 2, 2)
    bans = torch.zeros((*real.shape, len(grammar.controlled)), dtype=torch.bool)
    for row, m in enumerate(real):
        bans[row, m] = grammar.masks(batch["completion_ids"][row, m].tolist())[0]
    target = batch["completion_ids"]
    expected, _ = masked_logps(logits, target, bans, grammar.controlled, temperature=1.0)
    causal, _ = masked_logps(plain, target, bans, grammar.controlled, temperature=1.0)
    torch.testing.assert_close(logps[real], expected[real], atol=1e-5, rtol=0)
    has_block = [bool(parse(row[m].tolist(), vocab).blocks) for row, m in zip(batch["completion_ids"], real)]
    assert any(has_block)
    assert (logps[real] - causal[real]).abs().max() > 1e-3  # and it is not the causal forward


def test_bad_settings_fail_at_start(tmp_path):
    with pytest.raises(ValueError, match="rollout_mode"):
        config(tmp_path, rollout_mode="tree")
    with pytest.raises(ValueError, match="sequential"):
        config(tmp_path, rollout_mode="sequential", attention="isolated")
    with pytest.raises(ValueError, match="attention='causal'"):
        config(tmp_path, rollout_mode="plain", attention="isolated")
    with pytest.raises(ValueError, match="sequential"):
        config(tmp_path, rollout_mode="sequential", attention="tree")
    with pytest.raises(ValueError, match="attention='causal'"):
        config(tmp_path, rollout_mode="plain", attention="tree")
    with pytest.raises(ValueError, match="min_paths"):
        config(tmp_path, min_paths=0, max_paths=0)
    with pytest.raises(ValueError, match="max_paths must be at least min_paths"):
        config(tmp_path, min_paths=3, max_paths=2)
    with pytest.raises(ValueError, match="ds3_gather_for_generation"):
        config(tmp_path, parallel_eval_steps=5, ds3_gather_for_generation=False)
    with pytest.raises(ValueError, match="name@k"):
        config(tmp_path, parallel_eval_steps=5, parallel_eval_benchmarks=["aime25"])


@pytest.mark.parametrize(
    "settings, warned",
    [
        (dict(vllm_importance_sampling_mode="sequence_mask", max_completion_length=3000), True),
        (dict(vllm_importance_sampling_mode="sequence_truncate", max_completion_length=512), True),
        (dict(vllm_importance_sampling_mode="sequence_mask", max_completion_length=128), False),  # short: harmless
        (dict(max_completion_length=3000), False),  # the default corrects per token
        (dict(vllm_importance_sampling_mode="token_mask", max_completion_length=3000), False),
        (dict(vllm_importance_sampling_mode="sequence_mask", max_completion_length=3000, use_vllm=False), False),
    ],
)
def test_a_sequence_level_correction_of_long_vllm_completions_is_warned(tmp_path, caplog, settings, warned):
    """TRL's default (sequence_mask) sums a completion's per-token gaps: long answers are dropped whole (trl #5814).
    Ours defaults to token_truncate and says so when a sequence mode meets long completions under vLLM."""
    settings = {"use_vllm": True, "max_path_tokens": 64, "max_summary_tokens": 32, **settings}
    with caplog.at_level("WARNING", logger="parallel_r1.configs"):
        args = config(tmp_path, **settings)
    assert ("per-token mode" in caplog.text) is warned
    assert args.vllm_importance_sampling_mode == settings.get("vllm_importance_sampling_mode", "token_truncate")


@pytest.mark.parametrize(
    "option",
    [
        dict(top_p=0.9),
        dict(top_k=20),
        dict(min_p=0.05),
        dict(repetition_penalty=1.1),
        dict(generation_kwargs={"seed": 1}),
        dict(vllm_structured_outputs_regex=r"\d+"),  # TRL applies it in its own generate only: silently ignored
    ],
)
def test_sampling_options_the_trainer_cannot_reproduce_are_refused(tmp_path, option):
    (name,) = option
    with pytest.raises(ValueError, match=f"^{name}=.*training forward"):
        config(tmp_path, **option)
    config(tmp_path, rollout_mode="plain", attention="causal", **option)  # TRL's own generation: TRL's business


def test_rewards_score_the_tag_ids_not_text_that_spells_them(tmp_path, tag_prone_dir, dataset):
    """Through TRL's reward call: the same text, once with tag ids and once with the tags spelled in ordinary
    tokens, gets the parallel rewards only in the first case."""
    tokenizer = AutoTokenizer.from_pretrained(tag_prone_dir)
    rewards = get_reward_funcs(["tiered", "parallel", "well_formed"], tokenizer=tokenizer)
    trainer = tiny_grpo_trainer(tag_prone_dir, config(tmp_path), dataset, rewards)
    text = f"Add.{TAGS[0]}{TAGS[2]}2+3=5{TAGS[3]}{TAGS[2]}5{TAGS[3]}{TAGS[1]}\n{TAGS[4]}5{TAGS[5]}\nFinal Answer: 5"
    with_tags = tokenizer.encode(text, add_special_tokens=False)
    spelled = []
    for piece in _pieces(text):
        spelled += tokenizer.encode(piece, add_special_tokens=False)
    vocab = tag_vocab(tokenizer)
    assert any(i in vocab.tag_of for i in with_tags) and not any(i in vocab.tag_of for i in spelled)
    assert tokenizer.decode(with_tags) == tokenizer.decode(spelled) == text
    completions = [
        [{"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}]
        for ids in (with_tags, spelled)
    ]
    inputs = [{"prompt": build_prompt("Add 2 and 3."), "answer": "5"}] * 2
    rewards = trainer._calculate_rewards(inputs, [i["prompt"] for i in inputs], completions, [with_tags, spelled])
    tiered, parallel, well_formed = rewards.T.tolist()
    assert tiered == pytest.approx([1.2, 1.0]) and parallel == [1.0, 0.0] and well_formed == [1.0, 1.0]


def _pieces(text):
    """`text` cut inside every tag, so that no piece holds a whole tag."""
    for tag in TAGS:
        text = text.replace(tag, tag[:3] + "\0" + tag[3:])
    return text.split("\0")


def test_in_training_evaluation_logs_eval_metrics_and_leaves_training_alone(tmp_path, tag_prone_dir, dataset):
    """parallel_eval_steps: eval/<benchmark>/* metrics in the log, and the training run is the one it would be."""

    def run(**evaluation):
        trainer = tiny_grpo_trainer(tag_prone_dir, config(tmp_path, **evaluation), dataset)
        trainer.train()
        return trainer.state.log_history

    settings = dict(parallel_eval_steps=1, parallel_eval_benchmarks=["gsm8k@2", "amc23@2"], parallel_eval_problems=2)
    with_eval, without = run(**settings), run()
    logged = [entry for entry in with_eval if "eval/gsm8k/mean@2" in entry]
    assert len(logged) == 2
    for key in ("pass@2", "parallel_ratio", "format_valid", "block_position", "critical_over_total"):
        assert all(0.0 <= entry[f"eval/amc23/{key}"] <= 1.0 for entry in logged)
    for key in ("reward", "parallel/tokens_total", "loss"):
        assert [e[key] for e in with_eval if key in e] == [e[key] for e in without if key in e]


def test_a_tokenizer_without_tags_is_refused(tmp_path, dataset):
    from parallel_r1.testing.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer(with_tags=False)
    model = build_model(tokenizer)
    with pytest.raises(ValueError, match="<Parallel>"):
        ParallelGRPOTrainer(
            model=model,
            reward_funcs=[length_reward],
            args=config(tmp_path),
            processing_class=tokenizer,
            train_dataset=dataset,
        )


def test_resume_continues_the_step_and_the_reward_schedule(tmp_path, tag_prone_dir, dataset):
    schedule = "alternating(accuracy, tiered, window=2, a_steps=1)"  # b on even paper steps
    metric = "schedule/alternating(accuracy,tiered,window=2,a_steps=1)/uses_b"

    def run(max_steps, resume=None):
        args = config(tmp_path, max_steps=max_steps, save_strategy="steps", save_steps=1)
        rewards = get_reward_funcs([schedule, "parallel"]) + [length_reward]
        trainer = tiny_grpo_trainer(tag_prone_dir, args, dataset, rewards)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    first = run(2)  # "killed" after 2 steps, checkpoints at 1 and 2
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 2
    resumed = run(4, resume=str(checkpoint))
    assert resumed.state.global_step == 4
    before = [e[metric] for e in first.state.log_history if metric in e]
    after = [e[metric] for e in resumed.state.log_history if metric in e and e["step"] > 2]
    assert before == [0.0, 1.0] and after == [0.0, 1.0]  # steps 3 and 4 continue the 1-2 pattern


class _StopAt(TrainerCallback):
    """Ends training after `step` (its checkpoint saved): the in-process stand-in for a kill."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_a_resumed_run_samples_and_trains_as_the_unbroken_run(tmp_path, tag_prone_dir, dataset):
    """Stopped after checkpoint 2 and resumed, a run draws the same completions, gets the same rewards and ends
    with the same weights as the unbroken run: the engine's random stream is in the checkpoint."""

    def run(name, stop=None, resume=None):
        drawn = []

        def recording_reward(completions, completion_ids, **kwargs):
            drawn.append([list(ids) for ids in completion_ids])
            return length_reward(completions)

        args = config(tmp_path / name, max_steps=4, save_strategy="steps", save_steps=1)
        trainer = tiny_grpo_trainer(tag_prone_dir, args, dataset, [recording_reward])
        if stop:
            trainer.add_callback(_StopAt(stop))
        trainer.train(resume_from_checkpoint=resume)
        rewards = {e["step"]: e["reward"] for e in trainer.state.log_history if "reward" in e}
        return trainer, drawn, rewards

    unbroken, drawn, rewards = run("unbroken")
    stopped, first, _ = run("broken", stop=2)
    checkpoint = tmp_path / "broken" / "out" / "checkpoint-2"
    assert stopped.state.global_step == 2 and (checkpoint / "engine_rng_state_0.pth").is_file()
    resumed, second, resumed_rewards = run("broken", resume=str(checkpoint))
    assert resumed.state.global_step == 4
    assert first + second == drawn and first != second  # steps 3-4 are not steps 1-2 drawn again
    assert resumed_rewards == rewards and len(rewards) == 4  # steps 1-2 from the checkpoint's log, 3-4 anew
    weights = dict(resumed.model.named_parameters())
    for name, parameter in unbroken.model.named_parameters():
        assert torch.equal(parameter, weights[name]), name


@pytest.mark.slow
def test_accelerate_launch_runs_the_tiny_recipe(tmp_path, tag_prone_dir):
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "grpo"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu.yaml"]
    command += ["--num_cpu_threads_per_process", "1", "scripts/grpo.py", "--config", "recipes/tiny/grpo.yaml"]
    command += ["--model_name_or_path", str(tag_prone_dir), "--output_dir", str(out), "--max_steps", "2"]
    command += ["--per_device_train_batch_size", "4", "--max_completion_length", "64", "--max_train_samples", "8"]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert "parallel/ratio" in log and "schedule/alternating" in log
    assert (out / "model.safetensors").exists()
    saved, given = (tag_vocab(AutoTokenizer.from_pretrained(d)).ids for d in (out, tag_prone_dir))
    assert saved == given


def _tiny_grpo(out, *flags) -> list:
    """The tiny recipe under `accelerate launch`, 4 steps with a checkpoint at each."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu.yaml"]
    command += ["--num_cpu_threads_per_process", "1", "scripts/grpo.py", "--config", "recipes/tiny/grpo.yaml"]
    command += ["--output_dir", str(out), "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "1"]
    command += ["--per_device_train_batch_size", "4", "--max_completion_length", "48", "--max_train_samples", "8"]
    return command + ["--max_path_tokens", "12", "--max_summary_tokens", "6", *flags]


def _saved_step(checkpoint):
    """The global step in a checkpoint's trainer_state.json (written last), or None while it is not there."""
    try:
        return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@pytest.mark.slow
def test_a_run_killed_after_checkpoint_2_resumes_as_the_unbroken_run(tmp_path, tag_prone_dir):
    """SIGKILL after checkpoint 2, then `--resume_from_checkpoint true`: the same rewards from step 3 on and the
    same final weights as a run never killed (run beside it: each launch keeps one thread)."""
    model = ["--model_name_or_path", str(tag_prone_dir)]
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    with ExitStack() as stack:  # neither launch outlives a failed assertion
        reference = stack.enter_context(Launch(_tiny_grpo(unbroken, *model), tmp_path / "unbroken.log"))
        victim = stack.enter_context(Launch(_tiny_grpo(broken, *model), tmp_path / "broken.log"))
        reference.timeout = victim.timeout = 900
        victim.kill_when(lambda: _saved_step(broken / "checkpoint-2") == 2, "checkpoint 2 with its trainer state")
        assert victim.process.returncode == -signal.SIGKILL
        assert not (broken / "model.safetensors").exists()  # killed before the end (in step 3, or later when slow)
        succeeded(reference)
    with Launch(_tiny_grpo(broken, *model, "--resume_from_checkpoint", "true"), tmp_path / "resumed.log") as resumed:
        resumed.timeout = 900
        succeeded(resumed)
    logs = [json.loads((out / "trainer_state.json").read_text())["log_history"] for out in (unbroken, broken)]
    rewards = [{e["step"]: e["reward"] for e in log if "reward" in e and e["step"] > 2} for log in logs]
    assert rewards[0] == rewards[1] and sorted(rewards[0]) == [3, 4]
    weights = [load_file(out / "model.safetensors") for out in (unbroken, broken)]
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name


def test_max_prompt_length_drops_exactly_the_longer_templated_prompts(tiny_dir, tiny_tokenizer):
    import runpy

    from parallel_r1.configs import grpo_parser
    from parallel_r1.data import DataArguments, load_problems, prompt_ids

    root = Path(__file__).resolve().parents[1]
    load_split = runpy.run_path(str(root / "scripts" / "grpo.py"))["load_split"]
    lengths = [
        len(prompt_ids(tiny_tokenizer, row["prompt"]))
        for row in load_problems(DataArguments(dataset_name="gsm8k"), limit=8)
    ]
    limit = sorted(lengths)[4]
    flags = ["--config", "recipes/tiny/grpo.yaml", "--max_train_samples", "8", "--max_prompt_length", str(limit)]
    script_args, training_args, _ = grpo_parser().parse_args_and_config(flags)
    kept = load_split(script_args, training_args, tiny_tokenizer, "train")
    assert len(kept) == sum(n <= limit for n in lengths) < 8


def test_the_share_of_importance_weights_the_correction_changed_is_logged(tmp_path, tag_prone_dir, dataset):
    trainer = tiny_grpo_trainer(tag_prone_dir, config(tmp_path), dataset)
    completion_mask = torch.ones(4, 3, dtype=torch.long)
    tool_mask = torch.tensor([[0, 1, 1]] * 4)  # the first token of each was inserted by the runtime
    output = {"completion_mask": completion_mask, "tool_mask": tool_mask}
    trainer.args.vllm_importance_sampling_mode = "sequence_mask"
    trainer._log_clipped({**output, "importance_sampling_ratio": torch.tensor([[0.0], [1.2], [0.0], [0.9]])}, "train")
    trainer.args.vllm_importance_sampling_mode = "token_truncate"
    trainer.args.vllm_importance_sampling_clip_max = None  # documented by TRL: no upper bound (once a TypeError here)
    ratio = torch.tensor([[9.0, 3.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.5, 3.0], [1.0, 1.0, 1.0]])
    trainer._log_clipped({**output, "importance_sampling_ratio": ratio}, "train")
    # 2 of 4 completions dropped; with no bound no weight is held
    assert trainer._metrics["train"]["sampling/importance_weights_clipped"] == [0.5, 0.0]


SAMPLED_TOKEN_RATIOS = torch.tensor([[9.0, 4.0, 1.0], [1.0, 0.1, 1.0], [1.0, 0.5, 2.0], [1.0, 1.0, 1.0]])
COMPLETION_RATIOS = torch.tensor([[2.0], [0.1], [5.0], [1.0]])


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min", [None, 0.2])
@pytest.mark.parametrize("clip_max", [3.0, None])  # TRL documents None: no upper bound
def test_every_documented_importance_sampling_setting_is_counted_as_trl_applies_it(mode, clip_min, clip_max):
    """The weights TRL's correction changes, counted for each mode and bound TRL documents (a bound of None is no
    bound: `clip_max: null` once raised a TypeError at the first vLLM step)."""
    from parallel_r1.trainers.grpo import corrected_weights

    mask = torch.tensor([[0, 1, 1]] * 4)  # the 9.0 was inserted by the runtime
    level = mode.split("_")[0]
    raw = COMPLETION_RATIOS if level == "sequence" else SAMPLED_TOKEN_RATIOS
    low, high = -math.inf if clip_min is None else clip_min, math.inf if clip_max is None else clip_max
    if mode.endswith("truncate") and clip_min is None and clip_max is None:
        # torch.clamp needs a bound: TRL's config refuses the pair at start
        with pytest.raises(ValueError, match="must be set when `vllm_importance_sampling_mode` is a `\\*_truncate`"):
            tiny_grpo_config(
                "unused", use_vllm=True, vllm_importance_sampling_mode=mode,
                vllm_importance_sampling_clip_max=clip_max, vllm_importance_sampling_clip_min=clip_min,
            )  # fmt: skip
        return
    if mode.endswith("truncate"):  # as TRL: torch.clamp(ratio, min=clip_min, max=clip_max)
        ratio = torch.clamp(raw, min=clip_min, max=clip_max)
    else:  # as TRL: the ratios outside [clip_min, clip_max] set to 0
        ratio = raw.masked_fill((raw < low) | (raw > high), 0.0)
    changed, total = corrected_weights(ratio, mask, mode, clip_min, clip_max)
    assert total == (4 if level == "sequence" else 8)
    # by hand: sampled tokens 4.0 1.0 0.1 1.0 0.5 2.0 1.0 1.0 (0.1 under 0.2, 4.0 over 3.0); completions 2.0 0.1 5.0 1.0
    assert changed == (clip_min is not None) + (clip_max is not None)


def test_a_tensor_parallel_group_shares_back_what_each_process_sent_and_meets_first_with_peft(monkeypatch):
    """The group's prompts as each process sent them (the processes may hold different numbers: an eval batch),
    each given back its own share; with a PEFT model the group first meets at a barrier, as TRL does before vLLM's
    collectives (trl #3671). The group's collectives are simulated here: process 1 of 2, process 0 sent three."""
    from types import SimpleNamespace

    from parallel_r1.trainers import colocated_vllm

    shares, calls = [[[1], [2], [3]], [[4, 5]]], []
    monkeypatch.setattr(
        torch.distributed, "all_gather_object", lambda out, mine, group: out.__setitem__(slice(None), shares)
    )
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group: 1)
    monkeypatch.setattr(torch.distributed, "barrier", lambda device_ids=None: calls.append("barrier"))
    for peft in (False, True):
        monkeypatch.setattr(colocated_vllm, "is_peft_model", lambda model, peft=peft: peft)
        generation = SimpleNamespace(tensor_parallel_size=2, tp_group="group", enable_sleep_mode=False, model=None)
        generation.accelerator = SimpleNamespace(local_process_index=1)

        def decode(prompts):
            calls.append("decode")
            return [p + [0] for p in prompts]

        calls.clear()
        assert colocated_vllm.colocated_rollouts(generation, [[4, 5]], decode) == [[4, 5, 0]]
        assert calls == (["barrier", "decode"] if peft else ["decode"])  # the barrier last before decoding


def test_a_failure_of_the_main_process_in_server_mode_is_raised_on_every_process(monkeypatch):
    """In server mode the main process decodes for all and broadcasts; a failure there (an HTTP error, a banned id
    returned) is broadcast and raised on every process, which would otherwise wait for an answer until the process
    group's timeout. The broadcast is simulated here."""
    from types import SimpleNamespace

    from parallel_r1.trainers import grpo

    def failing(backend, prompts, progress):
        raise RuntimeError("server gone")

    def trainer(main: bool):
        return SimpleNamespace(
            accelerator=SimpleNamespace(is_main_process=main, process_index=0 if main else 1),
            policy=SimpleNamespace(rollouts=failing, ban_words=dict, backend=lambda *a, **k: None),
            vllm_generation=SimpleNamespace(vllm_client=None),
            args=SimpleNamespace(min_paths=2, rollout_mode="fork", generation_batch_size=8),
            _sampler=lambda build: None, _sampling=lambda: None, _bar=False,
        )  # fmt: skip

    monkeypatch.setattr(grpo, "gather_object", lambda objects: [[[1]], [[2]]])
    sent = []
    monkeypatch.setattr(grpo, "broadcast_object_list", lambda payload, from_process: sent.append(payload[0]))
    with pytest.raises(RuntimeError, match="server gone"):
        ParallelGRPOTrainer._rollouts_on_main_process(trainer(main=True), [[1]])
    assert len(sent) == 1 and isinstance(sent[0], RuntimeError)  # the failure went to the others first
    monkeypatch.setattr(
        grpo,
        "broadcast_object_list",
        lambda payload, from_process: payload.__setitem__(0, RuntimeError("server gone")),
    )
    with pytest.raises(RuntimeError, match="the main process's rollouts failed: RuntimeError\\('server gone'\\)"):
        ParallelGRPOTrainer._rollouts_on_main_process(trainer(main=False), [[2]])


def test_server_rollouts_are_sized_to_a_generation_and_shared_back_by_what_each_process_sent(monkeypatch):
    """The main process decodes every process's prompts with a request in flight for each segment a generation can
    decode at once (TRL's generation batch times min_paths, up to MAX_REQUESTS_IN_FLIGHT), and each process gets the
    rollouts of the prompts it sent, however many (the gather and broadcast are simulated: process 1 of 2)."""
    from types import SimpleNamespace

    from parallel_r1.rollout.vllm_backend import MAX_REQUESTS_IN_FLIGHT
    from parallel_r1.trainers import grpo

    built = []
    monkeypatch.setattr(grpo, "gather_object", lambda objects: [[[1], [2], [3]], [[4]]])
    monkeypatch.setattr(grpo, "broadcast_object_list", lambda payload, from_process: None)
    for batch, expected in ((8, 16), (4096, MAX_REQUESTS_IN_FLIGHT)):
        trainer = SimpleNamespace(
            accelerator=SimpleNamespace(is_main_process=True, process_index=1),
            policy=SimpleNamespace(
                rollouts=lambda backend, prompts, progress: [p + [9] for p in prompts], ban_words=dict,
                backend=lambda *a, **k: built.append(k["max_concurrent_requests"]),
            ),
            vllm_generation=SimpleNamespace(vllm_client=None),
            args=SimpleNamespace(min_paths=2, rollout_mode="fork", generation_batch_size=batch),
            _sampler=lambda build: build(), _sampling=lambda: None, _bar=False,
        )  # fmt: skip
        assert ParallelGRPOTrainer._rollouts_on_main_process(trainer, [[4]]) == [[4, 9]]
        assert built[-1] == expected


def test_the_colocated_engine_gets_a_seat_for_each_path_up_to_what_trl_lets_a_step_read(monkeypatch):
    """room_for_paths scales the max_num_seqs TRL gives VLLMGeneration by min_paths, capped at TRL's 4,096 tokens a
    step (vLLM refuses more seats than that), and puts TRL's VLLMGeneration back afterwards."""
    from trl.trainer import grpo_trainer

    from parallel_r1.rollout.arguments import RolloutArguments
    from parallel_r1.trainers.colocated_vllm import room_for_paths

    seats = []
    monkeypatch.setattr(grpo_trainer, "VLLMGeneration", lambda *a, max_num_seqs=None, **k: seats.append(max_num_seqs))
    trls = grpo_trainer.VLLMGeneration
    with room_for_paths(RolloutArguments(min_paths=3, max_paths=3)):
        for trl_size in (8, 2048, None):
            grpo_trainer.VLLMGeneration(max_num_seqs=trl_size)
    assert seats == [24, 4096, None] and grpo_trainer.VLLMGeneration is trls


def test_a_generation_shows_its_progress_and_its_completions_table_once(
    tmp_path, tag_prone_dir, dataset, monkeypatch, capfd, caplog
):
    """The start says what a generation samples; the rollouts' bar moves inside it (one tick a completion); a
    generation trained for two steps prints, writes and sends its completions table once, not at both steps."""
    import trl.trainer.grpo_trainer as trl_grpo

    printed = []
    monkeypatch.setattr(trl_grpo, "is_rich_available", lambda: True)
    monkeypatch.setattr(trl_grpo, "print_prompt_completions_sample", lambda *a, **k: printed.append(a[4]))
    args = config(tmp_path, steps_per_generation=2, max_steps=4, log_completions=True)
    with caplog.at_level("INFO", logger="parallel_r1.trainers.grpo"):
        trainer = tiny_grpo_trainer(tag_prone_dir, args, dataset)
    assert (
        "each generation samples 8 completions (2 prompts x 4, fork rollouts, at most 48 tokens each) over 1 "
        "process(es), and 2 optimizer step(s) train on them" in caplog.text
    )
    capfd.readouterr()
    trainer.train()
    err = capfd.readouterr().err
    ticks = re.findall(r"rollouts:\s+\d+%\|[^|]*\| (\d+)/(\d+)", err)  # a generation's completions, done of due
    assert {due for _, due in ticks} == {"8"} and any(0 < int(done) < 8 for done, _ in ticks)  # it moves inside
    assert printed == [1, 3]  # steps 1 and 3 start a generation; 2 and 4 train on the same completions
    tables = sorted(p.name for p in (Path(args.output_dir) / "completions").glob("*.parquet"))
    assert tables == ["completions_00001.parquet", "completions_00003.parquet"]
    pages = sorted(p.name for p in (Path(args.output_dir) / "completions").glob("*.html"))  # a viewer beside each
    assert pages == ["completions_00001.html", "completions_00003.html"]
