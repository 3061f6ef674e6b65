"""Freed heap memory kept in the process (glibc malloc), so that decoding on a CPU does not page-fault;
and :func:`configure_process`, the one setup every decoding process runs (a stage, a pool or Ray
worker, a benchmark).

A decoding round allocates and frees tensors of many sizes: a tree's attention mask, the KV cache
grown by a block, a block's logits. glibc hands large freed blocks back to the kernel (it unmaps
chunks above its mmap threshold and trims the heap's top above its trim threshold), so the next
allocation of that size faults every page in again and the kernel zeroes each one. Measured on
zoo-m's All-Mid rounds (mid-m, 100 tree nodes a call, one thread): 230-590 minor page faults per mid
call and 2.4-3.0 ms a call, against none and 1.9 ms with both thresholds raised; the latency
profile, which times each job again and again with the same sizes, where glibc's adaptive threshold
keeps the memory, saw only the 1.9 ms. With :func:`keep_freed_memory` decoding pays what the profile
measures, and on a CPU it is faster.

Elsewhere (another C library, or a platform without ``mallopt``) it does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import torch

from decoder.models.devices import use_device

# mallopt(3) parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2: 32 MiB on 64-bit platforms
MMAP_THRESHOLD_MAX = 32 << 20
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory(trim_bytes: int = TRIM_THRESHOLD, mmap_bytes: int = MMAP_THRESHOLD_MAX) -> bool:
    """Raise glibc's trim threshold to ``trim_bytes`` and its mmap threshold to ``mmap_bytes`` in
    this process (``mallopt``; a fixed mmap threshold also turns glibc's adaptive one off): freed
    blocks below them stay in the heap for the next allocation. Returns whether both were set: False
    where the C library is not glibc. A process started after this call (``spawn``) starts with
    glibc's defaults again."""
    if trim_bytes < 0 or not 0 <= mmap_bytes <= MMAP_THRESHOLD_MAX:
        raise ValueError(
            f"keep_freed_memory needs trim_bytes >= 0 and 0 <= mmap_bytes <= {MMAP_THRESHOLD_MAX}, "
            f"got {trim_bytes} and {mmap_bytes}"
        )
    if platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = ctypes.CDLL(name).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, trim_bytes)) and bool(mallopt(M_MMAP_THRESHOLD, mmap_bytes))


def configure_process(threads: int, keep_freed: bool, device: str | None = None) -> bool:
    """Set this process up for decoding, in this order: ``threads`` torch threads; glibc keeps freed
    memory when ``keep_freed`` (:func:`keep_freed_memory` with its defaults); a ``cuda:i``
    ``device`` becomes torch's current device (decoder.models.devices.use_device; None or a CPU changes
    nothing). Returns whether freed memory is kept: False when not asked, or where the C library is
    not glibc."""
    torch.set_num_threads(threads)
    kept = keep_freed and keep_freed_memory()
    use_device(device)
    return kept
