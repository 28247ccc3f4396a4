"""Reward schedules: pick one of two rewards by the training step, read from TRL's `trainer_state`.

The paper's step s counts rollout batches from 1. TRL's `trainer_state.global_step` counts optimizer steps
done; a batch is generated when `global_step` is a multiple of `steps_per_batch` (optimizer steps per
generated batch: `steps_per_generation / gradient_accumulation_steps * num_iterations` in GRPOConfig, 1 by
default), so s = global_step // steps_per_batch + 1. Nothing is counted in memory: after a resume from a
checkpoint, the restored state gives the same choice as the original run did.

- `alternating(a, b, window=10, a_steps=8)`: a on the steps where (s - 1) mod window < a_steps, b on the others
  (S2: accuracy 8 steps, tiered 2, in every 10).
- `switch(a, b, at_step=N)`: a for the first N steps (s <= N), b after (the mid-training scaffold).

Schedules nest (either reward may itself be a schedule); all of them read the same s. Each call logs
`schedule/<name>/uses_b` (0 or 1) through TRL's `log_metric`, and `active(s)` names the reward used at step s.
"""

from __future__ import annotations

from collections.abc import Callable


def paper_step(trainer_state, steps_per_batch: int = 1) -> int:
    """The paper's step s (1-based count of rollout batches) at which rewards are being computed."""
    return int(trainer_state.global_step) // steps_per_batch + 1


def _name(func: Callable) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"schedule parameter {name} must be an integer {bound}, got {value!r}")


class Schedule:
    """A reward that is `a` or `b` depending on the step; subclasses say when b is used."""

    def __init__(self, a: Callable, b: Callable, steps_per_batch: int = 1):
        for label, func in (("a", a), ("b", b)):
            if not callable(func):
                raise ValueError(f"schedule reward {label} must be a reward function, got {func!r}")
        _check_int("steps_per_batch", steps_per_batch, 1)
        self.a, self.b, self.steps_per_batch = a, b, steps_per_batch

    def uses_b(self, step: int) -> bool:
        raise NotImplementedError

    def active(self, step: int) -> str:
        """The name of the (innermost) reward used at paper step `step`."""
        chosen = self.b if self.uses_b(step) else self.a
        return chosen.active(step) if isinstance(chosen, Schedule) else _name(chosen)

    def __call__(self, *args, trainer_state=None, log_metric=None, **kwargs) -> list:
        if trainer_state is None:
            raise ValueError(f"{self.__name__} needs trainer_state to know the step (TRL passes it to rewards)")
        uses_b = self.uses_b(paper_step(trainer_state, self.steps_per_batch))
        if log_metric is not None:
            log_metric(f"schedule/{self.__name__}/uses_b", float(uses_b))
        chosen = self.b if uses_b else self.a
        return chosen(*args, trainer_state=trainer_state, log_metric=log_metric, **kwargs)


class Alternating(Schedule):
    def __init__(self, a: Callable, b: Callable, window: int = 10, a_steps: int = 8, steps_per_batch: int = 1):
        _check_int("window", window, 1)
        _check_int("a_steps", a_steps, 0, window)
        super().__init__(a, b, steps_per_batch)
        self.window, self.a_steps = window, a_steps
        self.__name__ = f"alternating({_name(a)},{_name(b)},window={window},a_steps={a_steps})"

    def uses_b(self, step: int) -> bool:
        return (step - 1) % self.window >= self.a_steps


class Switch(Schedule):
    def __init__(self, a: Callable, b: Callable, at_step: int, steps_per_batch: int = 1):
        _check_int("at_step", at_step, 0)
        super().__init__(a, b, steps_per_batch)
        self.at_step = at_step
        self.__name__ = f"switch({_name(a)},{_name(b)},at_step={at_step})"

    def uses_b(self, step: int) -> bool:
        return step > self.at_step


def alternating(a: Callable, b: Callable, window: int = 10, a_steps: int = 8, steps_per_batch: int = 1) -> Alternating:
    """a where (s - 1) mod window < a_steps, else b."""
    return Alternating(a, b, window, a_steps, steps_per_batch)


def switch(a: Callable, b: Callable, at_step: int, steps_per_batch: int = 1) -> Switch:
    """a for s <= at_step, b after."""
    return Switch(a, b, at_step, steps_per_batch)
