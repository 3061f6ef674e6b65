"""A small process pool for deterministic work: same results as in-process, in plan order.

Contract: ``run_tasks(fn, tasks, workers, threads)`` returns ``[fn(*t.args) for t in tasks]``.
With ``workers <= 1`` it is exactly that loop, in this process. Otherwise ``workers`` spawned
processes (never forked: a forked torch runtime can deadlock) each set torch's threads to
``threads`` and take the tasks in their listed order; results come back in that order whatever
order they finish in. ``fn`` must be a module-level function and the args picklable.
``WorkerPool`` keeps such workers for many ``run`` calls, for a stage that hands out many small
batches of tasks (distill's student fits).

Devices: on ``device="cuda"`` the pool runs one worker per visible CUDA device (``workers`` counts CPU
processes only), and each worker makes its own ``cuda:i`` torch's current device before it takes a
task (decoder.models.devices.worker_devices), so tasks that load onto a bare ``cuda`` never share a GPU.
Any other device (``cpu``, an explicit ``cuda:1``) is every worker's, as ``workers`` says.

A task that raises fails the run: the parent raises ``TaskError`` naming the task's label (a report
id, a cell) with the worker's traceback; so does a worker that dies (killed, out of memory). Queued
tasks are cancelled and the ones already handed to a worker are let finish before the error is
raised, so tasks that write files atomically (temporary name, fsync, rename) leave nothing
half-written.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.context import BaseContext

from decoder.models.devices import cuda_device_count, worker_devices
from decoder.models.memory import configure_process


class TaskError(RuntimeError):
    """A task failed in a worker process (the message names it and carries the traceback)."""


@dataclass(frozen=True)
class Task:
    label: str  # names the task in progress and errors: a report id, a cell
    args: tuple


@dataclass(frozen=True)
class _Failure:
    kind: str
    message: str
    traceback: str


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


_device: str | None = None  # the device this worker process took (None: not a pool worker)


def worker_device() -> str | None:
    """The device this pool worker took at start (``cpu``, ``cuda:i``); None outside a worker."""
    return _device


def pool_device(devices: Iterable[str]) -> str:
    """The ``device`` for run_tasks of tasks decoding on ``devices`` (their pairs' params): ``cuda``
    where any is a bare ``cuda`` (those get a GPU each; a CPU pair ignores the current GPU), else
    ``cpu`` (explicit devices such as ``cuda:1`` need no sharing out)."""
    return "cuda" if "cuda" in set(devices) else "cpu"


def device_queue(ctx: BaseContext, device: str, workers: int) -> multiprocessing.Queue:
    """The devices of ``workers`` pool workers decoding on ``device``, one for each to take."""
    devices = ctx.Queue()
    for d in worker_devices(device, cuda_device_count() if device == "cuda" else 0, workers):
        devices.put(d)
    return devices


def _init_worker(threads: int, log_level: int, keep_freed: bool, devices: multiprocessing.Queue) -> None:
    global _device
    # a parent killed outright (SIGKILL) must not leave workers behind, running or idle
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    _device = devices.get()  # each worker takes one of the parent's planned devices, none twice
    configure_process(threads, keep_freed, _device)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s [worker %(process)d]: %(message)s")


def _run(job: tuple[int, Callable, tuple]) -> tuple[int, object]:
    i, fn, args = job
    try:
        return i, fn(*args)
    except Exception as err:  # the parent raises it, naming the task
        return i, _Failure(type(err).__name__, str(err), traceback.format_exc())


def run_tasks(
    fn: Callable,
    tasks: Sequence[Task],
    workers: int,
    threads: int,
    done: Callable[[Task, object], None] | None = None,
    keep_freed: bool = True,
    device: str = "cpu",
) -> list:
    """``fn(*task.args)`` for every task, in task order; ``done(task, result)`` as each finishes.
    Worker processes run decoder.models.memory.configure_process: ``threads`` torch threads and, with
    ``keep_freed``, freed memory kept, as the parent's ``apply_runtime`` does; and their own device
    (``device="cuda"``: one worker per visible GPU, see the module docstring)."""
    if device == "cuda":
        workers = len(worker_devices(device, cuda_device_count()))  # one per GPU; no GPU: an error
    with WorkerPool(min(workers, len(tasks)), threads, keep_freed, device) as pool:
        return pool.run(fn, tasks, done)


class WorkerPool:
    """``workers`` spawned processes kept for many :meth:`run` calls (a stage that runs many small
    batches of tasks pays the workers' start, torch's import, once); with ``workers <= 1``, no
    process: :meth:`run` is the plain loop in this one. Use it as a context manager: leaving it
    shuts the workers down."""

    def __init__(self, workers: int, threads: int, keep_freed: bool = True, device: str = "cpu") -> None:
        self._pool: ProcessPoolExecutor | None = None
        if workers > 1:
            ctx = multiprocessing.get_context("spawn")
            init = (threads, logging.getLogger().level, keep_freed, device_queue(ctx, device, workers))
            self._pool = ProcessPoolExecutor(workers, ctx, _init_worker, init)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(
        self, fn: Callable, tasks: Sequence[Task], done: Callable[[Task, object], None] | None = None
    ) -> list:
        """``fn(*task.args)`` for every task, in task order; ``done(task, result)`` as each
        finishes. A failed task cancels the queued ones and raises TaskError naming it."""
        if self._pool is None or len(tasks) <= 1:
            out = []
            for t in tasks:
                out.append(fn(*t.args))
                if done is not None:
                    done(t, out[-1])
            return out
        results: dict[int, object] = {}
        futures = {self._pool.submit(_run, (i, fn, t.args)): i for i, t in enumerate(tasks)}
        try:
            for future in as_completed(futures):
                i = futures[future]
                try:
                    _, result = future.result()
                except BrokenProcessPool as err:
                    left = [t.label for j, t in enumerate(tasks) if j not in results]
                    died = f"a worker process died with tasks unfinished: {', '.join(left)}"
                    raise TaskError(died) from err
                if isinstance(result, _Failure):
                    raise TaskError(
                        f"{tasks[i].label}: {result.kind}: {result.message}\n"
                        f"worker traceback:\n{result.traceback}"
                    )
                results[i] = result
                if done is not None:
                    done(tasks[i], result)
        except BaseException:
            for future in futures:
                future.cancel()
            wait(futures)  # the tasks already handed to a worker finish (their files are whole)
            raise
        return [results[i] for i in range(len(tasks))]
