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
  for the tag ids, since the base embedding is frozen (a tied head shares the embedding's tensor);
- DeepSpeed: the optimizer steps a float32 copy of the parameters, partitioned across processes, so the hooks
  read and write that copy through DeepSpeed's public `safe_get_full_fp32_param` / `safe_set_full_fp32_param`
  (each read gathers the whole tensor: two gathers of the embedding an optimizer step). Tested under ZeRO-3.
"""

from __future__ import annotations

import torch
from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

PROPORTIONAL = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)  # step = learning rate x f(gradients, state)


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
    """The hooks that scale the tag rows' steps by `multiplier` on `optimizer` (module docstring)."""

    def __init__(self, optimizer: torch.optim.Optimizer, rows: list, multiplier: float):
        if not isinstance(optimizer, PROPORTIONAL):
            raise ValueError(
                f"tag_lr_multiplier needs an optimizer whose step is proportional to the learning rate "
                f"({', '.join(c.__name__ for c in PROPORTIONAL)}), got {type(optimizer).__name__}: set optim to "
                "adamw_torch (or adamw_torch_fused, sgd), or tag_lr_multiplier to 1"
            )
        if not rows:
            raise ValueError(
                "tag_lr_multiplier: no trainable tensor holds the tag rows (with LoRA, the tag rows must be trainable "
                "tokens: peft's trainable_token_indices)"
            )
        self.rows, self.multiplier, self.before = rows, multiplier, []
        optimizer.register_step_pre_hook(self._remember)
        optimizer.register_step_post_hook(self._scale)

    def _remember(self, optimizer, args, kwargs) -> None:
        self.before = [_read(param)[rows].clone() for param, rows in self.rows]

    @torch.no_grad()
    def _scale(self, optimizer, args, kwargs) -> None:
        for (param, rows), before in zip(self.rows, self.before):
            value = _read(param)
            value[rows] = before + self.multiplier * (value[rows] - before)
            _write(param, value)
        self.before = []


def _read(param: torch.nn.Parameter) -> torch.Tensor:
    """The values the optimizer steps: DeepSpeed's float32 copy (gathered whole) or the parameter itself."""
    if _deepspeed(param):
        from deepspeed.utils import safe_get_full_fp32_param

        return safe_get_full_fp32_param(param)
    return param.data


def _write(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Store what `_read` gave, changed: DeepSpeed keeps this process's partition of it (the parameter itself was
    changed in place)."""
    if _deepspeed(param):
        from deepspeed.utils import safe_set_full_fp32_param

        safe_set_full_fp32_param(param, value)


def _deepspeed(param) -> bool:
    """Whether DeepSpeed's optimizer owns `param`: ZeRO-3 partitions it (ds_id), ZeRO-1/2 map it (_hp_mapping)."""
    return hasattr(param, "ds_id") or getattr(param, "_hp_mapping", None) is not None


class TagRateMixin:
    """Put before TRL's trainer class, in a trainer with a `policy`: with `tag_lr_multiplier` != 1, the optimizer the
    trainer creates scales the tag rows' steps (`TagRate`), and each log holds the tag rows' rate,
    `tag_learning_rate`, next to `learning_rate` (so trainer_state.json records it at every logged step)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.tag_lr_multiplier != 1:
            _check_setup(self)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if self.args.tag_lr_multiplier != 1 and not hasattr(self, "tag_rate"):
            if self.policy.vocab is None:
                raise ValueError("tag_lr_multiplier needs the tags in the tokenizer (scripts/add_special_tokens.py)")
            rows = tag_rows(self.model if model is None else model, list(self.policy.vocab.ids.values()))
            self.tag_rate = TagRate(optimizer, rows, self.args.tag_lr_multiplier)
        return optimizer

    def log(self, logs: dict, *args, **kwargs) -> None:
        if self.args.tag_lr_multiplier != 1 and "learning_rate" in logs:
            logs["tag_learning_rate"] = logs["learning_rate"] * self.args.tag_lr_multiplier
        super().log(logs, *args, **kwargs)


def _check_setup(trainer) -> None:
    """Refuse what the hooks cannot reach: an optimizer that DeepSpeed's config makes (the trainer's is never
    created), and FSDP (its parameters are flat shards)."""
    plugin = trainer.args.deepspeed_plugin
    if plugin is not None and "optimizer" in (plugin.deepspeed_config or {}):
        raise ValueError(
            "tag_lr_multiplier works on the optimizer the trainer creates, but the DeepSpeed config makes its own: "
            "remove its 'optimizer' section (the trainer's optim, learning_rate and betas then apply)"
        )
    if trainer.is_fsdp_enabled:
        raise ValueError("tag_lr_multiplier is not supported under FSDP (use DeepSpeed ZeRO-3 or DDP)")
