"""Make a "-Special" base: any causal LM with the six parallel-thinking tags as single tokens.

    python scripts/add_special_tokens.py --model_name_or_path Qwen/Qwen3-4B-Base \
        --output_dir outputs/Qwen3-4B-Base-Special [--push_to_hub --hub_model_id you/Qwen3-4B-Base-Special]

    python scripts/add_special_tokens.py --model_name_or_path meta-llama/Llama-3.2-3B \
        --output_dir outputs/Llama-3.2-3B-Special --chat_template plain

A base whose embedding has no spare rows (Llama, Mistral, SmolLM2) is resized. Each tag's row starts as the mean of
the rows of the pieces its text was split into (`--tag_init spelling`, parallel_r1/tags/tokens.py), and the model's
config records that rule. A base without a chat template gets one with `--chat_template plain` (or a .jinja file), which every stage then
uses to write the prompt; one without a padding token gets one it reserves (Llama 3's `<|finetune_right_pad_id|>`) or else its end-of-sequence
token.

Run it once, before training, on one process: the embedding rows are edited in place, which must
happen before ZeRO-3/FSDP shards the model. Training scripts then load the "-Special" directory.
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from parallel_r1.cli import OneLineErrors, run
from parallel_r1.data import PLAIN_CHAT_TEMPLATE
from parallel_r1.tags.tokens import TagRowArguments, add_parallel_tokens, tag_ids

logger = logging.getLogger(__name__)
RESERVED_PADS = ("<|finetune_right_pad_id|>", "<pad>")  # padding tokens some bases reserve without naming them


class ArgumentParser(OneLineErrors, HfArgumentParser):
    """transformers' parser; a bad flag or value ends in one line."""


@dataclass
class Arguments(TagRowArguments):
    model_name_or_path: str = field(metadata={"help": "Hub id or local directory of the base model."})
    output_dir: str = field(metadata={"help": "Where to write the model with the tags."})
    dtype: str = field(
        default="auto", metadata={"help": "Weights dtype to load and save (auto keeps the checkpoint's)."}
    )
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "'plain' (data.PLAIN_CHAT_TEMPLATE) or a .jinja file: set as the tokenizer's chat template."
        },
    )
    push_to_hub: bool = field(default=False, metadata={"help": "Also upload the result to the Hub."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repo id for --push_to_hub."})
    private: bool = field(default=False, metadata={"help": "Create the Hub repo as private."})


def main(args: Arguments) -> None:
    if args.push_to_hub and not args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id (e.g. you/Qwen3-4B-Base-Special)")
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if args.chat_template:
        tokenizer.chat_template = chat_template(args.chat_template)
    if tokenizer.chat_template is None:
        raise ValueError(
            f"{args.model_name_or_path} has no chat template, and every stage writes its prompt with one: pass "
            "--chat_template plain (or a .jinja file)"
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = next((t for t in RESERVED_PADS if t in tokenizer.get_vocab()), tokenizer.eos_token)
        logger.info("No padding token: %s pads", tokenizer.pad_token)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=args.dtype)
    rows_before = model.get_input_embeddings().weight.shape[0]
    added = add_parallel_tokens(tokenizer, model, args.tag_init)
    rows_after = model.get_input_embeddings().weight.shape[0]
    logger.info(
        "Added %s; tag ids %s; embedding rows %d -> %d",
        added or "nothing",
        tag_ids(tokenizer),
        rows_before,
        rows_after,
    )
    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    if args.push_to_hub:
        model.push_to_hub(args.hub_model_id, private=args.private)
        tokenizer.push_to_hub(args.hub_model_id, private=args.private)
        logger.info("Pushed to https://huggingface.co/%s", args.hub_model_id)


def chat_template(name: str) -> str:
    if name == "plain":
        return PLAIN_CHAT_TEMPLATE
    path = Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"--chat_template {name!r} is neither 'plain' nor a template file")
    return path.read_text()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    run(lambda: main(*ArgumentParser(Arguments).parse_args_into_dataclasses()))
