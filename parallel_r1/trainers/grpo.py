"""`ParallelGRPOTrainer`: TRL's GRPO with fork-join rollouts and the isolated structure.

Two things change, each in one place; everything else (loss types, clipping, importance sampling,
checkpointing, logging, Hub push) is stock TRL:

- Generation goes through TRL's `rollout_func` hook: the fork-join engine (`parallel_r1.rollout`)
  returns the completion ids, the sampler's log-probs and `env_mask` (0 on the tokens the runtime
  inserted), which TRL turns into its tool mask, so inserted tokens get no gradient.
- The log-prob forward (`_get_per_token_logps_and_entropies`, used for the loss, the old and the
  reference log-probs) scores engine rollouts under the tag grammar the sampler applied, and with
  `attention="isolated"` or `"tree"` runs the model on that structure; both are recomputed from the token ids.

Both go through one `policy.ParallelPolicy` of the run's tokenizer and config (`self.policy`), which also measures
the completions.

`tag_lr_multiplier` gives the tag rows their own learning rate (`tag_rate.TagRateMixin`, shared with SFT).

With `log_completions`, each completions table TRL saves gets a rollout viewer page beside it (`rollout_viewer`).

After each generation it logs the shape of the completions under `parallel/` (`policy.shape_metrics`, as the
evaluation tables have it) and, where TRL does not already (it does with vLLM and importance-sampling correction
on), the gap between the sampler's and the trainer's log-probs.

Checkpoints also carry the engine's random stream (`_save_rng_state`, `_load_rng_state`), so that a resumed run
samples what the unbroken run would have.
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import contextmanager, nullcontext

import torch
from accelerate.utils import broadcast_object_list, gather_object
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation

from ..configs import ParallelGRPOConfig
from ..evaluation.callback import InTrainingEvaluation
from ..policy import ParallelPolicy, shape_metrics
from ..rollout import Sampling
from ..rollout.arguments import paths_at_once
from ..rollout.vllm_backend import MAX_REQUESTS_IN_FLIGHT, keep_cpu_linear_weights
from ..structure import check_attention_implementation
from .card import ModelCardMixin
from .colocated_vllm import colocated_rollouts, group_seed, room_for_paths
from .rollout_viewer import RolloutViewer
from .tag_rate import TagRateMixin

logger = logging.getLogger(__name__)

ENGINE_RNG_FILE = "engine_rng_state_{}.pth"  # one per process, in each checkpoint


def _zero3(args) -> bool:
    """Whether the run is under DeepSpeed ZeRO-3 (`accelerate launch` with a DeepSpeed config, or `--deepspeed`)."""
    plugin = getattr(args, "deepspeed_plugin", None)
    return plugin is not None and plugin.hf_ds_config.is_zero3()


@contextmanager
def _without_zero3_step_hook(engine):
    """DeepSpeed ZeRO-3's start-of-forward hook taken off `engine`'s module for the duration, put back first in line.

    TRL's gather for generation removes ZeRO-3's hooks on the modules but keeps this one, whose `reset_step` is a
    collective (the processes compare their traces of the modules) until a trace is complete: the first forwards
    after each training step. The engine schedules each process's completions on their own, so processes make
    different numbers of forwards (one whose completions all end at their first token makes one) and the first
    forwards of one would wait forever for the other's. On gathered weights the hook has nothing to do."""
    offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
    handle = getattr(offload, "fwd_pre_hook", None)
    if handle is None:  # not ZeRO-3, or before DeepSpeed set its hooks up
        yield
        return
    hook = offload.module._forward_pre_hooks[handle.id]
    handle.remove()
    try:
        yield
    finally:
        offload.fwd_pre_hook = offload.module.register_forward_pre_hook(hook, prepend=True)


def check_zero3_generation(args: ParallelGRPOConfig) -> None:
    """Refuse `ds3_gather_for_generation=false` under ZeRO-3 when the engine samples with the transformers backend.

    Without the gather every forward of the sharded model is a collective (each layer's weights are fetched from
    the other processes), and the engine's decode loop runs as many forwards as this process's own completions
    need: processes that decode different lengths wait on each other's collectives and hang, or pair up the wrong
    ones. TRL's own generation (`rollout_mode="plain"`) keeps the processes in step (transformers' `synced_gpus`), and
    with vLLM the engine makes no collective (TRL's weight sync gathers parameter by parameter, in step)."""
    if args.rollout_mode != "plain" and not args.use_vllm and not args.ds3_gather_for_generation and _zero3(args):
        raise ValueError(
            "ds3_gather_for_generation=false under DeepSpeed ZeRO-3 with the fork-join engine on transformers: every "
            "forward of the sharded model is a collective and the processes decode different lengths, so they "
            "would hang; set ds3_gather_for_generation true (or use_vllm true)"
        )


def corrected_weights(ratio, mask, mode: str, clip_min: float | None, clip_max: float | None) -> tuple[int, int]:
    """How many of TRL's importance weights its correction changed, and of how many: set to 0 (the mask modes) or
    held at a clip bound (the truncate modes); one weight a completion in the sequence modes, one a sampled token
    (`mask`) in the others. A bound of None is no bound, as TRL reads it."""
    weights = ratio.flatten() if mode.startswith("sequence") else ratio[mask.bool()]
    if mode.endswith("mask"):
        changed = weights == 0
    else:
        high = math.inf if clip_max is None else clip_max
        low = -math.inf if clip_min is None else clip_min
        changed = (weights >= high) | (weights <= low)
    return int(changed.sum()), weights.numel()


def generation_banner(args: ParallelGRPOConfig) -> str:
    """What one generation samples (TRL's `generation_batch_size`, over every process) and how many optimizer steps
    train on it (TRL generates every `steps_per_generation x num_iterations` batches)."""
    completions = args.generation_batch_size
    steps = args.steps_per_generation * args.num_iterations / args.gradient_accumulation_steps
    rollout = "plain decodes" if args.rollout_mode == "plain" else f"{args.rollout_mode} rollouts"
    return (
        f"each generation samples {completions} completions ({completions // args.num_generations} prompts x "
        f"{args.num_generations}, {rollout}, at most {args.max_completion_length} tokens each) over "
        f"{args.world_size} process(es), and {steps:g} optimizer step(s) train on them"
    )


class ParallelGRPOTrainer(ModelCardMixin, TagRateMixin, GRPOTrainer):
    def __init__(self, model, reward_funcs, args: ParallelGRPOConfig, processing_class=None, **kwargs):
        if not isinstance(args, ParallelGRPOConfig):
            raise TypeError(f"args must be a ParallelGRPOConfig, got {type(args).__name__}")
        if "rollout_func" in kwargs:
            raise ValueError(
                "ParallelGRPOTrainer generates with its own rollout_func; set rollout_mode='plain' instead"
            )
        uses_engine = args.rollout_mode != "plain"
        check_zero3_generation(args)
        if args.use_vllm and args.vllm_mode == "colocate":
            keep_cpu_linear_weights()  # on CPU only: TRL's weight sync needs the weights vLLM would repack
        if uses_engine:
            os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL's documented hook
            kwargs["rollout_func"] = self._fork_join_rollout
        with room_for_paths(args) if uses_engine else nullcontext():
            super().__init__(
                model=model, reward_funcs=reward_funcs, args=args, processing_class=processing_class, **kwargs
            )
        # what the engine samples under and the log-prob forward re-applies: one policy of the same tokens
        self.policy = ParallelPolicy(self._tokenizer, args, self.eos_token_ids)
        if args.attention != "causal":
            check_attention_implementation(self.accelerator.unwrap_model(self.model))
        self._backend = None  # the rollout backend, built at the first generation (`_sampler`)
        self._resumed_engine_rng = None  # a checkpoint's engine stream, applied at the next generation
        if args.parallel_eval_steps > 0:
            self.add_callback(InTrainingEvaluation(self))
        viewer = args.log_completions and args.viewer_completions > 0
        self._rollout_viewer = RolloutViewer(self) if viewer else None  # a page beside each completions table
        if self._rollout_viewer is not None:
            self.add_callback(self._rollout_viewer)
        self._generations = self._generations_shown = 0  # generations made, and the last whose completions printed
        if self.accelerator.is_main_process:
            logger.info(generation_banner(args))

    @property
    def _bar(self) -> bool:
        """Whether this process shows a generation's progress: the main one, unless `disable_tqdm`."""
        return self.accelerator.is_main_process and not self.args.disable_tqdm

    # ------------------------------------------------------------------ generation

    def _fork_join_rollout(self, prompts: list, trainer) -> dict:
        """TRL's rollout_func: template and tokenize the prompts as TRL does, then run the engine."""
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        prompt_ids = [list(ids) for ids in prompt_ids]
        if self.use_vllm and self.vllm_generation.mode == "server":
            rollouts = self._rollouts_on_main_process(prompt_ids)
        else:
            rollouts = self._rollouts(prompt_ids)
        return {
            "prompt_ids": [r.prompt_ids for r in rollouts],
            "completion_ids": [r.completion_ids for r in rollouts],
            "logprobs": [r.logprobs for r in rollouts],
            "env_mask": [r.env_mask for r in rollouts],
        }

    def _sampling(self) -> Sampling:
        """The policy's sampling with one random stream per process, since TRL spreads the copies of a prompt over
        the processes and equal streams would draw equal completions; one per tensor-parallel group of a colocated
        vLLM (its processes decode the same completions: `colocated_vllm`)."""
        return self.policy.sampling(group_seed(self.args.seed, self.accelerator.process_index, self._stream_group()))

    def _stream_group(self) -> int:
        """How many consecutive processes share one random stream: a colocated vLLM's tensor-parallel group."""
        colocated = self.use_vllm and self.vllm_generation.mode == "colocate"
        return self.args.vllm_tensor_parallel_size if colocated else 1

    def _sampler(self, build):
        """This process's backend (built by `build` the first time), kept across generations so that the
        generator which seeds each generation's completions runs on, and is checkpointed (`_save_rng_state`)."""
        if self._backend is None:
            self._backend = build()
        if self._resumed_engine_rng is not None:
            self._backend.generator.set_state(self._resumed_engine_rng)
            self._resumed_engine_rng = None
        return self._backend

    def _rollouts(self, prompt_ids: list) -> list:
        if self.use_vllm:  # colocate: the vLLM engine TRL holds, driven as TRL drives it (`colocated_vllm`)
            generation = self.vllm_generation
            backend = self._sampler(lambda: self.policy.backend(self._sampling(), llm=generation.llm))
            return colocated_rollouts(
                generation, prompt_ids, lambda prompts: self.policy.rollouts(backend, prompts, progress=self._bar)
            )
        with self._generation_model() as model:
            backend = self._sampler(lambda: self.policy.backend(self._sampling(), model=model))
            backend.model = model
            return self.policy.rollouts(backend, prompt_ids, progress=self._bar)

    def evaluation_rollouts(self, prompt_ids: list, seed: int) -> list:
        """Rollouts of the current weights with the training rollout settings, on the transformers backend and a
        random stream of their own (the training stream is not touched). For in-training evaluation."""
        with self._generation_model() as model:
            backend = self.policy.backend(self.policy.sampling(seed), model=model)
            return self.policy.rollouts(backend, prompt_ids)

    @contextmanager
    def _generation_model(self):
        """The model with full parameters for generation (ZeRO-3 gathered, FSDP summoned), without gradients."""
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
            _without_zero3_step_hook(self.model_wrapped),
        ):
            yield model

    def _rollouts_on_main_process(self, prompt_ids: list) -> list:
        """Server mode: the main process drives the engine for every process, as TRL does for plain vLLM, with a
        request in flight for every segment a generation can decode at once (up to `MAX_REQUESTS_IN_FLIGHT`). A
        failure there is raised on every process (the others would wait for its answer until the process group's
        timeout)."""
        shares = gather_object([prompt_ids])
        everyone = [prompt for share in shares for prompt in share]
        payload = [None]
        if self.accelerator.is_main_process:
            try:
                segments = self.args.generation_batch_size * paths_at_once(self.args)
                backend = self._sampler(
                    lambda: self.policy.backend(
                        self._sampling(),
                        client=self.vllm_generation.vllm_client,
                        ban_words=self.policy.ban_words(),
                        max_concurrent_requests=min(segments, MAX_REQUESTS_IN_FLIGHT),
                    )
                )
                payload = [self.policy.rollouts(backend, everyone, progress=self._bar)]
            except Exception as error:  # noqa: BLE001 - raised below, on every process
                payload = [error]
        broadcast_object_list(payload, from_process=0)
        if isinstance(payload[0], Exception):
            if self.accelerator.is_main_process:
                raise payload[0]
            raise RuntimeError(f"the main process's rollouts failed: {payload[0]!r}")
        start = sum(len(share) for share in shares[: self.accelerator.process_index])
        return payload[0][start : start + len(prompt_ids)]

    # ------------------------------------------------------------------ checkpoints

    def _save_rng_state(self, output_dir: str) -> None:
        """Transformers' RNG states, plus the generator that seeds this process's completions (either backend) in
        `engine_rng_state_{process_index}.pth`."""
        super()._save_rng_state(output_dir)
        if self._backend is not None:
            state = self._backend.generator.get_state()
            torch.save(state, os.path.join(output_dir, ENGINE_RNG_FILE.format(self.args.process_index)))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Restore what `_save_rng_state` saved; the engine stream resumes at the next generation.

        Every completion draws from its own seed, and the seeds come from this generator, so a resumed run gives
        its completions the seeds of the unbroken run: the same tokens with the transformers backend when the
        checkpoint ends a generation cycle (see `_warn_if_mid_generation`); with vLLM the same requests with the
        same seeds, whose tokens are the same up to vLLM's batch variance (its kernels are not batch-invariant).
        A checkpoint without the engine file (older versions) is resumed with the stream seeded afresh, after a
        warning. `rollout_mode="plain"` samples from torch's global generator, which transformers restores.
        """
        super()._load_rng_state(checkpoint)
        if checkpoint is None or self.policy.tokens is None:
            return
        self._warn_if_mid_generation()
        if self.use_vllm and self.vllm_generation.mode == "server" and not self.accelerator.is_main_process:
            return  # in server mode the main process samples for all (`_rollouts_on_main_process`)
        process = self.args.process_index
        process -= process % self._stream_group()  # a tensor-parallel group resumes its first process's stream
        path = os.path.join(checkpoint, ENGINE_RNG_FILE.format(process))
        if not os.path.isfile(path):
            logger.warning("%s is missing (an older checkpoint): the engine samples from its seed again", path)
            return
        self._resumed_engine_rng = torch.load(path, weights_only=True)

    def _warn_if_mid_generation(self) -> None:
        """TRL generates once per `steps_per_generation * num_iterations` micro-steps and reuses the buffered
        batch in between; the buffer is not in the checkpoint, so a resume inside such a cycle generates anew
        and is not the unbroken run (choose save_steps so that checkpoints end cycles)."""
        cycle = self.args.steps_per_generation * self.num_iterations
        micro_steps = self.state.global_step * self.args.gradient_accumulation_steps
        if micro_steps % cycle:
            logger.warning(
                "Resuming at step %d, inside a generation cycle of %d micro-steps: the buffered completions are "
                "not in the checkpoint, so the resumed run samples anew and differs from the unbroken one",
                self.state.global_step,
                cycle,
            )

    # ------------------------------------------------------------------ the structured forward

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        model = self.policy.training_forward(model, input_ids.size(1) - logits_to_keep, sampled=True)
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )

    # ------------------------------------------------------------------ metrics

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self._generations += 1
        mode = "train" if self.model.training else "eval"
        if self.policy.vocab is not None or self._rollout_viewer is not None:
            completions = [
                ids[m.bool()].tolist() for ids, m in zip(output["completion_ids"], output["completion_mask"])
            ]
            shapes = [self.policy.shape(ids) for ids in completions]  # this process's, measured once
            if self._rollout_viewer is not None:
                self._rollout_viewer.keep(inputs, shapes)
            if self.policy.vocab is not None:
                self._log_shapes(completions, shapes, mode)
        if self.args.measure_sampling_mismatch and "sampling_per_token_logps" in output:
            if not (self.use_vllm and self.vllm_importance_sampling_correction):  # TRL logs it in that case
                self._log_mismatch(output, mode)
        if "importance_sampling_ratio" in output:
            self._log_clipped(output, mode)
        return output

    def log(self, logs: dict, *args, **kwargs) -> None:
        """TRL's log, whose completions table (printed, written and sent to the trackers with `log_completions`) is
        that of the last generation: shown at the first log after it, not again at each step it trains."""
        fresh = self._generations != self._generations_shown
        self._generations_shown = self._generations
        shown, self.log_completions = self.log_completions, self.log_completions and fresh
        try:
            super().log(logs, *args, **kwargs)
        finally:
            self.log_completions = shown

    def _log_clipped(self, output: dict, mode: str) -> None:
        """The share of TRL's importance weights its correction changed (`corrected_weights`), over every process."""
        args, ratio = self.args, output["importance_sampling_ratio"]
        mask = output["completion_mask"] * output.get("tool_mask", torch.ones_like(output["completion_mask"]))
        changed, total = corrected_weights(
            ratio,
            mask,
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
        )
        counts = torch.tensor([[changed, total]], dtype=torch.float64, device=ratio.device)
        clipped, total = self.accelerator.gather(counts).sum(0).tolist()
        self._metrics[mode]["sampling/importance_weights_clipped"].append(clipped / total if total else 0.0)

    def _log_shapes(self, completions: list, shapes: list, mode: str) -> None:
        """`policy.shape_metrics` of every process's completions (this one's `shapes` of its `completions`), as
        `parallel/<name>` (`parallel/ratio` for the parallel ratio); under `tree`, also the copies of later paths
        its training forward adds, per completion."""
        shapes = gather_object(shapes)
        metrics = self._metrics[mode]
        for name, value in shape_metrics(shapes).items():  # every shape here has its self-BLEU
            metrics[f"parallel/{name.removeprefix('parallel_')}"].append(value)
        if self.args.attention == "tree":
            copied = [
                sum(path.length for b in self.policy.parse(ids).blocks for path in b.paths[1:]) for ids in completions
            ]
            metrics["parallel/tree_extra_tokens"].append(sum(gather_object(copied)) / len(shapes))

    @torch.no_grad()
    def _log_mismatch(self, output: dict, mode: str) -> None:
        trained = output.get("old_per_token_logps")
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        mask = output["completion_mask"] * output.get("tool_mask", torch.ones_like(output["completion_mask"]))
        if trained is None:
            trained, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1),
                output["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        gap = (trained - output["sampling_per_token_logps"]).abs()[mask.bool()]
        gap = gap[~torch.isnan(gap)]
        mean = self.accelerator.gather(gap.mean() if gap.numel() else gap.new_zeros(())).mean().item()
        worst = self.accelerator.gather(gap.max() if gap.numel() else gap.new_zeros(())).max().item()
        self._metrics[mode]["sampling/sampling_logp_difference/mean"].append(mean)
        self._metrics[mode]["sampling/sampling_logp_difference/max"].append(worst)
