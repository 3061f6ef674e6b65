"""Minor page faults of an allocation churn that glibc's default malloc hands back to the kernel.

Each round allocates a few 2 MiB blocks, writes them and frees them all: the freed heap top is
larger than glibc's default trim threshold, so it is trimmed and the next round faults every page
in again, as a decoding round's tensors did (decoder/models/memory.py). Importable by spawned workers."""

from __future__ import annotations

import resource

import numpy as np


def churn(rounds: int = 20, blocks: int = 6, block_bytes: int = 2 << 20) -> None:
    for _ in range(rounds):
        held = [np.ones(block_bytes // 8) for _ in range(blocks)]
        del held


def faults_of_churn(rounds: int = 20) -> int:
    """Minor page faults of ``rounds`` rounds after three untimed ones (the heap grown once)."""
    churn(3)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn(rounds)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
