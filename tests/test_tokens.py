"""The tags as single tokens: added once, rows initialised, survive decoding and a save/reload."""

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from parallel_r1.tags.language import TAGS, canonical_block
from parallel_r1.tags.tokens import INIT_KEY, add_parallel_tokens, has_parallel_tokens, tag_ids
from parallel_r1.testing.tiny import build_model, build_tokenizer

TEXT = "Start." + canonical_block(["a path", "another path"], "both") + "\nFinal Answer: 3"


def spelling_rows(tokenizer, weight) -> torch.Tensor:
    """Each tag's spelling mean: the mean of the rows of the pieces `tokenizer` (without the tags) splits it into."""
    return torch.stack([weight[tokenizer.encode(tag, add_special_tokens=False)].mean(0) for tag in TAGS])


@pytest.mark.parametrize("spare_rows", [16, 0])  # the tags fit into spare rows, or need a resize
@pytest.mark.parametrize("tied", [True, False])
def test_each_tag_row_starts_at_its_spellings_mean(tied, spare_rows):
    tokenizer = build_tokenizer(with_tags=False)
    model = build_model(tokenizer, spare_rows=spare_rows, tie_word_embeddings=tied)
    rows = model.get_input_embeddings().weight.shape[0]
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    expected_in, expected_out = spelling_rows(tokenizer, old_in), spelling_rows(tokenizer, old_out)
    assert not has_parallel_tokens(tokenizer)
    assert add_parallel_tokens(tokenizer, model) == list(TAGS)
    ids = [tag_ids(tokenizer)[tag] for tag in TAGS]
    weight_in, weight_out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert weight_in.shape[0] == max(rows, len(tokenizer))  # no resize when the spare rows were enough
    torch.testing.assert_close(weight_in[ids], expected_in)
    torch.testing.assert_close(weight_out[ids], expected_out)  # an untied head: its own rows' means
    assert torch.pdist(weight_in[ids]).min() > 0  # six distinct rows
    torch.testing.assert_close(weight_in[: len(old_in) - spare_rows], old_in[: len(old_in) - spare_rows])
    assert (weight_out.data_ptr() == weight_in.data_ptr()) == tied
    assert getattr(model.config, INIT_KEY) == "spelling"


@pytest.mark.parametrize("spare_rows", [16, 0])
@pytest.mark.parametrize("tied", [True, False])
def test_the_mean_rule_gives_every_tag_the_mean_of_the_rows_in_use(tied, spare_rows):
    tokenizer = build_tokenizer(with_tags=False)
    model = build_model(tokenizer, spare_rows=spare_rows, tie_word_embeddings=tied)
    used = len(tokenizer)
    means = [layer().weight[:used].mean(0) for layer in (model.get_input_embeddings, model.get_output_embeddings)]
    add_parallel_tokens(tokenizer, model, init="mean")
    ids = list(tag_ids(tokenizer).values())
    for layer, mean in zip((model.get_input_embeddings, model.get_output_embeddings), means):
        torch.testing.assert_close(layer().weight[ids], mean.expand(len(ids), -1))
    assert getattr(model.config, INIT_KEY) == "mean"


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="tag_init must be one of"):
        add_parallel_tokens(build_tokenizer(with_tags=False), init="zeros")


@pytest.mark.parametrize("tied", [True, False])
def test_tags_resize_when_there_are_no_spare_rows(tied):
    tokenizer = build_tokenizer(with_tags=False)
    model = build_model(tokenizer, spare_rows=0, tie_word_embeddings=tied)
    old = model.get_input_embeddings().weight.detach().clone()
    add_parallel_tokens(tokenizer, model)
    new = model.get_input_embeddings().weight
    assert new.shape[0] == len(tokenizer) == old.shape[0] + len(TAGS)
    torch.testing.assert_close(new[: old.shape[0]], old)  # the old rows are untouched
    assert model.get_output_embeddings().weight.shape[0] == new.shape[0]
    assert torch.isfinite(new).all()
    logits = model(input_ids=torch.tensor([tokenizer.encode(TEXT)])).logits
    assert logits.shape[-1] == new.shape[0] and torch.isfinite(logits).all()


def test_adding_twice_adds_nothing(tiny_tokenizer):
    before = len(tiny_tokenizer)
    assert add_parallel_tokens(tiny_tokenizer) == []
    assert len(tiny_tokenizer) == before


def test_each_tag_is_one_token_even_glued_to_text(tiny_tokenizer):
    ids = tag_ids(tiny_tokenizer)
    encoded = tiny_tokenizer.encode("word<Path>x</Path>y", add_special_tokens=False)
    assert encoded.count(ids["<Path>"]) == 1 and encoded.count(ids["</Path>"]) == 1


def test_tags_survive_decoding_with_skip_special_tokens(tiny_tokenizer):
    # TRL decodes completions this way before calling the reward functions
    completion = tiny_tokenizer.encode(TEXT, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    decoded = tiny_tokenizer.batch_decode([completion], skip_special_tokens=True)[0]
    assert decoded == TEXT


def test_missing_tags_are_named():
    with pytest.raises(ValueError, match="<Parallel>.*</Summary>"):
        tag_ids(build_tokenizer(with_tags=False))


def test_script_makes_a_special_base_that_reloads(tmp_path):
    base = tmp_path / "base"
    tokenizer = build_tokenizer(with_tags=False)
    build_model(tokenizer, spare_rows=2, tie_word_embeddings=False).save_pretrained(base)
    tokenizer.save_pretrained(base)
    out = tmp_path / "special"
    cmd = [
        sys.executable,
        "scripts/add_special_tokens.py",
        "--model_name_or_path",
        str(base),
        "--output_dir",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    reloaded_tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tag_ids(reloaded_tokenizer)
    assert model.get_input_embeddings().weight.shape[0] == len(reloaded_tokenizer)  # 2 spare rows, then a resize
    assert reloaded_tokenizer.decode(reloaded_tokenizer.encode(TEXT), skip_special_tokens=True) == TEXT
    assert len(set(ids.values())) == len(TAGS)


def test_script_refuses_push_without_a_repo_id(tmp_path):
    cmd = [sys.executable, "scripts/add_special_tokens.py", "--model_name_or_path", "x", "--output_dir", str(tmp_path)]
    result = subprocess.run(cmd + ["--push_to_hub"], capture_output=True, text=True)
    assert result.returncode != 0 and "hub_model_id" in result.stderr
