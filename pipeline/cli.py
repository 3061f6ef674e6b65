"""Shared entry point for stage modules: ``python -m pipeline.<stage> [--profile NAME]``."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from config.params import Params, load_params


def run_stage(stage: str, main: Callable[[Params], object]) -> None:
    """Parse ``--profile``/``--params``, configure logging, load params and call ``main``."""
    parser = argparse.ArgumentParser(prog=f"python -m pipeline.{stage}")
    parser.add_argument("--profile", default=None, help="profiles/<name>.yaml overlay")
    parser.add_argument("--params", default=None, help="params file (default: params.yaml)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(load_params(args.params, args.profile))


def apply_runtime(params: Params) -> None:
    """Thread settings for the stages that decode and time (same for profile, collect, evaluate)."""
    import torch

    torch.set_num_threads(params.runtime.torch_threads)
