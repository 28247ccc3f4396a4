"""The tag rows' own learning rate: `tag_lr_multiplier` times the run's, in SFT and GRPO.

The rule: every optimizer step moves each tag row `tag_lr_multiplier` times as far as the optimizer moved it, and
moves nothing else differently. For an optimizer whose step is proportional to the learning rate (AdamW with its
decoupled weight decay, Adam, SGD; `PROPORTIONAL`), that is exactly the step of a parameter group of the tag rows'
own at that multiple of the rate, on every step of the schedule.

Why not a parameter group: the six rows share their tensor with the rest of the vocabulary (and, with a tied head,
with the output layer), and a group holds whole tensors; splitting the rows into a tensor of their own needs a
module that the saved model would carry. Why not a scaled gradient: Adam divides each gradient by its own running
size, so the scale cancels. So the optimizer's `step` gets a hook before (the tag rows are copied) and after (each
row is set to `before + k * (after - before)`). The model keeps its modules: what is saved is an ordinary model.

Where the rows are:
- full fine-tuning: the tag ids' rows of the input embedding, and of the LM head when it is a tensor of its own
  (a tied head is the input embedding);
- LoRA: peft's trainable-token tensors (`trainable_token_indices`, which SFT sets to cover the tags): their rows
  for the tag ids, since the base embedding is frozen (a tied head shares the embedding's tensor).

Where the values the optimizer steps are, and what the hooks read and write there (`_rows_of`, at the first step):
- float32 weights stepped by a torch optimizer: the rows themselves (`_Rows`);
- bfloat16 or float16 weights stepped by a torch optimizer, with no float32 copy: the step rounds to the weights'
  precision before the hook sees it, so a step under half a rounding step was lost and a larger one carried its
  rounding error times k. The rows keep a float32 copy of their own (`_FloatCopy`): before the step their weights
  are set to 0, so that the optimizer writes its update alone (rounded to its own magnitude, not the row's); after
  it the copy moves by k times that update and the decoupled weight decay on the copy, and the weights are the
  copy rounded. Coupled weight decay (Adam's, SGD's) would read the zeroed rows: refused. The copy is not in the
  checkpoint: a resumed run starts it from the saved weights (what it loses is under one rounding step, once);
- DeepSpeed (ZeRO-1, 2 or 3): the float32 copy DeepSpeed's optimizer steps, partitioned across processes. Each
  process updates, in place, the part of the tag rows in its own partition (`_Partition`): nothing is gathered
  or sent (before, each hook gathered the whole embedding on every process: at Qwen3-4B's 151,936 x 2,560 on 8
  processes, 5.4 GB sent by each process a step under ZeRO-3, 10.9 GB under ZeRO-2; benchmarks/results/tag_rate.md).
  DeepSpeed calls the wrapped optimizer's `step` once per parameter group (ZeRO-1/2) or sub-group (ZeRO-3), each
  over its flat partitions; the rows of a tensor are scaled in the call whose tensors hold its part, once a step.
"""

from __future__ import annotations

import torch
from peft.tuners.trainable_tokens import TrainableTokensLayer
from transformers import TrainerCallback

PROPORTIONAL = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)  # step = learning rate x f(gradients, state)
LOW_PRECISION = (torch.bfloat16, torch.float16)


def tag_rows(model, tag_ids: list[int]) -> list[tuple[torch.nn.Parameter, list[int]]]:
    """(tensor, rows) for every trainable tensor that holds tag rows (module docstring), each tensor once."""
    found, seen = [], set()

    def add(param, rows):
        if param.requires_grad and rows and id(param) not in seen:
            seen.add(id(param))
            found.append((param, rows))

    for module in model.modules():
        if isinstance(module, TrainableTokensLayer):
            for name, delta in module.trainable_tokens_delta.items():
                indices = list(module.token_indices[name])
                add(delta, [i for i, token in enumerate(indices) if token in tag_ids])
    add(model.get_input_embeddings().weight, list(tag_ids))
    head = model.get_output_embeddings()
    if head is not None:
        add(head.weight, list(tag_ids))
    return found


class TagRate:
    """The hooks that scale the tag rows' steps by `multiplier` on `optimizer` (module docstring). `deepspeed`: the
    optimizer will be wrapped by DeepSpeed's, which steps a float32 copy of its own."""

    def __init__(self, optimizer: torch.optim.Optimizer, rows: list, multiplier: float, deepspeed: bool = False):
        if not isinstance(optimizer, PROPORTIONAL):
            raise ValueError(
                f"tag_lr_multiplier needs an optimizer whose step is proportional to the learning rate "
                f"({', '.join(c.__name__ for c in PROPORTIONAL)}), got {type(optimizer).__name__}: set optim to "
                "adamw_torch (or adamw_torch_fused, sgd), or tag_lr_multiplier to 1"
            )
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        rows = [(param, ids) for param, ids in rows if id(param) in stepped]  # (LoRA: the delta, not the view)
        if not rows:
            raise ValueError(
                "tag_lr_multiplier: no trainable tensor holds the tag rows (with LoRA, the tag rows must be trainable "
                "tokens: peft's trainable_token_indices)"
            )
        for param, _ in rows if not deepspeed else ():
            low = param.dtype in LOW_PRECISION
            if low and _group(optimizer, param).get("weight_decay") and not _decoupled(optimizer, param):
                raise ValueError(
                    f"tag_lr_multiplier with {param.dtype} weights keeps a float32 copy of the tag rows, which needs "
                    f"decoupled weight decay (adamw) or none: {type(optimizer).__name__}'s weight decay reads the rows"
                )
        self.optimizer, self.rows, self.multiplier = optimizer, rows, multiplier
        self.holders = None  # built at the first step, once DeepSpeed (if any) has partitioned the parameters
        self.calls = 0  # step calls the hooks saw (`HooksRan` checks that there were some)
        optimizer.register_step_pre_hook(self._before)
        optimizer.register_step_post_hook(self._after)

    def _stepped(self, optimizer) -> list:
        """The holders whose values this call of `step` updates (DeepSpeed calls it once per flat group): those whose
        values lie inside one of the call's tensors."""
        if self.holders is None:
            self.holders = [_rows_of(param, rows, self.optimizer) for param, rows in self.rows]
        spans = [
            (p.data_ptr(), p.data_ptr() + p.numel() * p.element_size())
            for g in optimizer.param_groups
            for p in g["params"]
        ]
        stepped = []
        for holder in self.holders:
            values = holder.values()
            if values is not None and any(low <= values.data_ptr() < high for low, high in spans):
                stepped.append(holder)
        return stepped

    @torch.no_grad()
    def _before(self, optimizer, args, kwargs) -> None:
        self.calls += 1
        for holder in self._stepped(optimizer):
            holder.before()

    @torch.no_grad()
    def _after(self, optimizer, args, kwargs) -> None:
        for holder in self._stepped(optimizer):
            holder.after(self.multiplier)


def _rows_of(param: torch.nn.Parameter, rows: list[int], optimizer):
    """Where the values the optimizer steps for `param`'s `rows` are (module docstring)."""
    if hasattr(param, "ds_id") or hasattr(param, "_hp_mapping"):  # DeepSpeed's (None where no part is local)
        return _Partition(param, rows)
    if param.dtype in LOW_PRECISION:
        return _FloatCopy(param, rows, optimizer)
    return _Rows(param, rows)


class _Rows:
    """The rows of a tensor the optimizer steps in full precision."""

    def __init__(self, param, rows: list[int]):
        self.param, self.rows, self.saved = param, torch.tensor(rows), None

    def values(self) -> torch.Tensor:
        return self.param.data

    def before(self) -> None:
        self.saved = self.param.data[self.rows].clone()

    def after(self, multiplier: float) -> None:
        moved = self.param.data[self.rows] - self.saved
        self.param.data[self.rows] = self.saved + multiplier * moved


class _FloatCopy(_Rows):
    """The rows of a bfloat16 or float16 tensor a torch optimizer steps in that precision, with a float32 copy."""

    def __init__(self, param, rows: list[int], optimizer):
        super().__init__(param, rows)
        self.group = _group(optimizer, param)
        self.decoupled = _decoupled(optimizer, param)
        self.copy = None

    def before(self) -> None:
        weights = self.param.data[self.rows]
        if self.copy is None or not torch.equal(self.copy.to(weights.dtype), weights):  # first, or set elsewhere
            self.copy = weights.float()
        self.param.data[self.rows] = 0  # the optimizer then writes its update alone (decoupled decay: 0 stays 0)

    def after(self, multiplier: float) -> None:
        update = self.param.data[self.rows].float()
        if self.decoupled:
            update -= self.group["lr"] * self.group["weight_decay"] * self.copy
        self.copy += multiplier * update
        self.param.data[self.rows] = self.copy.to(self.param.dtype)


class _Partition:
    """The tag rows' elements in this process's part of DeepSpeed's float32 copy of a tensor, changed in place.

    The part is looked up at each step (DeepSpeed rebuilds it on a checkpoint load): ZeRO-3's local partition (its
    optimizer's `_get_fp32_opt_state_partition`: a view also under CPU offload, where the public
    `safe_get_local_fp32_param` hands out a copy on the GPU), without the last process's padding; ZeRO-1/2's
    fragment (`param._hp_mapping`, None where this process holds none of the tensor). The rule is elementwise, so
    a row split between two processes is scaled by each for its part."""

    def __init__(self, param, rows: list[int]):
        self.param, self.rows, self.saved = param, rows, None
        self.width = (param.ds_shape if hasattr(param, "ds_id") else param.shape)[1]

    def _part(self) -> tuple[torch.Tensor, int] | None:
        """This process's float32 values of the tensor (flat) and the index of the first in the whole tensor."""
        param = self.param
        if hasattr(param, "ds_id"):
            values, _ = param._z3_optimizer._get_fp32_opt_state_partition(param, release_swap_buffers=False)
            size = param.ds_tensor.ds_numel
            start = torch.distributed.get_rank(group=param.ds_process_group) * size
            real = max(0, min(size, param.ds_numel - start))
            return (values.narrow(0, 0, real), start) if real else None
        fragment = param._hp_mapping
        return None if fragment is None else (fragment.hp_fragment, fragment.lp_fragment_address.start)

    def _positions(self, values: torch.Tensor, start: int) -> torch.Tensor:
        flat = torch.cat([torch.arange(row * self.width, (row + 1) * self.width) for row in self.rows])
        return flat[(flat >= start) & (flat < start + values.numel())] - start

    def values(self) -> torch.Tensor | None:
        part = self._part()
        return None if part is None else part[0]

    def before(self) -> None:
        values, start = self._part()
        self.positions = self._positions(values, start)
        self.saved = values[self.positions].clone()

    def after(self, multiplier: float) -> None:
        values, _ = self._part()
        values[self.positions] = self.saved + multiplier * (values[self.positions] - self.saved)


def _group(optimizer, param) -> dict:
    return next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))


def _decoupled(optimizer, param) -> bool:
    """Whether the optimizer's weight decay scales the weights (AdamW's) rather than adding to the gradient."""
    return isinstance(optimizer, torch.optim.AdamW) or bool(_group(optimizer, param).get("decoupled_weight_decay"))


class TagRateMixin:
    """Put before TRL's trainer class, in a trainer with a `policy`: with `tag_lr_multiplier` != 1, the optimizer the
    trainer creates scales the tag rows' steps (`TagRate`, one for each optimizer the trainer creates), and each log
    holds the tag rows' rate, `tag_learning_rate`, next to `learning_rate` (so trainer_state.json records it at every
    logged step)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.tag_lr_multiplier != 1:
            _check_setup(self)
            self.add_callback(HooksRan(self))

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        rate = getattr(self, "tag_rate", None)
        if self.args.tag_lr_multiplier != 1 and (rate is None or rate.optimizer is not optimizer):
            if self.policy.vocab is None:
                raise ValueError("tag_lr_multiplier needs the tags in the tokenizer (scripts/add_special_tokens.py)")
            rows = tag_rows(self.model if model is None else model, list(self.policy.vocab.ids.values()))
            deepspeed = self.args.deepspeed_plugin is not None
            self.tag_rate = TagRate(optimizer, rows, self.args.tag_lr_multiplier, deepspeed)
        return optimizer

    def log(self, logs: dict, *args, **kwargs) -> None:
        if self.args.tag_lr_multiplier != 1 and "learning_rate" in logs:
            logs["tag_learning_rate"] = logs["learning_rate"] * self.args.tag_lr_multiplier
        super().log(logs, *args, **kwargs)


class HooksRan(TrainerCallback):
    """After an optimizer step, the hooks must have seen it: an optimizer that replaced the one the trainer created
    (as accelerate does with DeepSpeed's CPU Adam) would train the tag rows at the run's rate while the logs say
    otherwise. A step skipped for an fp16 overflow calls no optimizer, so fp16 runs are not checked."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        rate = getattr(self.trainer, "tag_rate", None)
        if rate is not None and rate.calls == 0 and not args.fp16:
            raise RuntimeError(
                "tag_lr_multiplier: an optimizer step ran without the tag rows' hooks, so the optimizer that steps is "
                f"not the one the trainer created ({type(rate.optimizer).__name__}); the tag rows would learn at "
                "the run's rate"
            )


def _check_setup(trainer) -> None:
    """Refuse what the hooks cannot reach: an optimizer that DeepSpeed's config makes (the trainer's is never
    created) or that replaces the trainer's (CPU offload with DeepSpeed's CPU Adam, super_offload, zenflow),
    DeepSpeed's NVMe offload of the optimizer state and its stage 0 in mixed precision, and FSDP (its parameters are
    flat shards)."""
    plugin = trainer.args.deepspeed_plugin
    config = (plugin.deepspeed_config or {}) if plugin is not None else {}
    if "optimizer" in config:
        raise ValueError(
            "tag_lr_multiplier works on the optimizer the trainer creates, but the DeepSpeed config makes its own: "
            "remove its 'optimizer' section (the trainer's optim, learning_rate and betas then apply)"
        )
    zero = config.get("zero_optimization", {})
    offload = zero.get("offload_optimizer", {})
    if offload.get("device") == "nvme":
        raise ValueError(
            "tag_lr_multiplier is not supported with DeepSpeed's optimizer state offloaded to NVMe (reading a "
            "partition swaps it in beside the one being stepped): offload to cpu (with zero_force_ds_cpu_optimizer "
            "false), or none"
        )
    if offload.get("super_offload") or zero.get("zenflow"):
        raise ValueError(
            "tag_lr_multiplier is not supported with DeepSpeed's super_offload or zenflow (they step the optimizer "
            "elsewhere than the trainer's)"
        )
    if offload.get("device") == "cpu" and config.get("zero_force_ds_cpu_optimizer", True) is not False:
        raise ValueError(
            "tag_lr_multiplier with DeepSpeed's optimizer offloaded to the CPU: accelerate then replaces the "
            "trainer's optimizer with DeepSpeed's CPU Adam, which the hooks are not on; set "
            "zero_force_ds_cpu_optimizer: false in the DeepSpeed config (the trainer's AdamW steps the offloaded "
            "partitions), or offload none"
        )
    if plugin is not None and zero.get("stage", 0) == 0 and (trainer.args.bf16 or trainer.args.fp16):
        raise ValueError(
            "tag_lr_multiplier is not supported under DeepSpeed ZeRO stage 0 with bf16 or fp16 (its optimizer steps "
            "float32 copies the hooks do not see): use ZeRO stage 1, 2 or 3"
        )
    if trainer.is_fsdp_enabled:
        raise ValueError("tag_lr_multiplier is not supported under FSDP (use DeepSpeed ZeRO-3 or DDP)")
