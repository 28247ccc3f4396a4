"""The names of other libraries that our code relies on without the library's promise to keep them, in one place.

The rule: wherever our code (parallel_r1/, scripts/, benchmarks/) uses a name of TRL, transformers, vLLM, peft,
DeepSpeed, accelerate or torch that the library does not document as public (an underscore name, an undocumented
attribute, an internal import path, a module global we replace, a convention of how the library calls what we hand
it or what we mimic), the name has an entry here. Any release may move such a name: an override the parent no
longer calls is dead code that fails silently, and an attribute read that vanished fails mid-run.
`tests/test_private_members.py` checks every entry against the installed libraries, so an upgrade that moves one
fails by name, at once.

An entry names the owner (an importable dotted path: a class, a module or a function), the member, its kind, what
our code does with it (`use`) and what the test checks (`checks`), which depends on the kind:

- `overridden method`: a method our subclass overrides. checks: its parameters (below). The test also finds
  `self.<member>(` in the owner's source: the parent still calls it.
- `called method`: a method our code calls. checks: its parameters.
- `module global`: a module's attribute our code imports, calls or replaces. checks: its parameters, if any.
- `instance attribute`: set on the owner's instances. checks: the owner's methods whose source assigns
  `self.<member> = ...`.
- `class attribute`: in the owner's own class namespace.
- `property`: a property of the owner. checks: "setter" where our code sets it.
- `fields`: `owner.member` is a dataclass, a msgspec struct or an enum. checks: the fields (members) it must have.
- `output keys`: `owner.member` is a function. checks: keys of the dict it returns (each quoted in its source).
- `call convention`: how the library calls what we hand it, replace or mimic. checks: snippets that must appear, as
  written, in the source of `owner.member`.
- `foreign attribute`: an attribute the library sets on objects of another class (a torch parameter). The owner is
  the class or function whose source sets it. checks: the name of the object there (`<object>.<member> = ...`).
- `module`: `owner.member` is a module our code imports from, runs (`python -m`) or names a logger after.

Parameters: the names before a "/" are the leading parameters (after `self`), in that order: we pass them by
position. The names after it (all of them, without one) must be parameters too: we pass them by keyword.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KINDS", "OPTIONAL", "PRIVATE_NAMES", "PrivateName"]

KINDS = (
    "overridden method",
    "called method",
    "module global",
    "instance attribute",
    "class attribute",
    "property",
    "fields",
    "output keys",
    "call convention",
    "foreign attribute",
    "module",
)
OPTIONAL = ("vllm", "deepspeed")  # setup.py extras: the checks of their names need them installed


@dataclass(frozen=True)
class PrivateName:
    owner: str
    member: str
    kind: str
    use: str
    checks: tuple[str, ...] = ()
    needs: str | None = None  # the optional library (OPTIONAL) the check imports

    @property
    def library(self) -> str:
        return self.owner.split(".")[0]


GRPO = "trl.trainer.grpo_trainer.GRPOTrainer"
SFT = "trl.trainer.sft_trainer.SFTTrainer"
VLLM_GENERATION = "trl.generation.vllm_generation.VLLMGeneration"
TRAINER = "transformers.trainer.Trainer"
CONFIG = "transformers.configuration_utils.PreTrainedConfig"
QWEN3_ATTENTION = "transformers.models.qwen3.modeling_qwen3.Qwen3Attention"
LLM = "vllm.entrypoints.llm.LLM"
ENGINE = "vllm.v1.engine.llm_engine.LLMEngine"
TOKENS_LAYER = "peft.tuners.trainable_tokens.layer.TrainableTokensLayer"
ZERO3_INIT = "deepspeed.runtime.zero.partition_parameters.Init"
OFFLOAD = "deepspeed.runtime.zero.parameter_offload.DeepSpeedZeRoOffload"
PLUGIN = "accelerate.utils.dataclasses.DeepSpeedPlugin"

P = PrivateName
PRIVATE_NAMES = (
    # ---------------------------------------------------------------- TRL: GRPO
    P(GRPO, "_generate_and_score_completions", "overridden method",
      "trainers/grpo.py logs the completions' shapes, the sampler gap and the corrected importance weights after it "
      "(benchmarks/bench_trainer.py times it)", ("inputs", "/")),
    P(GRPO, "_generate_and_score_completions", "output keys", "what that logging reads from its output",
      ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "old_per_token_logps",
       "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask")),
    P(GRPO, "_generate_and_score_completions", "call convention",
      "trainers/grpo.py logs the sampler gap under TRL's names, where TRL does not (vLLM with its correction on); "
      "trainers/rollout_viewer.py reads `_logs` as every process's completions in order, a prompt's samples together",
      ('"sampling/sampling_logp_difference/mean"', '"sampling/sampling_logp_difference/max"',
       "if self.use_vllm and self.vllm_importance_sampling_correction:",
       'self._logs["completion"].extend(gather_object(completions))', "rewards_per_func.view(-1, num_generations")),
    P(GRPO, "_get_per_token_logps_and_entropies", "overridden method",
      "trainers/grpo.py: the structured training forward; also called, with batch_size, for the trainer's log-probs",
      ("model", "input_ids", "attention_mask", "logits_to_keep", "/", "batch_size")),
    P(GRPO, "_get_per_token_logps_and_entropies", "call convention",
      "the fused-head call that tags/grammar.py (GrammarForward) and structure.py answer in the model's place",
      ("labels[:, :-logits_to_keep] = -100", "model(**model_inputs, labels=labels, fused_lm_head=True)",
       "outputs.log_probs[:, -logits_to_keep:]", "outputs.entropy[:, -logits_to_keep:]", "outputs.aux_loss")),
    P(GRPO, "_tokenize_prompts", "called method",
      "trainers/grpo.py: the prompt ids the engine decodes from, templated as TRL does", ("prompts", "/")),
    P(GRPO, "_tokenize_prompts", "call convention", "trainers/grpo.py takes the first of the three it returns",
      ("return prompt_ids, images, multimodal_fields",)),
    P(GRPO, "_generate", "call convention",
      "TRL calls our rollout_func with (prompts, trainer), after pushing the training weights to vLLM once an "
      "optimizer step, and makes its env_mask the tool mask (no gradient on the tokens the engine inserted)",
      ("self.rollout_func(prompts, self)", 'required_keys = {"prompt_ids", "completion_ids", "logprobs"}',
       'tool_mask = extra_fields.pop("env_mask", None)',
       # TRL pushes the training weights to vLLM before our rollout_func, once an optimizer step: the engine's
       # rollouts sync nothing themselves (but after a sleep)
       "if self.use_vllm and self.state.global_step != self._last_loaded_step:",
       "self.vllm_generation.sync_weights()")),
    P(GRPO, "__init__", "call convention",
      "trainers/grpo.py silences the rollout_func warning; trainers/colocated_vllm.py (room_for_paths) scales the "
      "max_num_seqs it passes VLLMGeneration by keyword",
      ('os.environ.get("TRL_EXPERIMENTAL_SILENCE", "0") != "1"', "self.vllm_generation = VLLMGeneration(",
       "max_num_seqs=")),
    P(GRPO, "_tokenizer", "instance attribute", "trainers/grpo.py: the tokenizer of the policy (tags, pad id)",
      ("__init__",)),
    P(GRPO, "_dist", "instance attribute",
      "trainers/grpo.py: TRL's DistributedBackend, whose summon_full_params gathers FSDP (v1) parameters for "
      "generation", ("__init__",)),
    P("trl.distributed.DistributedBackend", "summon_full_params", "call convention",
      "trainers/grpo.py calls it with recurse=False, passed on to FSDP",
      ("def summon_full_params(self, module, **kwargs)", "FSDP.summon_full_params(module, **kwargs)")),
    P(GRPO, "_metrics", "instance attribute",
      "trainers/grpo.py and evaluation/callback.py append their metrics there (parallel/, sampling/, eval/)",
      ("__init__",)),
    P(GRPO, "_name", "class attribute", "trainers/card.py: the stage the model card names"),
    P(GRPO, "_tag_names", "class attribute", "trainers/card.py: the card's tags"),
    P(GRPO, "eos_token_ids", "instance attribute", "trainers/grpo.py: the ids that end a completion",
      ("__init__",)),
    P(GRPO, "num_iterations", "instance attribute",
      "trainers/grpo.py: the generation cycle a resumed run warns inside of", ("__init__",)),
    P(GRPO, "use_vllm", "instance attribute", "trainers/grpo.py: which backend the engine samples on",
      ("__init__",)),
    P(GRPO, "vllm_importance_sampling_correction", "instance attribute",
      "trainers/grpo.py: whether TRL logs the sampler gap itself", ("__init__",)),
    P(GRPO, "reward_weights", "instance attribute", "trainers/card.py: the card's rewards table", ("__init__",)),
    P(GRPO, "reward_func_names", "instance attribute", "trainers/card.py: the card's rewards table", ("__init__",)),
    P(GRPO, "vllm_generation", "instance attribute",
      "trainers/grpo.py drives TRL's vLLM: its colocated engine or its server client", ("__init__",)),
    P(GRPO, "_logs", "instance attribute",
      "trainers/rollout_viewer.py: the last generation's prompts, completions, rewards and advantages, for its page",
      ("__init__",)),
    P(GRPO, "log_completions", "instance attribute",
      "trainers/rollout_viewer.py writes its page at the logs where this holds (TRL writes its table there)",
      ("__init__",)),
    P(GRPO, "log", "call convention",
      "trainers/rollout_viewer.py names its page after the completions table TRL writes at a log",
      ('"completions",', 'f"completions_{self.state.global_step:05d}.parquet"')),
    # ---------------------------------------------------------------- TRL: SFT
    P(SFT, "compute_loss", "call convention",
      "the fused-head call that structure.py and trainers/summary_loss.py (WeightedSummaries) answer: the loss is "
      "minus the log-probs over the labels' count",
      ("model(**inputs, fused_lm_head=True)", "per_token_loss = -outputs.log_probs", "outputs.label_mask.sum()",
       "outputs.is_top1", "outputs.entropy")),
    P("trl.trainer.utils", "FusedCausalLMOutput", "fields", "the fields our fused-head answers carry in its place",
      ("log_probs", "entropy", "is_top1", "label_mask", "aux_loss")),
    P(SFT, "_prepare_dataset", "call convention",
      "trainers/summary_loss.py finds each row's completion in its labels: TRL folds the completion mask into them "
      "(-100) and drops it", ("token_id if all(bits) else -100", "remove_columns=mask_columns")),
    P(SFT, "completion_only_loss", "instance attribute",
      "trainers/sft.py: a structured setting needs the prompt out of the loss", ("__init__",)),
    P(SFT, "_name", "class attribute", "trainers/card.py: the stage the model card names"),
    P(SFT, "_tag_names", "class attribute", "trainers/card.py: the card's tags"),
    # ---------------------------------------------------------------- TRL: generation
    P(VLLM_GENERATION, "mode", "instance attribute", "trainers/grpo.py: colocate or server", ("__init__",)),
    P(VLLM_GENERATION, "llm", "instance attribute", "trainers/grpo.py: the colocated engine the backend drives",
      ("_init_vllm",)),
    P(VLLM_GENERATION, "vllm_client", "instance attribute", "trainers/grpo.py: the server's client",
      ("_init_vllm",)),
    P(VLLM_GENERATION, "tensor_parallel_size", "instance attribute",
      "trainers/colocated_vllm.py: the processes that decode the same completions", ("__init__",)),
    P(VLLM_GENERATION, "tp_group", "instance attribute",
      "trainers/colocated_vllm.py gathers and shares the prompts over it", ("_init_vllm",)),
    P(VLLM_GENERATION, "model", "instance attribute",
      "trainers/colocated_vllm.py: whether the trained model is a PEFT model (the group's barrier)", ("__init__",)),
    P(VLLM_GENERATION, "accelerator", "instance attribute",
      "trainers/colocated_vllm.py: the device of the group's barrier", ("__init__",)),
    P(VLLM_GENERATION, "enable_sleep_mode", "instance attribute",
      "trainers/colocated_vllm.py wakes the engine around the rollouts", ("__init__",)),
    P(VLLM_GENERATION, "_llm_weights_sleeping", "instance attribute",
      "trainers/colocated_vllm.py reads it (weights to push again) and sets it (asleep again)",
      ("_init_vllm", "sync_weights", "generate")),
    P(VLLM_GENERATION, "sync_weights", "called method",
      "trainers/colocated_vllm.py pushes the training weights again when sleep discarded them"),
    P(VLLM_GENERATION, "generate", "call convention",
      "trainers/colocated_vllm.py does around the engine's rollouts what TRL does around LLM.generate: sleep mode, "
      "and the tensor-parallel group's gather and shares",
      ('self.llm.wake_up(tags=["kv_cache"])', "self.llm.sleep(level=2)", "self._llm_weights_sleeping = True",
       "torch.distributed.all_gather_object(gathered_prompts, prompts, group=self.tp_group)",
       "local_rank_in_group * orig_size", "if is_peft_model(self.model) and self.tensor_parallel_size > 1:",
       "torch.distributed.barrier(device_ids=[accelerator.local_process_index])")),
    P(VLLM_GENERATION, "_init_vllm", "call convention",
      "colocated_vllm.group_seed is TRL's engine seed; rollout/vllm_backend.py relies on processed log-probs; the "
      "engine is built from its module's LLM (which benchmarks and tests replace)",
      ("seed=accelerator.process_index // self.tensor_parallel_size", 'logprobs_mode="processed_logprobs"',
       "self.llm = LLM(")),
    P("trl.trainer.grpo_trainer", "VLLMGeneration", "module global",
      "trainers/colocated_vllm.py replaces it while GRPOTrainer is built (room_for_paths)", ("max_num_seqs",)),
    P("trl.generation.vllm_generation", "LLM", "module global",
      "benchmarks/bench_structures.py and tests replace it to build the colocated engine in float32", needs="vllm"),
    P("trl.generation.vllm_client.VLLMClient", "generate", "called method",
      "rollout/vllm_backend.py: one request per segment in server mode",
      ("prompts", "n", "temperature", "top_p", "top_k", "max_tokens", "logprobs", "generation_kwargs")),
    P("trl.generation.vllm_client.VLLMClient", "session", "instance attribute",
      "rollout/vllm_backend.py widens its connection pool to the requests in flight", ("__init__",)),
    P("trl.generation.vllm_client.VLLMClient", "generate", "output keys",
      "rollout/vllm_backend.py reads the tokens and their log-probs", ("completion_ids", "logprobs")),
    P("trl.scripts", "sft", "module", "scripts/demo.py pretrains the demo's base with `python -m trl.scripts.sft`"),
    # ---------------------------------------------------------------- transformers
    P(TRAINER, "_save_rng_state", "overridden method",
      "trainers/grpo.py: checkpoints also carry the engine's random stream", ("output_dir", "/")),
    P(TRAINER, "_load_rng_state", "overridden method",
      "trainers/grpo.py: a resumed run samples as the unbroken one", ("checkpoint", "/")),
    P(TRAINER, "is_fsdp_enabled", "instance attribute", "trainers/tag_rate.py refuses FSDP",
      ("create_accelerator_and_postprocess",)),
    P(TRAINER, "hub_model_id", "instance attribute", "trainers/card.py: where a pushed model lives",
      ("init_hf_repo",)),
    P("transformers.training_args.TrainingArguments", "deepspeed_plugin", "instance attribute",
      "trainers/grpo.py and trainers/tag_rate.py: whether DeepSpeed runs, and its config", ("__post_init__",)),
    P(CONFIG, "_attn_implementation", "property",
      "structure.py reads it (the structured masks need SDPA); rollout/hf_backend.py sets it around each forward, "
      "benchmarks/bench_structures.py for each run", ("setter",)),
    P(CONFIG, "_commit_hash", "instance attribute", "evaluation/runner.py records the evaluated revision",
      ("__post_init__",)),
    P(QWEN3_ATTENTION, "forward", "call convention",
      "rollout/kv_pool.py's attention is looked up by the config's name at each forward and called with the module "
      "and the forward's extra keywords (fork_join)",
      ("self.config._attn_implementation", "attention_interface(", "scaling=self.scaling", "**kwargs")),
    P(QWEN3_ATTENTION, "layer_idx", "instance attribute",
      "rollout/kv_pool.py: which layer's keys and values the attention reads and writes", ("__init__",)),
    P("transformers", "configuration_utils", "module", "training.py quiets its logger"),
    P("transformers.generation", "configuration_utils", "module", "training.py quiets its logger"),
    # ---------------------------------------------------------------- vLLM
    P("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm", "module global",
      "rollout/vllm_backend.py (keep_cpu_linear_weights) replaces it on CPU; tests put it back",
      ("layer", "/", "remove_weight"), needs="vllm"),
    P("vllm.model_executor.layers.linear.UnquantizedLinearMethod", "process_weights_after_loading",
      "call convention", "it looks the replaced function up in its module at each layer's load",
      ("from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm",
       "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"), needs="vllm"),
    P("vllm.model_executor.layers.vocab_parallel_embedding.UnquantizedEmbeddingMethod",
      "process_weights_after_loading", "call convention", "the same, for the embedding and the LM head",
      ("from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm",
       "dispatch_cpu_unquantized_gemm(layer, remove_weight=False)"), needs="vllm"),
    P("vllm.model_executor.layers.utils", "cpu_unquantized_gemm", "call convention",
      "our replacement sets layer.cpu_linear (F.linear), which the CPU linear layers call",
      ("layer.cpu_linear(x, weight, bias)",), needs="vllm"),
    P(LLM, "llm_engine", "instance attribute",
      "rollout/vllm_backend.py steps the engine itself; benchmarks/bench_rollout.py reads its block size",
      ("__init__",), needs="vllm"),
    P(LLM, "sleep", "called method", "trainers/colocated_vllm.py puts the engine back to sleep", ("level",),
      needs="vllm"),
    P(LLM, "wake_up", "called method", "trainers/colocated_vllm.py wakes the KV cache", ("tags",), needs="vllm"),
    P(ENGINE, "add_request", "called method", "rollout/vllm_backend.py: one request per segment",
      ("request_id", "prompt", "params", "/"), needs="vllm"),
    P(ENGINE, "step", "called method", "rollout/vllm_backend.py: one engine step", needs="vllm"),
    P(ENGINE, "abort_request", "called method", "rollout/vllm_backend.py: segments cut or released",
      ("request_ids", "/"), needs="vllm"),
    P(ENGINE, "vllm_config", "instance attribute", "rollout/vllm_backend.py: the scheduler's budget",
      ("__init__",), needs="vllm"),
    P("vllm.config", "VllmConfig", "fields", "rollout/vllm_backend.py, benchmarks/bench_rollout.py",
      ("scheduler_config", "cache_config"), needs="vllm"),
    P("vllm.config", "SchedulerConfig", "fields",
      "rollout/vllm_backend.py admits on CPU only the requests one step reads whole",
      ("max_num_batched_tokens", "max_num_seqs"), needs="vllm"),
    P("vllm.config", "CacheConfig", "fields", "benchmarks/bench_rollout.py: the prefix cache's unit",
      ("block_size",), needs="vllm"),
    P("vllm.sampling_params", "RequestOutputKind", "fields",
      "rollout/vllm_backend.py: a segment heard of at its end, or as it grows", ("FINAL_ONLY", "CUMULATIVE"),
      needs="vllm"),
    P("vllm.sampling_params", "SamplingParams", "fields", "rollout/vllm_backend.py: each segment's request",
      ("output_kind", "detokenize", "seed", "temperature", "top_p", "top_k", "max_tokens", "stop_token_ids",
       "logprobs", "skip_special_tokens", "allowed_token_ids", "logit_bias", "bad_words"), needs="vllm"),
    P("vllm.platforms.current_platform", "is_cpu", "called method",
      "rollout/vllm_backend.py: CPU only, the linear-weight fix and the whole-prompt admission", needs="vllm"),
    P("vllm.entrypoints.openai", "api_server", "module", "testing/vllm_server.py runs it for tests and benchmarks",
      needs="vllm"),
    P("vllm.triton_utils", "importing", "module", "training.py quiets its logger", needs="vllm"),
    # ---------------------------------------------------------------- peft
    P(TOKENS_LAYER, "trainable_tokens_delta", "instance attribute",
      "trainers/tag_rate.py: the trained rows, by adapter", ("__init__",)),
    P(TOKENS_LAYER, "token_indices", "instance attribute", "trainers/tag_rate.py: the ids of those rows",
      ("__init__",)),
    P("peft.utils.other.TrainableTokensWrapper", "original_module", "property",
      "trainers/sft.py lends the fused head the wrapped layer's bias"),
    # ---------------------------------------------------------------- DeepSpeed
    P("deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3", "parameter_offload", "instance attribute",
      "trainers/grpo.py (_without_zero3_step_hook): the engine's optimizer's offload", ("__init__",),
      needs="deepspeed"),
    P(OFFLOAD, "fwd_pre_hook", "instance attribute",
      "trainers/grpo.py: the handle of the collective start-of-forward hook, taken off and put back",
      ("setup_zero_stage3_hooks",), needs="deepspeed"),
    P("trl.models.utils", "remove_hooks", "call convention",
      "trainers/grpo.py (_without_zero3_step_hook) finds the start-of-forward hook where TRL's gather left it",
      ("for hook in optimizer_offload.forward_hooks:", "optimizer_offload.forward_hooks = []")),
    P(OFFLOAD, "module", "instance attribute", "trainers/grpo.py: the module that holds that hook", ("__init__",),
      needs="deepspeed"),
    P("deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3", "_link_all_hp_params", "call convention",
      "trainers/tag_rate.py reaches the optimizer of a ZeRO-3 parameter through it", ("p._z3_optimizer = self",),
      needs="deepspeed"),
    P("deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3", "_get_fp32_opt_state_partition",
      "called method",
      "trainers/tag_rate.py: a view of this process's float32 partition of a parameter (the public "
      "safe_get_local_fp32_param copies it to the GPU under CPU offload)", ("param", "/", "release_swap_buffers"),
      needs="deepspeed"),
    P("deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3", "_get_fp32_opt_state_partition",
      "call convention", "trainers/tag_rate.py changes the partition in place: it is a view",
      ("fp32_param.narrow(0, dest_offset, num_elements)",), needs="deepspeed"),
    P("deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3", "_optimizer_step", "call convention",
      "trainers/tag_rate.py: each step call holds one sub-group's flat float32 partition, which its hooks look for",
      ("self.optimizer.param_groups[param_group_id]['params'] = [fp32_param]",), needs="deepspeed"),
    P("deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer", "_optimizer_step", "call convention",
      "trainers/tag_rate.py: each step call holds one group's flat float32 partition",
      ("self.optimizer.param_groups = [original_param_groups[group_no]]", "self.optimizer.step()"),
      needs="deepspeed"),
    P("deepspeed.utils.tensor_fragment", "get_hp_fragment_mapping", "call convention",
      "trainers/tag_rate.py: a ZeRO-1/2 fragment is a view of the flat partition, at its start in the parameter",
      ("flat_hp_partition.narrow(0, hp_frag_address.start, hp_frag_address.numel)",
       "lp_frag_address = fragment_address(start=fragment_start - lp_start"), needs="deepspeed"),
    P("deepspeed.runtime.zero.partition_parameters", "Init", "call convention",
      "trainers/tag_rate.py: a process's partition starts at its rank times the partition's size",
      ("start = partition_size * self._partition_rank(param)",), needs="deepspeed"),
    P(ZERO3_INIT, "ds_id", "foreign attribute", "trainers/tag_rate.py: a ZeRO-3 partitioned parameter",
      ("param",), needs="deepspeed"),
    P(ZERO3_INIT, "ds_shape", "foreign attribute", "trainers/tag_rate.py: the parameter's full shape", ("param",),
      needs="deepspeed"),
    P(ZERO3_INIT, "ds_process_group", "foreign attribute",
      "trainers/tag_rate.py: the group that holds its partitions", ("param",), needs="deepspeed"),
    P(ZERO3_INIT, "ds_numel", "foreign attribute",
      "trainers/tag_rate.py: the size of each process's partition (param.ds_tensor)", ("param.ds_tensor",),
      needs="deepspeed"),
    P("deepspeed.utils.mixed_precision_linkage.link_hp_params", "_hp_mapping", "foreign attribute",
      "trainers/tag_rate.py: a ZeRO-1/2 parameter's fragment of the float32 copy", ("lp_param",),
      needs="deepspeed"),
    P("deepspeed.utils.tensor_fragment", "tensor_fragment", "fields",
      "trainers/tag_rate.py: the fragment's float32 values and where they start",
      ("hp_fragment", "lp_fragment_address"), needs="deepspeed"),
    P("deepspeed.utils.tensor_fragment", "fragment_address", "fields", "trainers/tag_rate.py", ("start",),
      needs="deepspeed"),
    # ---------------------------------------------------------------- accelerate
    P(PLUGIN, "hf_ds_config", "instance attribute", "trainers/grpo.py: whether the run is ZeRO-3 (is_zero3)",
      ("__post_init__",)),
    P("accelerate.utils.deepspeed.HfDeepSpeedConfig", "is_zero3", "called method", "trainers/grpo.py"),
    P(PLUGIN, "deepspeed_config", "instance attribute",
      "trainers/tag_rate.py refuses a DeepSpeed config that makes its own optimizer", ("__post_init__",)),
    # ---------------------------------------------------------------- torch
    P("torch.nn.modules.module.Module", "register_forward_pre_hook", "call convention",
      "trainers/grpo.py reads a hook back as module._forward_pre_hooks[handle.id]",
      ("self._forward_pre_hooks[handle.id] = hook",)),
    P("torch.utils.hooks.RemovableHandle", "id", "instance attribute", "trainers/grpo.py: the hook's key",
      ("__init__",)),
    P("torch.optim.optimizer.Optimizer", "_optimizer_step_pre_hooks", "instance attribute",
      "benchmarks/bench_tag_rate.py times the hooks in them", ("__init__",)),
    P("torch.optim.optimizer.Optimizer", "_optimizer_step_post_hooks", "instance attribute",
      "benchmarks/bench_tag_rate.py times the hooks in them", ("__init__",)),
    P(TRAINER, "get_decay_parameter_names", "called method",
      "benchmarks/bench_tag_rate.py builds the Trainer's two groups with it, unbound (self unused)", ("model", "/")),
)  # fmt: skip
