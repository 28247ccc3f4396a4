"""The smallest GRPO run the tests train: four arithmetic prompts, a reward with spread in every group,
and settings that take a few seconds a step on a CPU with the tiny model (`testing.tiny`)."""

from __future__ import annotations

from ..data import build_prompt

PROBLEMS = ("What is 2+3?", "Add 4 and 5.", "What is 10-7?", "Compute 6*2.")
ANSWERS = ("5", "9", "3", "12")


def arithmetic_dataset():
    """The four problems as GRPO rows: `prompt` (the parallel template) and `answer`."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [build_prompt(p) for p in PROBLEMS], "answer": list(ANSWERS)})


def length_reward(completions, **kwargs) -> list[float]:
    """A reward with spread inside every group, so advantages (and the loss) are never all zero."""
    return [float(len(c[0]["content"]) % 7) for c in completions]


def tiny_grpo_config(output_dir, **overrides):
    """`ParallelGRPOConfig` for a CPU run of two steps, four prompts of four completions, short budgets; `overrides`
    replace any field."""
    from ..configs import ParallelGRPOConfig

    settings = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=48,
        max_path_tokens=12,
        max_summary_tokens=6,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    return ParallelGRPOConfig(**{**settings, **overrides})


def tiny_grpo_trainer(model_dir, args, dataset=None, rewards=None):
    """`ParallelGRPOTrainer` on the float32 model and tokenizer of `model_dir`, the arithmetic rows by default,
    rewarded by `length_reward` by default."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..trainers import ParallelGRPOTrainer

    return ParallelGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32"),
        reward_funcs=rewards if rewards is not None else [length_reward],
        args=args,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        train_dataset=dataset if dataset is not None else arithmetic_dataset(),
    )
