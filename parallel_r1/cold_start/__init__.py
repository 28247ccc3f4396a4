"""Cold-start data: a teacher answers problems in the parallel format, the answers are filtered into SFT traces.

    from parallel_r1.cold_start import ColdStartConfig, generate_cold_start
    report = generate_cold_start(ColdStartConfig(output_dir=..., model_name_or_path=..., ...))

`config` (the recipe's keys), `teachers` (transformers, offline vLLM, OpenAI-compatible servers), `filters` (the
rules and the normalisation), `report` (figures, markdown, plot), `pipeline` (the resumable run).
"""

from .config import ColdStartConfig
from .filters import RULES, clean_answer, judge, normalize_trace, select
from .pipeline import generate_cold_start

__all__ = ["RULES", "ColdStartConfig", "clean_answer", "generate_cold_start", "judge", "normalize_trace", "select"]
