"""How the stages that decode and time use the machine: the pairs' devices checked against this torch
build, torch threads and glibc's freed memory."""

from __future__ import annotations

import logging

from config.params import Params
from decoder.models.devices import require_device
from decoder.models.memory import configure_process

log = logging.getLogger(__name__)


def apply_runtime(params: Params) -> None:
    """Device check, thread and memory settings for the stages that decode and time (the same for
    profile, collect, evaluate and the rest): every ``pairs.<id>.device`` must be one this torch can
    use (decoder.models.devices.require_device: one error naming the key, before any work), then
    ``runtime.torch_threads`` and ``runtime.keep_freed_memory`` (decoder.models.memory.configure_process;
    worker processes run it themselves)."""
    for pair_id, spec in params.pairs.items():
        require_device(spec.device, f"pairs.{pair_id}.device")
    keep = params.runtime.keep_freed_memory
    if not configure_process(params.runtime.torch_threads, keep) and keep:
        log.info("runtime.keep_freed_memory: the C library is not glibc; its malloc is left as it is")
