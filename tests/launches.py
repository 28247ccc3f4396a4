"""Launching the project's scripts from tests as a user would, and killing them as a crash would: the helpers the
kill-and-resume drills, the multi-process runs and the vLLM script test share."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
PHASE_TIMEOUT = 300  # seconds for one phase (two concurrent launches) on a busy machine
MULTI_PROCESS_TIMEOUT = 600  # seconds for one launch among three, the first ZeRO-3 building DeepSpeed's op
GLOBAL_BATCH_4 = "Total train batch size (w. parallel, distributed & accumulation) = 4"  # 2 x 2, or 1 x 4


class Launch:
    """A script in its own process group (accelerate launch spawns a child: a kill must reach both), output to a
    log file, `env` added to the environment. Used as a context manager: whatever is still running at the end is
    killed."""

    def __init__(self, command: list, log: Path, env: dict | None = None):
        self.log = log
        with log.open("wb") as out:
            # PYTHONFAULTHANDLER: a launch that crashes prints every thread's Python stack into its log
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONFAULTHANDLER": "1",
                   **(env or {})}  # fmt: skip
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    timeout = PHASE_TIMEOUT  # seconds a launch may take to reach what is waited for, or to end

    def kill(self) -> None:
        """SIGKILL the process group."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def kill_when(self, ready, what: str) -> None:
        """`kill` as soon as `ready()` holds."""
        deadline = time.time() + self.timeout
        while not ready():
            assert self.process.poll() is None, f"ended before {what}:\n{self.text()[-3000:]}"
            assert time.time() < deadline, f"no {what} in {self.timeout} s"
            time.sleep(0.01)
        self.kill()

    def finish(self) -> int:
        try:
            return self.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process.poll() is None:
            self.kill()

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def succeeded(launch: Launch) -> None:
    assert launch.finish() == 0, launch.text()[-3000:]


def complete(checkpoint: Path) -> bool:
    """A checkpoint whose trainer state (transformers writes it last) is whole."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def weights_differ(a: Path, b: Path) -> list:
    """Names of the tensors of two saved models that are not bit-identical (all of them if the names differ)."""
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    if first.keys() != second.keys():
        return sorted(first.keys() ^ second.keys())
    return [name for name in first if not torch.equal(first[name], second[name])]


def step_logs(out: Path) -> list:
    """The per-step entries of a run's log history (those with a loss), in order."""
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [entry for entry in history if "loss" in entry]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


class Launches(Launch):
    """`accelerate launch` of several processes. torchrun starts each worker in a session of its own, so killing
    the launcher's process group (as `Launch` does) would leave the workers training on; these kills reach every
    process of the run at once, as a crash of the machine would."""

    timeout = MULTI_PROCESS_TIMEOUT

    def kill(self) -> None:
        everyone = [*descendants(self.process.pid), self.process.pid]  # read before any dies and is reparented
        for pid in everyone:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
