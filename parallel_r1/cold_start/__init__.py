"""Cold-start data: a teacher answers problems in the parallel format, the answers are filtered into SFT traces.

    from parallel_r1.cold_start import ColdStartConfig, generate_cold_start
    report = generate_cold_start(ColdStartConfig(output_dir=..., model_name_or_path=..., ...))

`config` (the recipe's keys), `teachers` (transformers, offline vLLM, OpenAI-compatible servers), `filters` (the
rules and the normalisation), `report` (figures, markdown, plot), `pipeline` (the resumable run). Importing the
package loads only its config (and TRL's `ScriptArguments`, which the config extends); the rest loads on first use.
"""

from .config import ColdStartConfig

_LAZY = {
    "RULES": "filters",
    "clean_answer": "filters",
    "judge": "filters",
    "normalize_trace": "filters",
    "select": "filters",
    "generate_cold_start": "pipeline",
}
__all__ = ["ColdStartConfig", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
