"""Requests decoded as they arrive: one thread drives a `ContinuousBatch`, and each request's completions join it at
its next step.

A request (`Job`) asks for `n` completions of one prompt, each with its own seed, cap and sampling. The thread that
owns the backend takes new requests and cancellations between two steps, starts a waiting request once the batch
has a slot for each of its completions (`max_running` completions decode at once; requests beyond that wait, in
order, up to `max_waiting` of them, and one more is refused: `Busy`), then advances the batch by one step and tells
each request what its completions have added (`Update`). A completion stops at its EOS or its cap, or where one of
the request's stop strings first appears in its text (what follows is dropped).

Sampling does not depend on scheduling (the rollout backends' rule): a completion's tokens are a function of its
seed, so the same request gives the same completion alone or beside any load.
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..rollout.backend import Sampling, completion_seeds
from ..rollout.engine import ContinuousBatch, Rollout

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05  # how long the idle thread waits for a request before it looks at its stop flag again


class Busy(Exception):
    """Every slot is taken and the queue is full: the request is refused (HTTP 429)."""


class Closed(Exception):
    """The scheduler is draining or stopped: it takes no new request (HTTP 503)."""


@dataclass(frozen=True)
class Update:
    """What completion `index` of a request holds now: its text (cut before a stop string), its completion ids (all
    it has produced, a stop string's tokens included) and, once it has ended, why: "stop" (its EOS or a stop string)
    or "length" (its cap). `error`: the scheduler failed while decoding it (finish is "error")."""

    index: int
    text: str
    completion_ids: tuple
    finish: str | None = None
    error: str | None = None


@dataclass(eq=False)
class Job:
    """One request: `n` completions of `prompt` (token ids), seeded with `seeds` (one each; None: drawn by the
    scheduler), capped at `cap` tokens, drawn with `sampling`, stopped at any of `stop`. `listener` is called from the
    scheduler's thread with each `Update`."""

    prompt: list
    listener: Callable[[Update], None]
    n: int = 1
    cap: int | None = None
    sampling: Sampling | None = None
    seeds: list | None = None
    stop: tuple = ()
    rollouts: list = field(default_factory=list)  # the running completions, once started
    reported: list = field(default_factory=list)  # ids each completion had when it was last reported
    ended: list = field(default_factory=list)


class Scheduler:
    """Continuous batching of requests over the engine `build` returns (`ForkJoinEngine` or `PlainEngine`), in a
    thread of its own (`start`, then `submit` and `cancel` from any thread; `drain` finishes what was accepted and
    stops). The engine is built in that thread, which alone uses it: vLLM's CPU engine binds its compute threads to
    the thread that built it, and steps from another thread took twice as long. `decode` turns completion ids into
    text (the tokenizer's, tags kept); `seed` seeds the draws of the requests that give none."""

    def __init__(
        self,
        build: Callable[[], object],
        decode: Callable[[list], str],
        max_running: int = 64,
        max_waiting: int = 256,
        seed: int = 0,
    ):
        if max_running < 1 or max_waiting < 0:
            raise ValueError(f"max_running must be >= 1 and max_waiting >= 0, got {max_running}, {max_waiting}")
        self.build, self.batch, self.decode = build, None, decode
        self.max_running, self.max_waiting = max_running, max_waiting
        self.generator = torch.Generator().manual_seed(seed)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("job", job) and ("cancel", job), in order
        self._lock = threading.Lock()
        self._waiting_count = 0  # requests accepted and not started yet
        self._closed = self._aborted = False
        self._waiting: deque[Job] = deque()  # the thread's own
        self._running: list[Job] = []
        self._thread = threading.Thread(target=self._loop, name="parallel-r1-scheduler", daemon=True)

    # ------------------------------------------------------------------ any thread

    def start(self) -> Scheduler:
        """Start the thread and wait until it has built the engine (its error, if building fails, is raised here)."""
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self._thread.start()
        self._built.wait()
        if self._build_error is not None:
            raise self._build_error
        return self

    def submit(self, job: Job) -> None:
        """Queue `job`; raise `Busy` when `max_waiting` requests wait already, `Closed` while draining."""
        if job.n > self.max_running:
            raise ValueError(f"n={job.n} is more completions than the server decodes at once ({self.max_running})")
        with self._lock:
            if self._closed:
                raise Closed("the server is shutting down")
            if self._waiting_count >= self.max_waiting and self.busy():
                raise Busy(f"{self._waiting_count} requests wait already (max_waiting={self.max_waiting})")
            self._waiting_count += 1
            self._inbox.put(("job", job))  # under the lock: a drain that follows sees it

    def busy(self) -> bool:
        """Whether a request arriving now would wait (the batch has no free slot, or requests wait already)."""
        return self._waiting_count > 0 or self.running() >= self.max_running

    def running(self) -> int:
        """Completions being decoded now."""
        return len(self.batch) if self.batch is not None else 0

    def waiting(self) -> int:
        """Requests accepted and not started yet."""
        return self._waiting_count

    def cancel(self, job: Job) -> None:
        """Stop `job` (its client has gone): its waiting place or its running completions, and their cache, freed."""
        self._inbox.put(("cancel", job))

    def alive(self) -> bool:
        """Whether the thread is running (False before `start` and after a drain)."""
        return self._thread.is_alive()

    def drain(self, timeout: float | None = None) -> None:
        """Take no new request, finish those accepted (for up to `timeout` seconds: then the rest end with an error),
        then stop the thread."""
        with self._lock:
            self._closed = True
            self._inbox.put(("wake", None))
        if not self._thread.is_alive():
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._inbox.put(("abort", None))
            self._thread.join()

    # ------------------------------------------------------------------ the scheduler's thread

    def _loop(self) -> None:
        try:
            self.batch = ContinuousBatch(self.build())
        except BaseException as error:
            self._build_error = error
            return
        finally:
            self._built.set()
        while not self._aborted:
            try:
                self._read_inbox(block=not self.batch and not self._waiting)
                self._start_waiting()
                if not self.batch:
                    if self._closed and not self._waiting and self._inbox.empty():
                        return
                    continue
                self.batch.step()
                self._report()
            except Exception as error:  # a failed step fails what it was decoding, not the server
                logger.exception("a decoding step failed")
                self._fail_running(f"decoding failed: {type(error).__name__}: {error}")
        self._fail_running("the server shut down before this completion ended")
        for job in self._waiting:
            for index in range(job.n):
                _tell(job, Update(index, "", (), "error", "the server shut down before this request started"))

    def _read_inbox(self, block: bool) -> None:
        try:
            kind, job = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if kind == "job":
                self._waiting.append(job)
            elif kind == "cancel":
                self._cancel(job)
            elif kind == "abort":
                self._aborted = True
            try:
                kind, job = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _start_waiting(self) -> None:
        """Start waiting requests in order while the batch has a slot for each of their completions."""
        while self._waiting and len(self.batch) + self._waiting[0].n <= self.max_running:
            job = self._waiting.popleft()
            with self._lock:
                self._waiting_count -= 1
            seeds = job.seeds or completion_seeds(self.generator, job.n)
            try:
                job.rollouts = self.batch.add([job.prompt] * job.n, seeds, job.cap, job.sampling)
            except Exception as error:
                logger.exception("a request could not start")
                for index in range(job.n):
                    _tell(job, Update(index, "", (), "error", f"{type(error).__name__}: {error}"))
                continue
            job.reported, job.ended = [0] * job.n, [False] * job.n
            self._running.append(job)

    def _cancel(self, job: Job) -> None:
        if job in self._waiting:
            self._waiting.remove(job)
            with self._lock:
                self._waiting_count -= 1
        for rollout in job.rollouts:
            self.batch.cancel(rollout)
        self._running = [running for running in self._running if running is not job]

    def _report(self) -> None:
        """Tell each running request what its completions added in this step, and drop those that have ended."""
        for job in self._running:
            for index, rollout in enumerate(job.rollouts):
                if not job.ended[index]:
                    self._report_one(job, index, rollout)
        self._running = [job for job in self._running if not all(job.ended)]

    def _report_one(self, job: Job, index: int, rollout: Rollout) -> None:
        ids = rollout.completion_ids
        running = self.batch.running(rollout)
        if running and len(ids) == job.reported[index]:
            return
        reported, text, finish = len(ids), self.decode(ids), None
        cut = _first_stop(text, job.stop)
        if cut is not None:
            text, finish = text[:cut], "stop"
            ids = ids[: self._covering(ids, cut)]
            if running:
                self.batch.cancel(rollout)
        elif not running:
            finish = "stop" if rollout.finish == "eos" else "length"
        job.reported[index], job.ended[index] = reported, finish is not None
        _tell(job, Update(index, text, tuple(ids), finish))

    def _covering(self, ids: list, length: int) -> int:
        """The fewest leading ids whose text holds `length` characters (what a completion cut by a stop string
        keeps)."""
        return bisect.bisect_left(range(len(ids) + 1), length, key=lambda count: len(self.decode(ids[:count])))

    def _fail_running(self, message: str) -> None:
        for job in self._running:
            for index, rollout in enumerate(job.rollouts):
                if not job.ended[index]:
                    _tell(job, Update(index, "", tuple(rollout.completion_ids), "error", message))
        self.batch.cancel_all()
        self._running = []


def _tell(job: Job, update: Update) -> None:
    """Give `update` to its request; a listener that fails (its client's loop has closed) is logged, not raised."""
    try:
        job.listener(update)
    except Exception:
        logger.exception("a request's listener failed")


def _first_stop(text: str, stops: tuple) -> int | None:
    """Where the first of `stops` starts in `text`, or None."""
    found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return min(found) if found else None
