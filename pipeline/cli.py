"""Shared entry point for stage modules: ``python -m pipeline.<stage> [--profile NAME]``.

A stage run this way sees only the params its dvc.yaml entry lists (config.params.restrict): a
read of anything else fails at once instead of going stale behind DVC's back.

Under DVC (which sets ``DVC_STAGE`` for every command) the values that dvc.yaml interpolates, the
out_dirs, come from params.yaml alone, since that is where DVC reads them: so
``dvc exp run -S overlay=smoke`` runs the overlay's sizes and writes where dvc.yaml looks. Run by
hand with ``--profile NAME``, a stage keeps the overlay's own out_dirs (artifacts/smoke/...).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock, Timeout

from config.params import ROOT, Params, ParamsError, load_params, restrict

DVC_STAGE_ENV = "DVC_STAGE"  # set by DVC for every stage command it runs
_VAR = re.compile(r"\$\{([\w.]+)\}")
LOCK_DIR = ".locks"  # beside the stage's out_dir: one profile's run does not block another's
log = logging.getLogger(__name__)


class StageBusyError(RuntimeError):
    """Another process is running the same stage into the same folder."""


def lock_path(stage: str, params: Params) -> Path:
    """``<parent of the stage's out_dir>/.locks/<stage>.lock``; artifacts/.locks for a stage
    without an out_dir of its own."""
    out_dir = getattr(getattr(params, stage, None), "out_dir", None)
    base = (ROOT / out_dir).resolve().parent if isinstance(out_dir, str) else ROOT / "artifacts"
    return base / LOCK_DIR / f"{stage}.lock"


def _write_pid(fd: int) -> None:
    """filelock's on_acquired hook: the holder's pid, for the message a second run prints."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _holder(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip() or "unknown"
    except OSError:  # removed since the failed acquire
        return "unknown"


@contextlib.contextmanager
def stage_lock(stage: str, path: Path) -> Iterator[None]:
    """Hold an exclusive file lock (filelock, flock on Unix) on ``path`` meanwhile, or raise
    StageBusyError naming the holder's pid. The OS drops a flock when its process dies, so a killed
    run never leaves a stale lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # flock only: filelock's soft fallback (a marker file) would outlive a killed run
    lock = FileLock(path, timeout=0, fallback_to_soft=False, on_acquired=_write_pid)
    try:
        lock.acquire()
    except Timeout:
        raise StageBusyError(f"stage {stage} is already running (pid {_holder(path)}); lock {path}") from None
    try:
        yield
    finally:
        lock.release()


@cache
def interpolated_keys() -> tuple[str, ...]:
    """Every dotted params key that dvc.yaml interpolates (``${data.out_dir}``), but the overlay."""
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    return tuple(sorted({k for k in _VAR.findall(text) if k != "overlay"}))


def dvc_view(params_file: Path | str | None) -> dict[str, Any]:
    """Overrides that pin each key dvc.yaml interpolates to its value in the params file itself."""
    path = Path(params_file) if params_file else ROOT / "params.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    overrides: dict[str, Any] = {}
    for key in interpolated_keys():
        *sections, leaf = key.split(".")
        value: Any = raw
        for part in [*sections, leaf]:
            if not isinstance(value, dict) or part not in value:
                raise ParamsError(f"dvc.yaml interpolates ${{{key}}}, which {path.name} does not set")
            value = value[part]
        node = overrides
        for part in sections:
            node = node.setdefault(part, {})
        node[leaf] = value
    return overrides


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
        under_dvc = bool(os.environ.get(DVC_STAGE_ENV)) and args.profile is None
        pinned = dvc_view(args.params) if under_dvc else None
        full = load_params(args.params, args.profile, overrides=pinned)
        params = stage_params(stage, full)
    except ParamsError as err:  # a bad params file: the message names the key, no traceback
        parser.exit(2, f"error: {err}\n")
    # Two runs of one stage would race on its out_dir (os.replace fails with ENOTEMPTY). DVC's
    # repository lock serialises its own runs; this lock also covers runs by hand.
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(stage_lock(stage, lock_path(stage, full)))
        except StageBusyError as err:
            parser.exit(2, f"error: {err}\n")
        main(params)
