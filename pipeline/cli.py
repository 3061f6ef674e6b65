"""Shared entry point for stage modules: ``python -m pipeline.<stage> [--profile NAME]``.

A stage run this way sees only the params its dvc.yaml entry lists (config.params.restrict): a
read of anything else fails at once instead of going stale behind DVC's back.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from functools import cache

import yaml

from config.params import ROOT, Params, ParamsError, load_params, restrict


@cache
def declared_params(stage: str) -> tuple[str, ...]:
    """The params entries (``section`` or ``section.key``) of a stage in dvc.yaml."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    if stage not in stages:
        raise ParamsError(f"dvc.yaml has no stage {stage!r}")
    return tuple(str(e) for e in stages[stage].get("params", []))


def stage_params(stage: str, params: Params) -> Params:
    """``params`` restricted to what dvc.yaml declares for ``stage``."""
    return restrict(params, stage, declared_params(stage))


def run_stage(stage: str, main: Callable[[Params], object]) -> None:
    """Parse ``--profile``/``--params``, configure logging, load params and call ``main``."""
    parser = argparse.ArgumentParser(prog=f"python -m pipeline.{stage}")
    parser.add_argument(
        "--profile", default=None, help="profiles/<name>.yaml overlay (default: params.yaml's)"
    )
    parser.add_argument("--params", default=None, help="params file (default: params.yaml)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        params = stage_params(stage, load_params(args.params, args.profile))
    except ParamsError as err:  # a bad params file: the message names the key, no traceback
        parser.exit(2, f"error: {err}\n")
    main(params)
