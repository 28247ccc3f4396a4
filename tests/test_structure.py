"""The isolated ("Unseen") structure: positions, the attention rule, and its defining property."""

import pytest
import torch

from parallel_r1.structure import check_attention_implementation, completion_layout, isolated_inputs
from parallel_r1.tags.language import TagVocab
from parallel_r1.tags.tokens import tag_vocab

P, PC, A, AC, S, SC, X = "<Parallel>", "</Parallel>", "<Path>", "</Path>", "<Summary>", "</Summary>", "x"


@pytest.fixture(scope="module")
def vocab():
    # a synthetic vocabulary: the tags are ids 1..6, everything else is text
    return TagVocab(ids={P: 1, PC: 2, A: 3, AC: 4, S: 5, SC: 6})


def ids(vocab, *pieces):
    """Token ids from tags and text runs ('x' * n is n text tokens)."""
    out = []
    for piece in pieces:
        out += [vocab.ids[piece]] if piece in vocab.ids else [100] * len(piece)
    return out


def test_paths_restart_and_block_continues_after_the_longest(vocab):
    completion = ids(vocab, "xx", P, A, "xxx", AC, A, "x", AC, PC, S, "xx", SC, "x")
    layout = completion_layout(completion, vocab)
    # main: 0,1; <Parallel> at 2; path 1 = <Path> xxx </Path> at 3..7; path 2 = <Path> x </Path> at 3..5
    assert layout.offsets == [0, 1, 2, 3, 4, 5, 6, 7, 3, 4, 5, 8, 9, 10, 11, 12, 13]
    assert layout.path_of == [-1, -1, -1, 0, 0, 0, 0, 0, 1, 1, 1, -1, -1, -1, -1, -1, -1]
    assert set(layout.block_of[3:11]) == {0} and layout.block_of[11:] == [-1] * 6


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_any_number_of_paths_restarts_at_the_same_position(vocab, k):
    lengths = [2 + i for i in range(k)]
    pieces = [P]
    for n in lengths:
        pieces += [A, "x" * n, AC]
    completion = ids(vocab, *pieces, PC, S, "x", SC)
    layout = completion_layout(completion, vocab)
    starts = [i for i, t in enumerate(completion) if t == vocab.ids[A]]
    assert [layout.offsets[i] for i in starts] == [1] * k
    close = completion.index(vocab.ids[PC])
    assert layout.offsets[close] == 1 + max(lengths) + 2  # the longest path with its two tags


def test_lead_whitespace_belongs_to_the_path_and_cut_path_is_isolated(vocab):
    completion = ids(vocab, P, "x", A, "xx", AC, "x", A, "xxxx")  # cut inside the second path
    layout = completion_layout(completion, vocab)
    assert layout.offsets == [0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6]
    assert layout.path_of == [-1] + [0] * 5 + [1] * 6


def test_two_blocks_and_text_without_tags(vocab):
    block = [P, A, "x", AC, A, "xx", AC, PC, S, "x", SC]
    completion = ids(vocab, "x", *block, "x", *block)
    layout = completion_layout(completion, vocab)
    second_open = len(ids(vocab, "x", *block, "x"))
    assert layout.offsets[second_open] == layout.offsets[second_open - 1] + 1
    assert max(layout.path_of) == 1 and len(set(b for b in layout.block_of if b >= 0)) == 2
    plain = completion_layout([100] * 7, vocab)
    assert plain.offsets == list(range(7)) and plain.path_of == [-1] * 7


def test_mask_rule_and_padding_without_nan(vocab):
    completion = ids(vocab, P, A, "xx", AC, A, "x", AC, PC, S, "x", SC)
    prompt = [100, 100, vocab.ids[P]]  # a tag in the prompt is plain text
    pad = 0
    row = [pad, pad] + prompt + completion + [pad]
    input_ids = torch.tensor([row])
    attention = torch.tensor([[0, 0] + [1] * (len(prompt) + len(completion)) + [0]])
    out = isolated_inputs(input_ids, attention, completion_start=5, vocab=vocab)
    mask = out["attention_mask"][0, 0]
    c = 5  # first completion column
    path1, path2 = range(c + 1, c + 5), range(c + 5, c + 8)
    summary = range(c + 8, c + 12)
    for q in path2:
        assert not mask[q, list(path1)].any() and mask[q, : c + 1].sum() == len(prompt) + 1
    for q in summary:
        assert mask[q, list(path1) + list(path2)].all()
    assert not mask[:, :2].any(dim=0)[2:].any()  # nobody else looks at the left pads
    assert mask.diagonal().all()  # pads see themselves: no empty softmax row
    positions = out["position_ids"][0].tolist()
    assert positions[2:5] == [0, 1, 2] and positions[c] == 3 and positions[c + 5] == 4
    assert positions[c + 8] == 3 + 1 + 4  # </Parallel> after the longest path (4 tokens)
    scores = torch.zeros(1, 1, len(row), len(row)).masked_fill(~out["attention_mask"], float("-inf"))
    assert torch.isfinite(torch.softmax(scores, -1)).all()


def test_eager_attention_is_refused(tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager")
    with pytest.raises(ValueError, match="sdpa"):
        check_attention_implementation(model)


# ---------------------------------------------------------------- the defining test, on the tiny model


def _encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def _logits(model, input_ids, **kwargs):
    with torch.no_grad():
        return model(input_ids=input_ids, **kwargs).logits.float()


@pytest.mark.parametrize("k", [2, 3])
def test_a_path_is_computed_as_if_it_were_alone(tiny_model, tiny_tokenizer, k):
    """Each path's logits under the isolated structure equal those of `prefix <Parallel><Path>path` alone."""
    vocab = tag_vocab(tiny_tokenizer)
    prompt = _encode(tiny_tokenizer, "How many apples are left?")
    prefix = _encode(tiny_tokenizer, "First count them.") + [vocab.ids[P]]
    bodies = [_encode(tiny_tokenizer, t) for t in ("There are 3 red ones", "Add the green", "Or subtract 2 now")][:k]
    completion = list(prefix)
    spans = []
    for body in bodies:
        completion.append(vocab.ids[A])
        spans.append((len(prompt) + len(completion), len(body)))
        completion += body + [vocab.ids[AC]]
    full = torch.tensor([prompt + completion])
    structure = isolated_inputs(full, torch.ones_like(full), len(prompt), vocab)
    together = _logits(tiny_model, full, **structure)[0]
    for (start, n), body in zip(spans, bodies):
        alone = torch.tensor([prompt + prefix + [vocab.ids[A]] + body])
        expected = _logits(tiny_model, alone)[0, -n - 1 :]
        torch.testing.assert_close(together[start - 1 : start + n], expected, rtol=1e-5, atol=1e-5)
    # the causal structure would differ: the later path sees the earlier one
    causal = _logits(tiny_model, full)[0]
    start, n = spans[-1]
    assert (causal[start : start + n] - together[start : start + n]).abs().max() > 1e-3


def test_isolation_holds_in_a_left_padded_batch(tiny_model, tiny_tokenizer):
    vocab = tag_vocab(tiny_tokenizer)
    pad = tiny_tokenizer.pad_token_id
    prompts = [
        _encode(tiny_tokenizer, "Short question?"),
        _encode(tiny_tokenizer, "A much longer question with words?"),
    ]
    body1, body2 = _encode(tiny_tokenizer, "one path here"), _encode(tiny_tokenizer, "the other path")
    completion = [vocab.ids[P], vocab.ids[A], *body1, vocab.ids[AC], vocab.ids[A], *body2, vocab.ids[AC]]
    width = max(map(len, prompts))
    rows = [[pad] * (width - len(p)) + p + completion for p in prompts]
    attention = [[0] * (width - len(p)) + [1] * (len(p) + len(completion)) for p in prompts]
    batch, attention = torch.tensor(rows), torch.tensor(attention)
    structure = isolated_inputs(batch, attention, width, vocab)
    together = _logits(tiny_model, batch, **structure)
    assert torch.isfinite(together).all()
    n = len(body2)
    for i, prompt in enumerate(prompts):
        alone = torch.tensor([prompt + [vocab.ids[P], vocab.ids[A], *body2]])
        expected = _logits(tiny_model, alone)[0, -n - 1 :]
        start = width + 4 + len(body1)  # column of the second path's first body token
        torch.testing.assert_close(together[i, start - 1 : start + n], expected, rtol=1e-5, atol=1e-5)


def test_a_forward_with_gradients_gets_the_additive_mask_sdpa_would_make_and_the_same_attention(tiny_model):
    from parallel_r1.structure import additive

    torch.manual_seed(0)
    mask = torch.rand(2, 1, 6, 6) < 0.5
    mask |= torch.eye(6, dtype=torch.bool)
    q, k, v = torch.randn(3, 2, 2, 6, 8).unbind(0)
    made = additive(mask, tiny_model)
    assert made.dtype == torch.float32 and set(made.unique().tolist()) == {0.0, torch.finfo(torch.float32).min}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(sdpa(q, k, v, attn_mask=made), sdpa(q, k, v, attn_mask=mask))
    with torch.no_grad():
        assert additive(mask, tiny_model) is mask  # no backward to keep copies for: the smaller boolean mask
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert additive(mask, tiny_model).dtype == torch.bfloat16  # the dtype attention runs in
