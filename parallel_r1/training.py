"""What both training scripts do around their trainer: logging, loading the model, training, saving."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from .cli import check_model_path
from .model_settings import record_settings, write_settings
from .rollout import RolloutArguments

logger = logging.getLogger(__name__)


# Loggers held at WARNING unless log_level is debug: transformers' modules that at INFO print a whole config (model,
# generation) each time one is loaded or saved, four dumps a stage; vLLM's notes, on a CPU machine, that Triton
# has no CPU backend.
QUIET_LOGGERS = (
    "transformers.configuration_utils",
    "transformers.generation.configuration_utils",
    "vllm.triton_utils.importing",
)


def setup_logging(training_args) -> None:
    """`log_level` on the main process, `log_level_replica` on the others, for us and for transformers (its config
    dumps only at debug: `QUIET_LOGGERS`)."""
    level = training_args.get_process_log_level()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level)
    transformers.utils.logging.set_verbosity(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else max(level, logging.WARNING))


def load_tokenizer(model_args, training_args):
    check_model_path(model_args.model_name_or_path)
    return AutoTokenizer.from_pretrained(model_args.model_name_or_path, **_load_kwargs(model_args, training_args))


def load_model(model_args, training_args):
    """The causal LM of TRL's ModelConfig: its path, revision, dtype and attention implementation."""
    return AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        dtype=model_args.dtype,
        attn_implementation=model_args.attn_implementation,
        **_load_kwargs(model_args, training_args),
    )


def resume_target(value, output_dir: str) -> str | None:
    """The checkpoint `--resume_from_checkpoint` names: a folder, or with `true` (or `last`) the newest complete
    `checkpoint-*` of `output_dir` (one with a whole trainer_state.json, which the trainer writes last: a run killed
    while saving leaves a newer folder without it, or with half of it); None for nothing or `false`. A folder that is not there is an
    error."""
    if value is None or str(value).lower() in ("", "false", "no", "0", "none"):
        return None
    if str(value).lower() in ("true", "yes", "1", "last"):
        last = _last_complete_checkpoint(Path(output_dir))
        if last is None:
            raise FileNotFoundError(
                f"--resume_from_checkpoint {value}: no complete checkpoint-* folder in {output_dir}"
            )
        return last
    if not Path(value).is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {value}: no such checkpoint folder")
    return str(value)


def _last_complete_checkpoint(output_dir: Path) -> str | None:
    steps = [
        int(m.group(1)) for d in output_dir.glob("checkpoint-*") if (m := re.fullmatch(r"checkpoint-(\d+)", d.name))
    ]
    torn = []
    for step in sorted(steps, reverse=True):
        folder = output_dir / f"checkpoint-{step}"
        if _readable_json(folder / "trainer_state.json"):
            if torn:
                logger.warning("Skipping %s: no whole trainer_state.json (a save cut short)", ", ".join(torn))
            return str(folder)
        torn.append(folder.name)
    return None


def _readable_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


def train_and_save(
    trainer, training_args, dataset_name: str, settings: RolloutArguments, recipe: str | None = None
) -> None:
    """Train (resuming if asked: `resume_target`), save to output_dir with the parallel `settings` recorded in the
    model's config and in parallel_r1.json (`scripts/generate.py` reads them back), push if asked.

    Next to the model go the run's records, as transformers' example scripts write them: trainer_state.json (every
    logged metric by step), train_results.json and all_results.json; training_curves.png, drawn from the state
    as `scripts/plot.py --trainer_state` draws it; and the model card, README.md (`trainers.card`: it names the
    `recipe` file and `dataset_name`)."""
    resume = resume_target(training_args.resume_from_checkpoint, training_args.output_dir)
    if resume:
        logger.info("Resuming from %s", resume)
    record_settings(trainer.accelerator.unwrap_model(trainer.model), settings)  # checkpoints carry them too
    trainer.recipe, trainer.dataset_name = recipe, dataset_name  # for the model card of each save
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except (ValueError, FileNotFoundError) as error:  # not a setting of the user's: keep the traceback
        raise RuntimeError(f"training stopped: {error}") from error
    trainer.save_model(training_args.output_dir)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    if trainer.accelerator.is_main_process:
        write_settings(training_args.output_dir, settings)
        _plot_curves(Path(training_args.output_dir))
        trainer.create_model_card()  # also with save_strategy "no", when TRL has written none
    logger.info("Model saved to %s", training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)
    trainer.accelerator.wait_for_everyone()  # no process exits while the main one still writes


def _plot_curves(output_dir: Path) -> None:
    from .evaluation.plots import plot_trainer_state

    try:
        plot_trainer_state(output_dir / "trainer_state.json", output_dir)
    except ValueError as error:  # nothing logged (a run shorter than logging_steps): no curve to draw
        logger.warning("No training curves: %s", error)


def _load_kwargs(model_args, training_args) -> dict:
    return {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code}


def exit_launched_process(trainer) -> None:
    """End a script launched on several processes, once its model is saved: destroy the `trainer`'s DeepSpeed
    engine (its hooks and optimizer state; accelerate's `free_memory`) and the process group, run the exit handlers
    (logging's flush, a tracker's finish), then leave with code 0 without the interpreter's teardown (`os._exit`).

    Why the last step: in that teardown a ZeRO-3 process now and then aborts after its model is saved ("terminate
    called without an active exception": a C++ thread destroyed while still joinable), and the launcher then
    reports the whole run as failed. Seen in 2 of 4 CI runs before the group was destroyed here, and in 2 since;
    not reproduced in 17 launches on the same machine. Everything the run writes is written and closed by then.
    A single process returns as usual: an in-process caller (a test, a notebook) may still use its group."""
    import atexit

    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if dist.is_available() and dist.is_initialized():
        try:
            trainer.accelerator.free_memory()  # also collects garbage
        finally:
            dist.destroy_process_group()
    atexit._run_exitfuncs()  # the handlers a normal exit runs (logging's among them)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
