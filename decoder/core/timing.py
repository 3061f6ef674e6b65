"""One clock for every method, so timings are comparable: it syncs the accelerator before reading.

Each reading of a CUDA clock is a synchronisation; `no_clock` stands in when component times are
not asked for, so decoding is not synchronised more than its own data dependencies require.
`device_clock` is the profile's clock for GPU work: CUDA events on a CUDA device (the GPU's own
timestamps), the host's perf_counter elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

COMPONENTS = ("ngram", "mid", "scheduler", "tree", "verify")


def make_clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":

        def clock() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return clock
    return time.perf_counter


def zero_times() -> dict[str, float]:
    return dict.fromkeys(COMPONENTS, 0.0)


def no_clock() -> float:
    """A clock that never syncs and always reads 0 (component timing off)."""
    return 0.0


class EventClock:
    """A clock read off CUDA events: each reading records an event on the device's current stream,
    waits for it, and returns seconds since the clock was made, as the GPU timed them.

    Why events: a host clock read after ``synchronize`` also counts the host's own wake-up after
    the wait; two events on the stream time the GPU work between them. It keeps the zero-argument
    clock shape (``t1 - t0`` = seconds), so callers written for a host clock take it unchanged.
    """

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"an event clock needs a CUDA device, got {device}")
        self.device = device
        with torch.cuda.device(device):
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin.record()
            self._origin.synchronize()

    def __call__(self) -> float:
        with torch.cuda.device(self.device):
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            event.synchronize()
        return self._origin.elapsed_time(event) / 1e3  # elapsed_time is in ms


def device_clock(device: torch.device) -> tuple[Callable[[], float], str]:
    """The clock that times work on ``device``, and its name: CUDA events on a CUDA device
    (:class:`EventClock`), the host's ``time.perf_counter`` anywhere else."""
    if device.type == "cuda":
        return EventClock(device), "cuda_events"
    return time.perf_counter, "wall"
