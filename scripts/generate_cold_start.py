"""Cold-start data: a teacher answers problems in the parallel format; well-formed, correct answers become SFT traces.

    python scripts/generate_cold_start.py --config recipes/DeepSeek-R1-0528-Qwen3-8B/cold_start/gsm8k.yaml

    python scripts/generate_cold_start.py --config recipes/tiny/cold_start.yaml   # CPU, the tiny stand-in teacher

The recipe fills `parallel_r1.cold_start.ColdStartConfig`; command-line flags override it. The output folder gets
samples.jsonl (every answer, kept as it arrives), train.parquet (for scripts/sft.py: `dataset_name:
<output_dir>/train.parquet`), rejected.jsonl and report.md/json/png. A run stopped at any point and started again
with the same arguments keeps what it has and asks only for the answers it lacks.
"""

import logging

from parallel_r1.cli import run
from parallel_r1.configs import cold_start_parser


def main() -> None:
    (config,) = cold_start_parser().parse_args_and_config()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    from parallel_r1.cold_start import generate_cold_start  # after parsing: --help answers without loading it

    generate_cold_start(config)


if __name__ == "__main__":
    run(main)
