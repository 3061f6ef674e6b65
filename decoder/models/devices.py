"""Which device a process decodes on: a params key checked against this torch build, and one device
per worker process when several share a machine's GPUs.

Contract:
- :func:`require_device` turns a device string from params into a torch device, or raises one
  ValueError that names the params key and says why: a CPU-only torch build (no CUDA compiled in),
  a CUDA build that sees no GPU, an index past the visible devices.
- :func:`worker_devices` assigns each worker process its device: a bare ``cuda`` goes round-robin
  over the visible devices (``cuda:0``, ``cuda:1``, ...; one worker per device unless a count is
  given); any other device (``cpu``, ``cuda:1``, ``mps``) is every worker's as it is.
- A worker that takes ``cuda:i`` makes it torch's current device (:func:`use_device`), so code that
  places tensors on a bare ``cuda`` lands on the worker's own GPU without knowing the index.
"""

from __future__ import annotations

import torch

SETUP_GPU = "make setup-gpu"  # the Makefile target that installs torch's CUDA build


def cuda_device_count() -> int:
    """CUDA devices this process sees (0 on a CPU-only build); one place for tests to stand in for."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_device(device: str, key: str) -> torch.device:
    """``device`` (the value of params key ``key``) as a torch device this process can use."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{key}: {device!r} is not a torch device ({err})") from None
    if dev.type == "cuda":
        if torch.version.cuda is None:
            raise ValueError(
                f"{key}: {device!r} asks for CUDA, but this torch ({torch.__version__}) is a CPU-only "
                f"build with no CUDA; install a CUDA build ({SETUP_GPU}) or set {key}: cpu"
            )
        count = cuda_device_count()
        if count == 0:
            raise ValueError(
                f"{key}: {device!r} asks for CUDA; this torch ({torch.__version__}, CUDA "
                f"{torch.version.cuda}) sees no GPU (driver missing or CUDA_VISIBLE_DEVICES empty)"
            )
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{key}: {device!r}, but only {count} CUDA device(s) are visible")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{key}: {device!r}, but MPS is not available on this machine")
    return dev


def worker_devices(device: str, count: int, workers: int | None = None) -> list[str]:
    """The device of each of ``workers`` worker processes decoding on ``device`` with ``count``
    visible CUDA devices; ``workers=None`` means one per device for a bare ``cuda``, else one."""
    if workers is not None and workers < 1:
        raise ValueError(f"worker_devices needs workers >= 1, got {workers}")
    if device != "cuda":
        return [device] * (workers or 1)
    if count < 1:
        raise ValueError(f"device 'cuda': no CUDA device is visible to share out (torch {torch.__version__})")
    return [f"cuda:{i % count}" for i in range(count if workers is None else workers)]


def use_device(device: str | None) -> None:
    """Make a ``cuda:i`` device torch's current one in this process; anything else changes nothing
    (a CPU process stays exactly as it was)."""
    if device is None:
        return
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
