"""Strategy-evolution plots from evaluation folders (one per checkpoint) and/or a trainer_state.json, and the
paper's table with one row per evaluation folder (table.md); with `--baseline`, every model against that one.

    python scripts/plot.py --evaluations outputs/eval/step-100 outputs/eval/step-200 \
        --trainer_state outputs/run/checkpoint-200/trainer_state.json --output_dir outputs/plots
    python scripts/plot.py --evaluations outputs/eval/grpo outputs/eval/parallel-r1 --baseline grpo \
        --output_dir outputs/plots
"""

import argparse
from pathlib import Path

from parallel_r1.cli import run
from parallel_r1.evaluation.plots import (
    load_evaluations,
    over_training_steps,
    plot_evaluations,
    plot_trainer_state,
)
from parallel_r1.evaluation.report import difference_table, markdown_table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--evaluations", nargs="*", default=[], help="Folders written by scripts/evaluate.py.")
    parser.add_argument("--trainer_state", default=None, help="A trainer_state.json of a ParallelGRPOTrainer run.")
    parser.add_argument("--output_dir", required=True, help="Where the PNG files go.")
    parser.add_argument(
        "--baseline",
        default=None,
        help="The label of one of the --evaluations: table.md then also shows every other model's mean minus this "
        "one's, with the standard error of the difference paired by problem.",
    )
    args = parser.parse_args(argv)
    if not args.evaluations and not args.trainer_state:
        parser.error("give --evaluations folders, a --trainer_state file, or both")
    if args.baseline and not args.evaluations:
        parser.error("--baseline names one of the --evaluations: give them")
    output = Path(args.output_dir)
    written = []
    if args.evaluations:
        runs = load_evaluations(args.evaluations)
        written += plot_evaluations(runs, output)
        steps = over_training_steps([results for _, results, _ in runs])
        rows = [_with_step(results) if steps else results for _, results, _ in runs]
        table = markdown_table(rows)
        if args.baseline:
            table += "\n\n" + difference_table([(results, records) for _, results, records in runs], args.baseline)
        (output / "table.md").write_text(table + "\n")
        print(table)
        written.append(output / "table.md")
    if args.trainer_state:
        written += plot_trainer_state(Path(args.trainer_state), output)
    for path in written:
        print(path)


def _with_step(results: dict) -> dict:
    """The results with their training step (when known) in the table's label."""
    step = results["model"].get("step")
    return results if step is None else {**results, "label": f"{results['label']} (step {step})"}


if __name__ == "__main__":
    run(main)
