"""Serving a trained model behind the OpenAI API with its structure: requests decoded together as they arrive
(`scheduler`), over HTTP (`api`). `scripts/serve.py` is the command."""

from .api import Served, create_app, structure
from .scheduler import Busy, Closed, Job, Scheduler, Update


def context_length(model_path: str, backend_args=None) -> int:
    """The most tokens a prompt and its completion may hold together: the model's positions, or the offline vLLM
    engine's `vllm_max_model_length` when one is set."""
    from transformers import AutoConfig

    positions = AutoConfig.from_pretrained(model_path).get_text_config().max_position_embeddings
    limit = getattr(backend_args, "vllm_max_model_length", None)
    return min(positions, limit) if limit and getattr(backend_args, "backend", None) == "vllm" else positions


__all__ = ["Busy", "Closed", "Job", "Scheduler", "Served", "Update", "context_length", "create_app", "structure"]
