"""The fork-join engine on TRL's colocated vLLM engine, driven the way TRL's own `VLLMGeneration.generate` drives it.

The engine steps `vllm_generation.llm.llm_engine` itself (requests in and out as they finish), so what TRL's
`generate` does around its one `LLM.generate` call is done here around the engine's rollouts:

- **Room for the paths.** TRL sizes the engine's `max_num_seqs` to the completions of a generation (per process,
  times the tensor-parallel group). A block decodes its first `min_paths` paths at once, each a request of its own,
  so a generation can hold `min_paths` times as many requests; with TRL's size the extra paths would wait in
  vLLM's queue. `room_for_paths` builds TRL's engine with that many seats.
- **Sleep mode.** With `vllm_enable_sleep_mode`, TRL keeps the engine asleep at level 2 (weights and KV cache
  discarded) outside generation and wakes only the weights for its sync. Around the rollouts: the weights synced
  again if they were discarded since (TRL syncs once per optimizer step), the KV cache woken, and both put back to
  sleep after.
- **Tensor parallelism.** With `vllm_tensor_parallel_size` > 1 every process of a tensor-parallel group runs the
  same engine under `external_launcher`: each must add the same requests and step in lockstep. The group's prompts
  are gathered, every process of the group decodes all of them from the same random stream (the group's seed, as
  TRL seeds the group's engine), and each keeps its own share. The engine's choices depend only on what it
  decoded, which is the same on every process of the group, so the processes stay in step. With a PEFT model the
  group first meets at a barrier, as in TRL (NCCL's cleanup of the adapters' small all-reduce can race vLLM's).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from accelerate.utils import is_peft_model

from ..rollout.arguments import paths_at_once

TRL_STEP_TOKENS = 4096  # TRL's max_num_batched_tokens for its colocated engine: vLLM refuses more seats than that


@contextmanager
def room_for_paths(args):
    """While TRL's GRPOTrainer is built: its colocated vLLM engine gets `paths_at_once(args)` times the
    `max_num_seqs` TRL gives it (its module's `VLLMGeneration`, called with the keyword `max_num_seqs`), up to the
    tokens TRL lets one engine step read (`TRL_STEP_TOKENS`)."""
    from trl.trainer import grpo_trainer

    original, factor = grpo_trainer.VLLMGeneration, paths_at_once(args)

    def build(*positional, max_num_seqs=None, **keywords):
        seats = None if max_num_seqs is None else min(max_num_seqs * factor, max(max_num_seqs, TRL_STEP_TOKENS))
        return original(*positional, max_num_seqs=seats, **keywords)

    grpo_trainer.VLLMGeneration = build
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = original


def group_seed(seed: int, process_index: int, tensor_parallel_size: int) -> int:
    """The seed of the random stream of a process's rollouts: one stream per tensor-parallel group (every process
    of a group decodes the same completions), a different one for each group."""
    return seed + process_index // tensor_parallel_size


def colocated_rollouts(generation, prompt_ids: list, decode) -> list:
    """`decode(prompts)` (the engine's rollouts on `generation.llm`) for this process's `prompt_ids`, with TRL's
    `VLLMGeneration` `generation` awake and its tensor-parallel group in step (module docstring)."""
    group = generation.tensor_parallel_size
    if group == 1:
        with _awake(generation):
            return decode(prompt_ids)
    shares = [None] * group
    torch.distributed.all_gather_object(shares, prompt_ids, group=generation.tp_group)
    with _awake(generation, barrier=is_peft_model(generation.model)):
        rollouts = decode([prompt for share in shares for prompt in share])
    rank = torch.distributed.get_rank(group=generation.tp_group)
    start = sum(len(share) for share in shares[:rank])
    return rollouts[start : start + len(prompt_ids)]


@contextmanager
def _awake(generation, barrier: bool = False):
    """The colocated engine with its weights (synced) and KV cache awake, put back to sleep at level 2 after, as
    TRL's `generate` leaves it (nothing to do without sleep mode); with `barrier`, every process meets last, just
    before decoding, as in TRL (its PEFT and tensor-parallel case: NCCL's cleanup of the adapters' small all-reduce,
    and of a sync's gathers, can race vLLM's collectives, trl #3671)."""
    asleep = generation.enable_sleep_mode
    if asleep and generation._llm_weights_sleeping:  # discarded since TRL's last sync: push the weights again
        generation.sync_weights()
    if asleep:
        generation.llm.wake_up(tags=["kv_cache"])
    if barrier:
        devices = [generation.accelerator.local_process_index] if torch.cuda.is_available() else None
        torch.distributed.barrier(device_ids=devices)
    try:
        yield
    finally:
        if asleep:
            generation.llm.sleep(level=2)
            generation._llm_weights_sleeping = True
