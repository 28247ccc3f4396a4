"""The two SFT rules that teach the summary to vote (`trainers.summary_loss`): the summary's weight in the loss, and
the paths of a block that disagrees left out of it."""

from decimal import Decimal

import pytest
import torch
from datasets import Dataset
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.answers import path_result
from parallel_r1.configs import ParallelSFTConfig
from parallel_r1.tags.language import parse
from parallel_r1.tags.tokens import tag_vocab
from parallel_r1.testing.demo.task import NUM_PATHS, Problem
from parallel_r1.trainers import ParallelSFTTrainer
from parallel_r1.trainers.summary_loss import (
    IGNORE,
    completion_starts,
    summary_tokens,
    without_disagreeing_paths,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PROBLEM = Problem(7, 8, 3, 4)  # 56 + 12 = 68
TRACES = {
    "agree": PROBLEM.parallel_trace((0, 0, 0)),
    "one slipped": PROBLEM.parallel_trace((0, 3, 0)),  # 59 + 12 = 71 in the second path
    "plain": PROBLEM.plain_solution(),
    # two blocks in one row: the first agrees, the second splits
    "two blocks": PROBLEM.parallel_trace((0, 0, 0)) + "\n" + PROBLEM.parallel_trace((0, 0, 4), at=("sum",) * 3),
    # cut by the length inside its second path: not judged
    "cut": "<Parallel><Path>7*8=56\n3*4=12\n56+12=68</Path><Path>7*8=56\n3*4=12",
}


def rows(*names) -> Dataset:
    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": PROBLEM.text}],
                "completion": [{"role": "assistant", "content": TRACES[n]}],
            }
            for n in names
        ]
    )


def trainer_for(tiny_dir, tmp_path, names=("agree", "one slipped"), **overrides) -> ParallelSFTTrainer:
    args = ParallelSFTConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        bf16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        dataset_num_proc=None,
        **{"attention": "isolated", **overrides},
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype="float32", attn_implementation="sdpa")
    return ParallelSFTTrainer(
        model, args, train_dataset=rows(*names), processing_class=AutoTokenizer.from_pretrained(tiny_dir)
    )


def batch_of(trainer) -> dict:
    return trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])


def decoded_out_of_loss(trainer, plain: dict, masked: dict, row: int) -> list[str]:
    """The texts of the runs of tokens that `masked` leaves out of the loss and `plain` keeps, in row `row`."""
    dropped = (plain["labels"][row] != IGNORE) & (masked["labels"][row] == IGNORE)
    runs, current = [], []
    for i, out in enumerate(dropped.tolist()):
        if out:
            current.append(int(plain["input_ids"][row, i]))
        elif current:
            runs.append(trainer.processing_class.decode(current))
            current = []
    return runs + ([trainer.processing_class.decode(current)] if current else [])


# --------------------------------------------------------------------------- a path's result


def test_a_paths_result_is_the_value_of_the_last_number_it_writes():
    assert path_result("7*8=56\n3*4=12\n56+12=68") == 68
    assert path_result("x = -3.5, so") == Decimal("-3.5")
    assert path_result("she keeps 1,000 dollars") == 1000
    assert path_result("68.0") == path_result("68")
    assert path_result("no number here") is None
    assert path_result("") is None


@given(st.text(alphabet=st.characters(blacklist_categories=("Nd",)), max_size=40), st.integers(0, 10**6))
def test_text_without_digits_has_no_result_and_a_number_written_last_is_it(words, number):
    assert path_result(words) is None
    assert path_result(f"{words} {number}") == number


# --------------------------------------------------------------------------- disagreeing paths


def test_a_block_whose_paths_disagree_trains_its_summary_and_not_its_paths(tiny_dir, tmp_path):
    plain = batch_of(trainer_for(tiny_dir, tmp_path))
    trainer = trainer_for(tiny_dir, tmp_path, disagreeing_paths_in_loss=False)
    masked = batch_of(trainer)
    assert torch.equal(masked["labels"][0], plain["labels"][0])  # the paths agree: nothing changes
    runs = decoded_out_of_loss(trainer, plain, masked, 1)
    bodies = [path.body + "</Path>" for path in parse(TRACES["one slipped"]).blocks[0].paths]
    assert runs == bodies  # every path of the split block, and nothing else
    assert torch.equal(completion_starts(masked["labels"]), completion_starts(plain["labels"]))
    in_summary = summary_tokens(masked["input_ids"], completion_starts(masked["labels"]), trainer.policy.vocab)
    assert trainer.processing_class.decode(masked["input_ids"][1][in_summary[1]]) == "Final Answer: 68</Summary>"


def test_only_the_split_block_of_a_row_and_of_a_padded_batch_leaves_its_paths_out(tiny_dir, tmp_path):
    names = ("plain", "two blocks", "cut", "one slipped")
    plain = batch_of(trainer_for(tiny_dir, tmp_path, names=names))
    trainer = trainer_for(tiny_dir, tmp_path, names=names, disagreeing_paths_in_loss=False)
    masked = batch_of(trainer)
    assert (plain["attention_mask"] == 0).any()  # rows of different lengths: padding is exercised
    assert torch.equal(masked["labels"][0], plain["labels"][0])  # no block
    second = parse(TRACES["two blocks"]).blocks[1]
    assert decoded_out_of_loss(trainer, plain, masked, 1) == [path.body + "</Path>" for path in second.paths]
    assert torch.equal(masked["labels"][2], plain["labels"][2])  # a block cut in a path is not judged
    assert len(decoded_out_of_loss(trainer, plain, masked, 3)) == NUM_PATHS


def test_a_row_out_of_the_loss_is_left_alone(tiny_dir, tmp_path):
    trainer = trainer_for(tiny_dir, tmp_path, names=("plain", "one slipped"), disagreeing_paths_in_loss=False)
    plain = batch_of(trainer)
    nothing = torch.full_like(plain["labels"], IGNORE)
    kept = without_disagreeing_paths(
        nothing, plain["input_ids"], trainer.policy.vocab, trainer.processing_class.decode
    )
    assert (kept == IGNORE).all()


def test_the_tokens_trl_counts_are_the_tokens_in_the_loss(tiny_dir, tmp_path):
    """The rule acts in the collator: the batch TRL counts (`num_items_in_batch`) is the masked one."""
    trainer = trainer_for(
        tiny_dir, tmp_path, disagreeing_paths_in_loss=False, summary_loss_weight=10.0, max_steps=1, logging_steps=1
    )
    seen = []
    original = trainer.compute_loss

    def spy(model, inputs, return_outputs=False, num_items_in_batch=None):
        seen.append((int((inputs["labels"] != IGNORE).sum()), int(num_items_in_batch)))
        return original(model, inputs, return_outputs, num_items_in_batch)

    trainer.compute_loss = spy
    trainer.train()
    ((in_loss, counted),) = seen
    assert in_loss < int((batch_of(trainer_for(tiny_dir, tmp_path))["labels"] != IGNORE).sum())
    assert counted == in_loss


# --------------------------------------------------------------------------- the summary's weight


def per_token_losses(trainer, batch) -> torch.Tensor:
    """-log p of every label of the batch (0 where out of the loss), through the trainer's structured forward."""
    forward = trainer.policy.training_forward(trainer.model.eval(), completion_starts(batch["labels"]))
    with torch.no_grad():
        logits = forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    targets = batch["labels"][:, 1:]
    log_probs = logits.float().log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return -log_probs * (targets != IGNORE)


@pytest.mark.parametrize(
    "attention, weight", [("isolated", 0.5), ("isolated", 10.0), ("causal", 10.0), ("tree", 10.0)]
)
def test_each_summary_token_counts_weight_times(tiny_dir, tmp_path, attention, weight):
    trainer = trainer_for(tiny_dir, tmp_path, summary_loss_weight=weight, attention=attention)
    batch = batch_of(trainer)
    losses = per_token_losses(trainer, batch)
    in_summary = summary_tokens(batch["input_ids"], completion_starts(batch["labels"]), trainer.policy.vocab)[:, 1:]
    count = (batch["labels"][:, 1:] != IGNORE).sum()
    expected = (losses[~in_summary].sum() + weight * losses[in_summary].sum()) / count
    with torch.no_grad():
        got = trainer.compute_loss(trainer.model.eval(), dict(batch))
        unweighted = trainer_for(tiny_dir, tmp_path, attention=attention).compute_loss(
            trainer.model.eval(), dict(batch)
        )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(unweighted, losses.sum() / count, atol=1e-5, rtol=1e-5)  # weight 1: TRL's loss
    assert int(in_summary.sum()) == 2 * len(trainer.processing_class.encode("Final Answer: 68</Summary>"))


@pytest.mark.parametrize(
    "text, summary",
    [
        ("<Parallel><Path>1</Path><Path>1</Path></Parallel><Summary>Final Answer: 1", "Final Answer: 1"),
        (
            "a stray </Summary> b <Parallel><Path>1</Path><Path>2</Path></Parallel><Summary>2</Summary> c",
            "2</Summary>",
        ),
        ("<Parallel><Path>1</Path><Path>1</Path></Parallel><Summary>1</Summary> then <Summary>x", "1</Summary>"),
    ],
)
def test_the_summary_is_what_the_parser_reads_as_one(tiny_dir, text, summary):
    """Left open, a summary runs to the end of the row; a tag out of place opens or closes nothing."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    ids = torch.tensor([[7, 7, *tokenizer.encode(text)]])  # two tokens of prompt
    marked = summary_tokens(ids, torch.tensor([2]), tag_vocab(tokenizer))[0]
    assert not marked[:2].any()
    assert tokenizer.decode(ids[0][marked]) == summary


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"summary_loss_weight": 0.0}, "must be positive"),
        ({"summary_loss_weight": 2.0, "loss_type": "dft"}, "cannot be combined"),
        ({"summary_loss_weight": 2.0, "label_smoothing_factor": 0.1}, "cannot be combined"),
        ({"summary_loss_weight": 2.0, "use_liger_kernel": True}, "cannot be combined"),
        ({"summary_loss_weight": 2.0, "packing": True}, "cannot be used with packing"),
        ({"disagreeing_paths_in_loss": False, "padding_free": True}, "cannot be used with padding_free"),
        ({"disagreeing_paths_in_loss": False, "completion_only_loss": False}, "needs completion_only_loss"),
    ],
)
def test_a_weight_that_cannot_apply_is_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        ParallelSFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **overrides)


def test_a_weight_and_a_loss_function_of_ones_own_are_refused(tiny_dir, tmp_path):
    args = ParallelSFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", summary_loss_weight=2.0)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype="float32", attn_implementation="sdpa")
    with pytest.raises(ValueError, match="one or the other"):
        ParallelSFTTrainer(
            model,
            args,
            train_dataset=rows("agree"),
            processing_class=AutoTokenizer.from_pretrained(tiny_dir),
            compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.logits.sum(),
        )
