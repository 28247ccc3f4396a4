"""Evaluate a model on the paper's benchmarks with the rollout of training, and print the paper's table.

    python scripts/evaluate.py --config recipes/Qwen3-4B-Base/eval/paper.yaml \
        --model_name_or_path <checkpoint folder or Hub id> --output_dir outputs/eval/<name>

    accelerate launch scripts/evaluate.py --config ...   # transformers backend, data-parallel over GPUs

The recipe fills `parallel_r1.configs.EVAL_ARGUMENTS`; command-line flags override it. The output folder gets
results.json (every number, the settings, versions, the model's revision and step), table.md, completions.jsonl
and viewer.html, a page to open in a browser that shows each completion with its blocks' paths side by side
(`parallel_r1.evaluation.viewer`); an interrupted run restarted with the same arguments samples only what is
missing.
"""

import logging

from parallel_r1.cli import check_named_model, run


def main() -> None:
    check_named_model()  # a mistyped model folder fails before the parse loads torch and transformers
    from parallel_r1.configs import eval_parser

    config, model_args = eval_parser().parse_args_and_config()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    from parallel_r1.evaluation.runner import evaluate  # after parsing: --help answers without loading it

    evaluate(config, model_args)


if __name__ == "__main__":
    run(main)
