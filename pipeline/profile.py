"""DVC stage ``profile``: measure one latency profile per registered pair.

Writes ``<out_dir>/<pair>.json`` (collectors.latency JSON, replaced atomically) for every pair in
``pairs`` and prints a small table. Collectors store raw counts; these files price them, and a
profile measured elsewhere (e.g. on a GPU) re-prices the same counts without recollecting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from collectors.latency import LatencyProfile, save_profile
from config.params import Params, ProfileParams, resolve
from pipeline.cli import apply_runtime, run_stage

if TYPE_CHECKING:
    from decoder.models import ModelPair

log = logging.getLogger(__name__)


def format_table(profiles: Sequence[LatencyProfile]) -> str:
    """One line per pair: device, the largest verify, AR step, mid at the largest size, small costs."""
    head = (
        f"{'pair':<12} {'device':<8} {'verify@max':>10} {'AR step':>8} {'mid@max':>8} "
        f"{'ngram':>7} {'sched':>7} {'tree':>7}  (ms)"
    )
    lines = [head, "-" * len(head)]
    for p in profiles:
        n = p.verify_points[-1][0]
        mid = f"{p.mid_ms(p.mid_points[-1][0]):>8.3f}" if p.mid_points else f"{'-':>8}"
        lines.append(
            f"{p.pair:<12} {p.device:<8} {p.verify_ms(n):>10.3f} {p.ar_token_ms:>8.3f} {mid} "
            f"{p.ngram_step_ms:>7.4f} {p.scheduler_ms:>7.4f} {p.tree_overhead_ms:>7.3f}"
        )
    return "\n".join(lines)


def run_profile(settings: ProfileParams, load_pair_fn: Callable[[str], ModelPair]) -> list[Path]:
    """Load each pair with `load_pair_fn`, measure it, write ``<out_dir>/<pair>.json``; return the paths."""
    from collectors.profiling import measure_profile  # heavy import (torch) kept off --help

    out_dir = resolve(settings.out_dir)
    paths, profiles = [], []
    for name in settings.pairs:
        if not name or Path(name).name != name:
            raise ValueError(f"pair name {name!r} cannot be a file name")
        pair = load_pair_fn(name)
        profile = measure_profile(
            pair, name, settings.context_len, settings.sizes, settings.warmup, settings.repeats
        )
        paths.append(save_profile(profile, out_dir / f"{name}.json"))
        profiles.append(profile)
        log.info("wrote %s", paths[-1])
        del pair  # one pair's weights in memory at a time
    print(format_table(profiles))
    return paths


def main(params: Params) -> list[Path]:
    apply_runtime(params)
    from decoder.models import load_pair

    def load(name: str) -> ModelPair:
        target, mid = params.pair_paths(name)
        spec = params.pairs[name]
        return load_pair(target, mid, spec.dtype, spec.device)

    return run_profile(params.profile, load)


if __name__ == "__main__":
    run_stage("profile", main)
