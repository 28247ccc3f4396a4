"""What both training scripts do around their trainer: logging, loading the model, training, saving."""

from __future__ import annotations

import logging

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

logger = logging.getLogger(__name__)


def setup_logging(training_args) -> None:
    """`log_level` on the main process, `log_level_replica` on the others, for us and for transformers."""
    level = training_args.get_process_log_level()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level)
    transformers.utils.logging.set_verbosity(level)


def load_tokenizer(model_args, training_args):
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required (a Hub id or a local model directory)")
    return AutoTokenizer.from_pretrained(model_args.model_name_or_path, **_load_kwargs(model_args, training_args))


def load_model(model_args, training_args):
    """The causal LM of TRL's ModelConfig: its path, revision, dtype and attention implementation."""
    return AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        dtype=model_args.dtype,
        attn_implementation=model_args.attn_implementation,
        **_load_kwargs(model_args, training_args),
    )


def train_and_save(trainer, training_args, dataset_name: str) -> None:
    """Train (resuming if asked), save to output_dir, push to the Hub if asked."""
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    logger.info("Model saved to %s", training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)


def _load_kwargs(model_args, training_args) -> dict:
    return {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code}
