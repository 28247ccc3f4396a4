"""Stage 1: supervised fine-tuning on parallel-thinking traces (Seen or Unseen).

    accelerate launch --config_file accelerate_configs/zero3.yaml scripts/sft.py \
        --config recipes/Qwen3-4B-Base/sft/unseen.yaml [--any_field value ...]

    accelerate launch --config_file accelerate_configs/cpu.yaml scripts/sft.py --config recipes/tiny/sft.yaml

The recipe fills `parallel_r1.configs.SFT_ARGUMENTS`; command-line flags override it. Checkpoints,
resuming (`--resume_from_checkpoint <dir>`, or `true` for the newest checkpoint of output_dir), logging (`report_to`) and the Hub upload (`push_to_hub`,
`hub_model_id`) are TRL's and transformers' own.
"""

from parallel_r1.cli import check_named_model, check_trackers, run

# The rest is imported as it is needed: a mistyped model folder fails before the parse, and --help and a bad flag
# answer without loading TRL's trainers.


def load_traces(script_args, training_args, tokenizer, split):
    """The traces of one split, without those longer than max_length tokens (dropped, as the paper's SFT does)."""
    from parallel_r1.data import drop_long_traces, load_sft_traces

    with training_args.main_process_first(desc=f"loading {script_args.dataset_name} [{split}]"):
        traces = load_sft_traces(script_args, split, template=training_args.prompt_template)
        if training_args.max_length is None:
            return traces
        return drop_long_traces(traces, tokenizer, training_args.max_length, f"{script_args.dataset_name} [{split}]")


def main(script_args, training_args, model_args, recipe: str | None = None):
    """SFT as the arguments say, saved; returns the trainer (the caller releases its processes)."""
    from trl import get_peft_config

    from parallel_r1.rollout.arguments import exact_rollout
    from parallel_r1.trainers import ParallelSFTTrainer
    from parallel_r1.training import load_model, load_tokenizer, train_and_save

    tokenizer = load_tokenizer(model_args, training_args)
    train_dataset = load_traces(script_args, training_args, tokenizer, script_args.dataset_train_split)
    eval_dataset = None
    if training_args.eval_strategy != "no" and script_args.dataset_test_split:
        eval_dataset = load_traces(script_args, training_args, tokenizer, script_args.dataset_test_split)
    trainer = ParallelSFTTrainer(
        load_model(model_args, training_args),  # after the data: a data file's mistake is said in seconds
        training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    train_and_save(trainer, training_args, script_args.dataset_name, exact_rollout(training_args), recipe)
    return trainer


def cli() -> None:
    check_named_model()  # a mistyped model folder fails before the parse loads torch and transformers
    check_trackers()  # so does a tracker whose package is not installed
    from parallel_r1.configs import sft_parser

    parser = sft_parser()
    script_args, training_args, model_args = parser.parse_args_and_config()
    from parallel_r1.training import exit_launched_process, setup_logging

    setup_logging(training_args)
    trainer = main(script_args, training_args, model_args, parser.recipe)  # the model card names the recipe
    exit_launched_process(trainer)


if __name__ == "__main__":
    run(cli)  # a bad setting, file or column ends in one line: error: ...
