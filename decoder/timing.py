"""One clock for every method, so timings are comparable: it syncs the accelerator before reading.

Each reading of a CUDA clock is a synchronisation; `no_clock` stands in when component times are
not asked for, so decoding is not synchronised more than its own data dependencies require.
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
