"""The tree variant: what a serving engine samples in fork mode, and the forward that trains exactly that."""

import pytest
import torch
from rollout_helpers import engine, prompts, trainer_logprobs

from parallel_r1.rollout.arguments import ParallelArguments
from parallel_r1.structure import TreeForward, tree_mask, tree_row
from parallel_r1.tags.language import (
    PARALLEL_CLOSE,
    PARALLEL_OPEN,
    PATH_CLOSE,
    PATH_OPEN,
    SUMMARY_CLOSE,
    SUMMARY_OPEN,
    parse,
)

FIXED = ParallelArguments()  # 2 paths a block
CHOSEN = ParallelArguments(min_paths=2, max_paths=4)


def test_the_layout_copies_every_later_path_at_the_positions_it_was_sampled_at(tag_prone):
    _, _, tokenizer, vocab = tag_prone
    tag = vocab.ids
    a, b, c, x, y = tokenizer.convert_tokens_to_ids(["a", "b", "c", "x", "y"])
    prompt = [x, y]
    completion = [a, tag[PARALLEL_OPEN], tag[PATH_OPEN], b, tag[PATH_CLOSE], tag[PATH_OPEN], c, c, tag[PATH_CLOSE],
                  tag[PATH_OPEN], a, tag[PATH_CLOSE], tag[PARALLEL_CLOSE], tag[SUMMARY_OPEN], b, tag[SUMMARY_CLOSE]]  # fmt: skip
    row = tree_row(prompt + completion, len(prompt), vocab, FIXED)
    opener = 3  # x y a <Parallel>
    second, third = range(7, 11), range(11, 14)  # in-line columns of the 2nd and 3rd paths
    assert row.ids[18:] == [row.ids[i] for i in [*second, *third]]  # the copies, after the row as written
    assert row.positions[18:22] == list(range(opener + 1, opener + 5)) == row.positions[4:8]  # as the 1st path's
    assert row.positions[22:] == list(range(opener + 1, opener + 4))  # every copy restarts after <Parallel>
    assert row.copy[:18] == [-1] * 18 and row.copy[18:] == [0] * 4 + [1] * 3
    # the first token of each later path is predicted from <Parallel>, the others from their copy
    assert row.source[6] == opener and row.source[7:10] == [18, 19, 20]
    assert row.source[10] == opener and row.source[11:13] == [22, 23]
    assert row.source[15] == 15 and row.source[4] == 4  # the summary and the first path: the row itself
    mask = tree_mask([row], len(row.ids), "cpu")[0, 0]
    assert mask[19, : opener + 1].all() and not mask[19, opener + 1 : 18].any()  # the context, not the paths
    assert mask[19, 18:20].all() and not mask[19, 20:].any()
    assert not mask[22, 18:22].any()  # the third path's copy does not see the second's
    assert mask[17, :18].all() and not mask[17, 18:].any()  # the summary reads the paths as written


@pytest.mark.parametrize("num_paths", [2, 3, 4])
@pytest.mark.parametrize("limits", [{}, {"max_blocks": 1}, {"max_completion_length": 40}])
def test_the_sampler_is_the_trainer_on_every_sampled_token(tag_prone, num_paths, limits):
    """K paths, several blocks, the block limit reached, completions cut: the engine's fork sampling (paths from
    the context alone, the summary over a causal re-reading) is what the tree forward scores, to float32 noise."""
    _, _, tokenizer, _ = tag_prone
    rollouts = engine(
        tag_prone, attention="tree", min_paths=num_paths, max_paths=num_paths, seed=num_paths, **limits
    ).generate(prompts(tokenizer))
    assert any(r.blocks for r in rollouts)
    if "max_blocks" in limits:
        assert any(r.blocks == 1 for r in rollouts)  # the limit was reached: <Parallel> banned afterwards
    if "max_completion_length" in limits:
        assert any(r.finish == "length" for r in rollouts)  # cut by the cap
    for r in rollouts:
        sampled = torch.tensor(r.env_mask).bool()
        tree = trainer_logprobs(tag_prone, r, "tree", max_blocks=limits.get("max_blocks", 4))
        torch.testing.assert_close(tree[sampled], torch.tensor(r.logprobs)[sampled], atol=1e-5, rtol=0)


def test_a_padded_batch_scores_as_its_rows_do(tag_prone):
    """As TRL batches: prompts left-padded, completions right-padded, one completion start for all rows."""
    from parallel_r1.tags.grammar import Grammar, GrammarForward

    _, model, tokenizer, vocab = tag_prone
    rollouts = engine(tag_prone, attention="tree", min_paths=3, max_paths=3, seed=3).generate(prompts(tokenizer))
    prompt_width = max(len(r.prompt_ids) for r in rollouts)
    completion_width = max(len(r.completion_ids) for r in rollouts)
    pad = tokenizer.pad_token_id
    ids, mask = [], []
    for r in rollouts:
        left, right = prompt_width - len(r.prompt_ids), completion_width - len(r.completion_ids)
        ids.append([pad] * left + r.prompt_ids + r.completion_ids + [pad] * right)
        mask.append([0] * left + [1] * (len(r.prompt_ids) + len(r.completion_ids)) + [0] * right)
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    rule = Grammar(vocab, frozenset({tokenizer.eos_token_id}), 4, 2, 2)
    with torch.no_grad():
        batch = GrammarForward(TreeForward(model, vocab, prompt_width, FIXED), rule, prompt_width, 1.0)(
            ids, mask
        ).log_probs
    for row, r in zip(batch, rollouts):
        sampled = torch.tensor(r.env_mask).bool()
        alone = trainer_logprobs(tag_prone, r, "tree")
        torch.testing.assert_close(row[: len(r.completion_ids)][sampled], alone[sampled], atol=1e-5, rtol=0)
        torch.testing.assert_close(alone[sampled], torch.tensor(r.logprobs)[sampled], atol=1e-5, rtol=0)
    assert sum(r.blocks for r in rollouts) > 1 and len({len(r.prompt_ids) for r in rollouts}) > 1


def test_the_causal_forward_would_not_be_exact(tag_prone):
    """Why the variant exists: scoring fork rollouts causally lets later paths see earlier ones."""
    _, _, tokenizer, _ = tag_prone
    rollouts = engine(tag_prone, attention="tree", min_paths=3, max_paths=3, seed=3).generate(prompts(tokenizer))
    gaps = [(trainer_logprobs(tag_prone, r, "causal") - torch.tensor(r.logprobs)).abs().max() for r in rollouts]
    assert max(gaps) > 0.1


def test_a_later_path_is_scored_without_the_earlier_ones(tag_prone):
    """Changing the first path of a block changes no log-prob of its other paths, and does change the summary's."""
    _, model, tokenizer, vocab = tag_prone
    rollout = next(r for r in engine(tag_prone, attention="tree", seed=5).generate(prompts(tokenizer)) if r.blocks)
    start = len(rollout.prompt_ids)
    ids = rollout.prompt_ids + rollout.completion_ids
    block = parse(rollout.completion_ids, vocab).blocks[0]
    first, later = block.paths[0], block.paths[1:]
    body = range(start + first.open_at + 1, start + first.open_at + 1 + len(first.body))
    changed = list(ids)
    for i in body:
        changed[i] = tokenizer.convert_tokens_to_ids("z")
    assert changed != ids

    def logps(sequence):  # log-prob of token i at index i - 1
        tensor = torch.tensor([sequence])
        with torch.no_grad():
            logits = TreeForward(model, vocab, start, FIXED)(tensor, torch.ones_like(tensor)).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, tensor[0, 1:, None]).squeeze(-1)

    before, after = logps(ids), logps(changed)
    scored = torch.tensor([start + i - 1 for path in later for i in range(path.start, path.end)])
    assert torch.equal(before[scored], after[scored])
    after_paths = start + block.paths_end - 1  # </Parallel> on: they read the paths as written
    assert not torch.allclose(before[after_paths:], after[after_paths:])


def test_sft_trains_the_tree_policy(tiny_dir, tmp_path):
    """The cold start trains what RL samples: SFT's loss with attention='tree' is the mean of -log p over the
    completion tokens under the tree forward, and a step runs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parallel_r1.configs import ParallelSFTConfig
    from parallel_r1.data import SFTDataArguments, load_sft_traces
    from parallel_r1.trainers import ParallelSFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype="float32")
    args = ParallelSFTConfig(output_dir=str(tmp_path), attention="tree", per_device_train_batch_size=2, max_steps=1,
                             max_length=1400, report_to=[], use_cpu=True, bf16=False, save_strategy="no")  # fmt: skip
    traces = load_sft_traces(SFTDataArguments(dataset_name="parallel_gsm8k_sample"), limit=2)
    trainer = ParallelSFTTrainer(model, args, processing_class=tokenizer, train_dataset=traces)
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
        labels = batch["labels"]
        starts = (labels != -100).int().argmax(-1)
        logits = TreeForward(model, trainer.policy.vocab, starts, FIXED)(
            batch["input_ids"], batch["attention_mask"]
        ).logits
    logps = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0]
    in_loss = labels[:, 1:] != -100
    torch.testing.assert_close(loss, -(logps * in_loss).sum() / in_loss.sum(), atol=1e-5, rtol=1e-5)
    assert any(parse(t[0]["content"]).blocks for t in traces["completion"])  # there were paths to copy
    trainer.train()
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


def test_the_tree_forward_reaches_the_head_through_a_distributed_wrapper(tag_prone):
    """Under accelerate the trainer's model is wrapped (DDP, DeepSpeed: the model is `.module`)."""
    _, model, tokenizer, vocab = tag_prone
    rollout = next(r for r in engine(tag_prone, attention="tree", seed=1).generate(prompts(tokenizer)) if r.blocks)
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids])

    class Wrapped(torch.nn.Module):  # what DistributedDataParallel looks like from outside
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    start = len(rollout.prompt_ids)
    with torch.no_grad():
        plain = TreeForward(model, vocab, start, FIXED)(ids, torch.ones_like(ids)).logits
        wrapped = TreeForward(Wrapped(model), vocab, start, FIXED)(ids, torch.ones_like(ids)).logits
    assert torch.equal(plain, wrapped)


def test_the_models_own_logit_processing_applies(tiny_tokenizer):
    """A model that softcaps its logits (Gemma 2) is scored with the softcap: on a row without blocks the tree
    forward is the model itself."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from parallel_r1.tags.tokens import tag_vocab

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32, final_logit_softcapping=0.5,
                          attn_implementation="sdpa")  # fmt: skip
    model = Gemma2ForCausalLM(config).eval()
    ids = torch.tensor([tiny_tokenizer.encode("What is two plus two? It is four.", add_special_tokens=False)])
    with torch.no_grad():
        own = model(input_ids=ids).logits
        tree = TreeForward(model, tag_vocab(tiny_tokenizer), 3, FIXED)(ids, torch.ones_like(ids)).logits
    assert own.abs().max() <= 0.5  # softcapped
    torch.testing.assert_close(tree, own, atol=1e-5, rtol=0)


def test_a_chosen_path_opened_after_whitespace_is_decided_in_line(tag_prone):
    """A trace may put a newline between `</Path>` and the model's `<Path>`: the decision is that `<Path>`, and it is
    scored from the row as written (which has read both paths), not from the new path's copy."""
    from parallel_r1.structure import tree_row
    from parallel_r1.tags.language import TAGS, decision_points

    _, _, tokenizer, vocab = tag_prone
    P, PC, A, AC, S, SC = (vocab.ids[t] for t in TAGS)
    newline, x, y = tokenizer.encode("\n", add_special_tokens=False)[0], 300, 301
    completion = [x, P, A, x, AC, A, y, AC, newline, A, x, y, AC, PC, newline, S, x, SC]
    assert decision_points(completion, vocab, CHOSEN) == [9, 13]  # the model's <Path> (after the newline), </Parallel>
    prompt = [x, y]
    row = tree_row(prompt + completion, len(prompt), vocab, CHOSEN)
    at = len(prompt) + 9
    assert row.source[at - 1] == at - 1  # the decision: in line, after the newline that follows both paths
    fixed = tree_row(prompt + completion, len(prompt), vocab, ParallelArguments(min_paths=3, max_paths=3))
    assert fixed.source[at - 1] >= len(prompt + completion)  # a runtime <Path>: from the third path's copy
