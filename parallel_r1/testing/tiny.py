"""A tiny Qwen3-style model and a tokenizer trained locally: what tests and `make demo` run on.

Everything is built offline in a few seconds from the data shipped in the package:
a byte-level BPE tokenizer (Qwen's chat markup, `<|im_end|>` as EOS, `<|endoftext|>` as pad,
the six tags added through `tokens.add_parallel_tokens`) and a randomly initialised
`Qwen3ForCausalLM` with head_dim 32 (vLLM's CPU attention refuses smaller heads) and a few spare
embedding rows, like the real Qwen3 bases.

    python -m parallel_r1.testing.tiny outputs/tiny-qwen3                  # writes a model directory
    python -m parallel_r1.testing.tiny outputs/tiny-teacher --teacher      # a stand-in cold-start teacher
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from ..data import DATA_DIR
from ..tags.tokens import add_parallel_tokens, tag_ids

logger = logging.getLogger(__name__)

EOS, PAD, IM_START = "<|im_end|>", "<|endoftext|>", "<|im_start|>"

# Qwen-style markup; {% generation %} marks what the assistant wrote (TRL's assistant-only loss).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _corpus():
    """Lines of the shipped GSM8K questions and cold-start traces."""
    for name, keys in (("gsm8k_train.jsonl", ("question", "answer")), ("parallel_gsm8k_sample.jsonl", ("response",))):
        with open(DATA_DIR / name, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                for key in keys:
                    yield row[key]


def build_tokenizer(
    vocab_size: int = 1024, with_tags: bool = True, corpus=None, split_digits: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `corpus` (lines of text; default: the shipped data), about a second.

    With `split_digits` every digit is a token of its own, as in Qwen's tokenizers (what arithmetic wants)."""
    bpe = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus() if corpus is None else corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=EOS, pad_token=PAD, padding_side="left", model_max_length=4096
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if with_tags:
        add_parallel_tokens(tokenizer)
    return tokenizer


def build_model(
    tokenizer,
    spare_rows: int = 16,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 (2 layers of width 64 by default) whose embedding has `spare_rows` unused rows;
    heads are 32 wide, the MLP twice the width."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer) + spare_rows,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def make_tag_prone(model, tokenizer, strength: float = 5.0, seed: int = 1) -> None:
    """Make a random model write structure: give <Parallel>, </Path>, </Summary> and EOS strong output rows.

    Each of these rows becomes `strength` times a random unit direction of the hidden space, so the
    token wins wherever the hidden state leans its way: blocks open, paths and summaries close and
    completions end, at rates that depend on the context, even under greedy decoding. The head must
    be untied. Used by the rollout tests and benchmarks, whose random model would otherwise never
    open or close a block.
    """
    head = model.get_output_embeddings().weight
    if head.data_ptr() == model.get_input_embeddings().weight.data_ptr():
        raise ValueError("make_tag_prone needs an untied output head (build_model(tie_word_embeddings=False))")
    generator = torch.Generator().manual_seed(seed)
    ids = tag_ids(tokenizer)
    with torch.no_grad():
        for token in (ids["<Parallel>"], ids["</Path>"], ids["</Summary>"], tokenizer.eos_token_id):
            direction = torch.randn(head.shape[1], generator=generator)
            head[token] = strength * direction / direction.norm()


def pin_logits(model, weights: dict) -> None:
    """Fix the logits of some tokens, at every position, to `weights[token]` times one positive constant: every
    embedding holds 1.0 at coordinate 0 and no layer writes there (its rows of `o_proj` and `down_proj` are zero),
    so after the final norm that coordinate is positive everywhere; the output rows of these tokens read only it,
    and no other row reads it. Needs untied embeddings."""
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        head = model.lm_head.weight
        head[:, 0] = 0.0
        for token, weight in weights.items():
            head[token] = 0.0
            head[token, 0] = weight


def teacher_trace(answer: str) -> str:
    """The trace the tiny teacher learns for a problem whose answer is `answer`: one block of two paths."""
    return (
        "Let me work it out.\n<Parallel>\n<Path>\nCounting gives "
        f"{answer}.\n</Path>\n<Path>\nChecking gives {answer}.\n</Path>\n</Parallel>\n<Summary>\n"
        f"Both paths give {answer}.\n</Summary>\nFinal Answer: {answer}"
    )


def teach(model, tokenizer, conversations: list, max_steps: int = 400, target_loss: float = 0.01) -> float:
    """Fit `model` to (chat prompt, answer text) pairs by full-batch Adam on the answers' tokens, until the loss
    reaches `target_loss`: a tiny stand-in for a real teacher, not a training recipe. Returns the last loss."""
    sequences, labels = [], []
    for prompt, answer in conversations:
        prompt_ids = tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        answer_ids = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        sequences.append(list(prompt_ids) + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(map(len, sequences))
    input_ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in sequences])
    targets = torch.tensor([t + [-100] * (width - len(t)) for t in labels])
    attention_mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(max_steps):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=targets).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < target_loss:
            break
    model.eval()
    return loss.item()


def save_tiny_teacher(output_dir: str | Path, num_problems: int = 3) -> Path:
    """A tiny model taught `teacher_trace` for the first `num_problems` GSM8K train problems (parallel prompt), and
    saved: the offline teacher of the cold-start tests and demo. On other problems it writes one of the traces it
    knows, so its answers there are well-formed and wrong."""
    from ..answers import extract_reference
    from ..data import DataArguments, load_problems

    output_dir = Path(output_dir)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    problems = load_problems(DataArguments(dataset_name="gsm8k"), "train", limit=num_problems)
    loss = teach(model, tokenizer, [(p["prompt"], teacher_trace(extract_reference(p["answer"]))) for p in problems])
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    logger.info("Tiny teacher (final loss %.4f on %d problems) written to %s", loss, num_problems, output_dir)
    return output_dir


def save_tiny(output_dir: str | Path, tag_prone: bool = False, **model_kwargs) -> Path:
    """Build the tokenizer and model and save both to `output_dir` (a model directory vLLM can load)."""
    output_dir = Path(output_dir)
    tokenizer = build_tokenizer()
    if tag_prone:
        model_kwargs["tie_word_embeddings"] = False
    model = build_model(tokenizer, **model_kwargs)
    if tag_prone:
        make_tag_prone(model, tokenizer)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    logger.info("Tiny model (%d parameters) written to %s", model.num_parameters(), output_dir)
    return output_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir")
    parser.add_argument("--teacher", action="store_true", help="the tiny stand-in teacher (save_tiny_teacher)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    (save_tiny_teacher if args.teacher else save_tiny)(args.output_dir)


if __name__ == "__main__":
    main()
