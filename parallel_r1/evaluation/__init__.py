"""Evaluation: sample the benchmarks with the rollout of training, score, and report the paper's table.

- `config`: `EvaluationConfig`, what an evaluation recipe sets.
- `runner`: `evaluate`, the sampling loop (resumable, data-parallel on transformers, vLLM offline or server).
- `records`: one JSON line per completion; everything is computed from them.
- `metrics`: mean@k, exact pass@k, cons@k, standard errors, the shape of the completions (definitions there).
- `report`: the markdown tables; `plots`: the strategy-evolution PNGs; `callback`: evaluation during training.
- `viewer`: the rollout viewer, one HTML page that shows each completion's blocks with their paths side by side.
"""

import importlib

# Each name is imported on first use: the config loads torch and transformers (seconds), which the viewer's command
# and the tables never need.
_MODULES = {
    "EvaluationConfig": ".config",
    "benchmark_metrics": ".metrics",
    "pass_at_k": ".metrics",
    "summarize": ".metrics",
    "markdown_table": ".report",
}
__all__ = list(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name], __name__), name)
