"""The policy object: one home for the tags, the grammar, the backends, the rollouts, the training forward and the
shape of completions, used the same way by training and evaluation."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from parallel_r1.data import build_prompt
from parallel_r1.data.prompts import PROMPT_MARKER
from parallel_r1.evaluation.metrics import benchmark_metrics
from parallel_r1.evaluation.records import score
from parallel_r1.policy import ParallelPolicy, shape_metrics
from parallel_r1.rollout import Rollout, RolloutArguments, Sampling
from parallel_r1.rollout.arguments import BackendArguments, ParallelArguments, SampledRolloutArguments, exact_rollout
from parallel_r1.structure import IsolatedForward, TreeForward
from parallel_r1.tags.grammar import GrammarForward
from parallel_r1.testing.tiny_grpo import arithmetic_dataset, tiny_grpo_config, tiny_grpo_trainer
from parallel_r1.trainers import ParallelGRPOTrainer

PROBLEM = {"benchmark": "b", "problem_index": 0, "problem_id": "0", "prompt": "p", "reference": "7"}


def completions(tokenizer) -> dict:
    """Hand-written completions as ids: two blocks of 2 and 3 paths, one plain text, one cut inside a block."""
    tag = ParallelPolicy(tokenizer, RolloutArguments()).vocab.ids
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731

    def block(*paths: str) -> list:
        ids = [tag["<Parallel>"]]
        for path in paths:
            ids += [tag["<Path>"], *encode(path), tag["</Path>"]]
        return ids + [tag["</Parallel>"], *encode("\n"), tag["<Summary>"], *encode(" ok"), tag["</Summary>"]]

    return {
        "blocks": encode("Think.") + block(" two", " three and four") + block(" a b", " a c", " d") + encode(" 7"),
        "plain": encode("Just add. Final Answer: 7"),
        "cut": encode("Hmm") + [tag["<Parallel>"], tag["<Path>"], *encode(" two"), tag["</Path>"]],
    }


def logged_shapes(policy, ids: list, attention: str = "isolated") -> dict:
    """What the GRPO trainer logs under parallel/ for these completions (its own `_log_shapes`, one process)."""
    trainer = SimpleNamespace(
        policy=policy, _metrics={"train": defaultdict(list)}, args=SimpleNamespace(attention=attention)
    )
    ParallelGRPOTrainer._log_shapes(trainer, ids, [policy.shape(row) for row in ids], "train")
    return {name: values[0] for name, values in trainer._metrics["train"].items()}


@pytest.mark.parametrize("chosen", [["blocks", "plain", "cut"], ["plain"], ["cut"]])
def test_training_logs_the_shape_the_evaluation_tables_show(tiny_tokenizer, chosen):
    """One function measures both: every shape number of an evaluation is logged in training under parallel/ (the
    parallel ratio as parallel/ratio), with the same value, completions without any block included."""
    policy = ParallelPolicy(tiny_tokenizer, RolloutArguments())
    ids = [completions(tiny_tokenizer)[name] for name in chosen]
    records = [score(PROBLEM, s, Rollout([], row, finish="eos"), policy) for s, row in enumerate(ids)]
    evaluated = {k: v for k, v in benchmark_metrics(records).items() if k in shape_metrics(records)}
    logged = logged_shapes(policy, ids)
    assert len(evaluated) == 12
    for name, value in evaluated.items():
        assert logged[f"parallel/{name.removeprefix('parallel_')}"] == pytest.approx(value), name


def test_shape_metrics_of_completions_without_a_closed_block(tiny_tokenizer):
    """No block: every per-block number is 0 (not -1), D/T is 1; self-BLEU reads closed blocks only."""
    policy = ParallelPolicy(tiny_tokenizer, RolloutArguments())
    plain = shape_metrics([policy.shape(completions(tiny_tokenizer)["plain"])])
    assert plain["paths_per_block_min"] == plain["paths_per_block_max"] == plain["paths_per_block"] == 0
    assert plain["self_bleu"] == plain["openings_alike"] == plain["block_position"] == 0.0
    assert plain["critical_over_total"] == 1.0
    cut = policy.shape(completions(tiny_tokenizer)["cut"])
    assert cut["blocks"] == 1 and cut["self_bleu"] is None
    both = shape_metrics([cut, policy.shape(completions(tiny_tokenizer)["blocks"])])
    assert (both["paths_per_block_min"], both["paths_per_block_max"]) == (1, 3)
    assert both["self_bleu"] == policy.shape(completions(tiny_tokenizer)["blocks"])["self_bleu"] > 0
    with pytest.raises(ValueError, match="no completions"):
        shape_metrics([])


def test_the_training_forward_is_the_runs_structure_under_the_grammar(tiny_tokenizer):
    model = torch.nn.Identity()
    for attention, structure in (("isolated", IsolatedForward), ("tree", TreeForward)):
        policy = ParallelPolicy(tiny_tokenizer, SampledRolloutArguments(attention=attention, temperature=0.7))
        scored = policy.training_forward(model, 5, sampled=True)
        assert isinstance(scored, GrammarForward) and isinstance(scored.model, structure)
        assert scored.temperature == policy.sampling(0).temperature == 0.7  # drawn and scored at one temperature
        assert isinstance(policy.training_forward(model, 5), structure)  # SFT: no grammar
    causal = ParallelPolicy(tiny_tokenizer, SampledRolloutArguments(attention="causal", rollout_mode="sequential"))
    assert causal.training_forward(model, 5, sampled=True).model is model
    plain = ParallelPolicy(tiny_tokenizer, SampledRolloutArguments(attention="causal", rollout_mode="plain"))
    assert plain.grammar is None and plain.training_forward(model, 5, sampled=True) is model
    sft = ParallelPolicy(tiny_tokenizer, ParallelArguments(attention="tree"))
    assert sft.grammar is None and isinstance(sft.training_forward(model, torch.tensor([3, 4])), TreeForward)
    with pytest.raises(ValueError, match="ParallelArguments sets no temperature"):
        sft.sampling(0)


def test_the_policy_owns_what_is_sampled_the_engine_its_grammar_and_grpo_its_sampling(tmp_path, tag_prone_dir):
    """One home: the engine samples under the policy's grammar object, and GRPO's sampler and its log-prob
    forward both read the policy's temperature."""
    trainer = tiny_grpo_trainer(tag_prone_dir, tiny_grpo_config(tmp_path, temperature=0.6), arithmetic_dataset())
    policy = trainer.policy
    assert policy.engine(policy.backend(Sampling(), model=trainer.model)).grammar is policy.grammar
    assert trainer._sampling().temperature == 0.6
    assert trainer.policy.training_forward(trainer.model, 5, sampled=True).temperature == 0.6
    assert trainer._sampling().seed == trainer.args.seed + trainer.accelerator.process_index


def test_a_policy_that_samples_with_the_engine_needs_the_tags():
    from parallel_r1.testing.tiny import build_tokenizer

    bare = build_tokenizer(with_tags=False)
    with pytest.raises(ValueError, match="<Parallel>"):
        ParallelPolicy(bare, RolloutArguments())
    plain = ParallelPolicy(bare, RolloutArguments(attention="causal", rollout_mode="plain"))
    assert plain.vocab is None and plain.shape(bare.encode("1 + 2"))["blocks"] == 0


def test_a_backend_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        ParallelPolicy.backend(Sampling())
    with pytest.raises(ValueError, match="exactly one"):
        ParallelPolicy.backend(Sampling(), model=torch.nn.Linear(1, 1), llm=object())
    with pytest.raises(ValueError, match="backend must be one of"):
        BackendArguments(backend="sglang")


def test_sft_records_the_rollout_that_samples_its_structure_exactly():
    assert exact_rollout(ParallelArguments(attention="causal")).rollout_mode == "sequential"
    for attention in ("isolated", "tree"):
        settings = exact_rollout(ParallelArguments(attention=attention, min_paths=2, max_paths=4))
        assert (settings.rollout_mode, settings.attention, settings.max_paths) == ("fork", attention, 4)


def test_in_training_evaluation_prompts_with_the_runs_template(tmp_path, tag_prone_dir):
    """The callback's problems are written in the run's `prompt_template` (it used to be `parallel` always)."""
    from parallel_r1.evaluation.callback import InTrainingEvaluation

    args = tiny_grpo_config(
        tmp_path, prompt_template="plain", parallel_eval_steps=1, parallel_eval_benchmarks=["gsm8k@1"],
        parallel_eval_problems=2,
    )  # fmt: skip
    trainer = tiny_grpo_trainer(tag_prone_dir, args, arithmetic_dataset())
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, InTrainingEvaluation)]
    prompts = list(callback.prompts.values())
    assert len(prompts) == 2
    for prompt in prompts:
        instruction, marker, problem = prompt[-1]["content"].rpartition(PROMPT_MARKER)
        assert marker and prompt == build_prompt(problem, "plain") != build_prompt(problem, "parallel")


def test_records_written_before_self_bleu_was_kept_read_as_not_measured(tiny_tokenizer):
    """An evaluation folder from an older version resumes: its records lack `self_bleu`, which is then None (not
    measured), never a mean over the newer records alone; the table shows it as '-'."""
    from parallel_r1.evaluation.report import shape_table

    policy = ParallelPolicy(tiny_tokenizer, RolloutArguments())
    new = policy.shape(completions(tiny_tokenizer)["blocks"])
    old = {k: v for k, v in new.items() if k not in ("self_bleu", "alike_blocks")}
    assert shape_metrics([new])["self_bleu"] > 0 and shape_metrics([old, new])["self_bleu"] is None
    assert shape_metrics([old])["openings_alike"] == 0.0
    row = {"label": "m", "benchmarks": {"b": {**shape_metrics([old, new]), "cons@1": 1.0, "samples": 1}}}
    assert "| - |" in shape_table([row])


def test_a_reward_name_is_registered_once():
    from parallel_r1.rewards import REWARDS
    from parallel_r1.rewards.variants import reward

    def accuracy(c):
        return 0.0

    before = REWARDS["accuracy"]
    with pytest.raises(ValueError, match="registered already"):
        reward(0.0, 1.0)(accuracy)
    assert REWARDS["accuracy"] is before


def test_the_texts_a_server_bans_read_back_as_the_banned_ids_and_no_other(tiny_tokenizer):
    """A vLLM server takes bans as bad_words, texts it tokenizes back: each of the grammar's ids (six tags and the
    EOS ids) gives its text, and an id whose text does not read back as that one id is refused at start."""
    eos = {tiny_tokenizer.eos_token_id}
    policy = ParallelPolicy(tiny_tokenizer, RolloutArguments(), eos)
    words = policy.ban_words()
    assert set(words) == set(policy.grammar.controlled) and len(words) == 7
    for token, text in words.items():
        assert tiny_tokenizer.encode(text, add_special_tokens=False) == [token]
    assert ParallelPolicy(tiny_tokenizer, RolloutArguments(attention="causal", rollout_mode="plain")).ban_words() == {}
    # an end id whose text splits differently (a byte of a longer character): it could not be banned by its text
    split = next(
        i for i in range(len(tiny_tokenizer))
        if tiny_tokenizer.encode(tiny_tokenizer.decode([i]), add_special_tokens=False) != [i]
    )  # fmt: skip
    with pytest.raises(ValueError, match=f"id {split} .* cannot be banned on a vLLM server"):
        ParallelPolicy(tiny_tokenizer, RolloutArguments(), eos | {split}).ban_words()


def test_a_banned_id_that_a_server_returns_stops_the_rollout():
    """A server that ignored the bans (a vLLM without bad_words) would hand back tokens the training forward
    scores as impossible: the backend stops with an error rather than train on them."""
    import requests

    from parallel_r1.rollout.backend import Segment
    from parallel_r1.rollout.vllm_backend import VLLMBackend

    class Ignoring:
        session = requests.Session()

        def generate(self, prompts, n, generation_kwargs, max_tokens, **fixed):
            return {"completion_ids": [[7, 9]], "logprobs": [[[-1.0], [-1.0]]]}

    backend = VLLMBackend(client=Ignoring(), sampling=Sampling(), ban_words={9: "<Parallel>"})
    (stream,) = backend.start([[1, 2]], seeds=[0])
    backend.submit([Segment(stream, max_new=4, banned=frozenset({9}))])
    with pytest.raises(RuntimeError, match=r"sampled the banned id\(s\) \[9\]: the server did not apply"):
        while not backend.step():
            pass
