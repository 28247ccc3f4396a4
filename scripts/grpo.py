"""Stage 2: GRPO with fork-join rollouts (Parallel-R1), or a plain sequential baseline.

    accelerate launch --config_file accelerate_configs/zero3.yaml scripts/grpo.py \
        --config recipes/Qwen3-4B-Base/grpo/unseen_s2.yaml [--any_field value ...]

    accelerate launch --config_file accelerate_configs/cpu.yaml scripts/grpo.py --config recipes/tiny/grpo.yaml

The recipe fills `parallel_r1.configs.GRPO_ARGUMENTS`; command-line flags override it. Generation
(vLLM colocated or server, or transformers), checkpoints, resuming (`--resume_from_checkpoint <dir>` or `true`),
logging (`report_to`) and the Hub upload (`push_to_hub`, `hub_model_id`) are TRL's own.
"""

import logging

from parallel_r1.cli import check_named_model, check_trackers, run

# The rest is imported as it is needed: a mistyped model folder fails before the parse, and --help and a bad flag
# answer without loading TRL's trainers (and vLLM with them).

logger = logging.getLogger(__name__)


def load_split(script_args, training_args, tokenizer, split):
    """The problems of one split, without those whose templated prompt exceeds max_prompt_length tokens."""
    from parallel_r1.data import load_problems, prompt_ids

    with training_args.main_process_first(desc=f"loading {script_args.dataset_name} [{split}]"):
        dataset = load_problems(script_args, split, template=training_args.prompt_template)
        if script_args.max_prompt_length is None:
            return dataset
        limit = script_args.max_prompt_length
        kept = dataset.filter(
            lambda row: len(prompt_ids(tokenizer, row["prompt"])) <= limit,
            desc=f"prompts of at most {limit} tokens",
        )
        logger.info(
            "%s [%s]: dropped %d prompts longer than %d tokens",
            script_args.dataset_name,
            split,
            len(dataset) - len(kept),
            limit,
        )
        if len(kept) == 0:
            raise ValueError(f"no prompt of {script_args.dataset_name} [{split}] fits max_prompt_length={limit}")
        return kept


def main(script_args, training_args, model_args, recipe: str | None = None):
    """GRPO as the arguments say, saved; returns the trainer (the caller releases its processes)."""
    from trl import get_peft_config

    from parallel_r1.rewards import get_reward_funcs
    from parallel_r1.rollout import RolloutArguments
    from parallel_r1.trainers import ParallelGRPOTrainer
    from parallel_r1.training import load_model, load_tokenizer, train_and_save

    tokenizer = load_tokenizer(model_args, training_args)
    reward_funcs = get_reward_funcs(script_args.reward_funcs, tokenizer=tokenizer, args=training_args)
    train_dataset = load_split(script_args, training_args, tokenizer, script_args.dataset_train_split)
    eval_dataset = None
    if training_args.eval_strategy != "no" and script_args.dataset_test_split:
        eval_dataset = load_split(script_args, training_args, tokenizer, script_args.dataset_test_split)
    trainer = ParallelGRPOTrainer(
        model=load_model(model_args, training_args),
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    settings = RolloutArguments.from_fields(training_args)
    train_and_save(trainer, training_args, script_args.dataset_name, settings, recipe)
    return trainer


def cli() -> None:
    check_named_model()  # a mistyped model folder fails before the parse loads torch and transformers
    check_trackers()  # so does a tracker whose package is not installed
    from parallel_r1.configs import grpo_parser

    parser = grpo_parser()
    script_args, training_args, model_args = parser.parse_args_and_config()
    from parallel_r1.training import exit_launched_process, setup_logging

    setup_logging(training_args)
    trainer = main(script_args, training_args, model_args, parser.recipe)  # the model card names the recipe
    exit_launched_process(trainer)


if __name__ == "__main__":
    run(cli)  # a bad setting, file or column ends in one line: error: ...
