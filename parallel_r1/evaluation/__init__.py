"""Evaluation: sample the benchmarks with the rollout of training, score, and report the paper's table.

- `config`: `EvaluationConfig`, what an evaluation recipe sets.
- `runner`: `evaluate`, the sampling loop (resumable, data-parallel on transformers, vLLM offline or server).
- `records`: one JSON line per completion; everything is computed from them.
- `metrics`: mean@k, exact pass@k, cons@k, standard errors, the shape of the completions (definitions there).
- `report`: the markdown tables; `plots`: the strategy-evolution PNGs; `callback`: evaluation during training.
"""

from .config import EvaluationConfig
from .metrics import benchmark_metrics, pass_at_k, summarize
from .report import markdown_table

__all__ = ["EvaluationConfig", "benchmark_metrics", "markdown_table", "pass_at_k", "summarize"]
