"""How the stages that decode and time use the machine: torch threads and glibc's freed memory."""

from __future__ import annotations

import logging

import torch

from config.params import Params
from decoder.memory import keep_freed_memory

log = logging.getLogger(__name__)


def apply_runtime(params: Params) -> None:
    """Thread and memory settings for the stages that decode and time (the same for profile,
    collect, evaluate and the rest): ``runtime.torch_threads``, and ``runtime.keep_freed_memory``
    (decoder.memory.keep_freed_memory; worker processes apply both themselves)."""
    torch.set_num_threads(params.runtime.torch_threads)
    if params.runtime.keep_freed_memory and not keep_freed_memory():
        log.info("runtime.keep_freed_memory: the C library is not glibc; its malloc is left as it is")
