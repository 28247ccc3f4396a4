"""Stage 1: supervised fine-tuning on parallel-thinking traces (Seen or Unseen).

    accelerate launch --config_file accelerate_configs/zero3.yaml scripts/sft.py \
        --config recipes/Qwen3-4B-Base/sft/unseen.yaml [--any_field value ...]

    accelerate launch --config_file accelerate_configs/cpu.yaml scripts/sft.py --config recipes/tiny/sft.yaml

The recipe fills `parallel_r1.configs.SFT_ARGUMENTS`; command-line flags override it. Checkpoints,
resuming (`--resume_from_checkpoint <dir>`), logging (`report_to`) and the Hub upload (`push_to_hub`,
`hub_model_id`) are TRL's and transformers' own.
"""

import logging

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import get_peft_config

from parallel_r1.configs import sft_parser
from parallel_r1.data import load_sft_traces
from parallel_r1.trainers import ParallelSFTTrainer

logger = logging.getLogger(__name__)


def load_traces(script_args, training_args, split):
    with training_args.main_process_first(desc=f"loading {script_args.dataset_name} [{split}]"):
        return load_sft_traces(
            script_args.dataset_name,
            split,
            config=script_args.dataset_config,
            question_column=script_args.question_column,
            response_column=script_args.response_column,
            answer_column=script_args.answer_column,
            template=script_args.prompt_template,
            only_well_formed=script_args.only_well_formed,
            limit=script_args.max_train_samples if split == script_args.dataset_train_split else None,
        )


def main(script_args, training_args, model_args):
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required (a Hub id or a local model directory)")
    load_kwargs = {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code}
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, **load_kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        dtype=model_args.dtype,
        attn_implementation=model_args.attn_implementation,
        **load_kwargs,
    )
    train_dataset = load_traces(script_args, training_args, script_args.dataset_train_split)
    eval_dataset = None
    if training_args.eval_strategy != "no" and script_args.dataset_test_split:
        eval_dataset = load_traces(script_args, training_args, script_args.dataset_test_split)

    trainer = ParallelSFTTrainer(
        model,
        training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    logger.info("Model saved to %s", training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


if __name__ == "__main__":
    script_args, training_args, model_args = sft_parser().parse_args_and_config()
    log_level = training_args.get_process_log_level()  # log_level on the main process, log_level_replica elsewhere
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=log_level)
    transformers.utils.logging.set_verbosity(log_level)
    main(script_args, training_args, model_args)
