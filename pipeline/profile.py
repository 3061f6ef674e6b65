"""DVC stage ``profile``: measure one latency profile per registered pair.

Writes ``<out_dir>/<pair>.json`` (collectors.latency JSON, replaced atomically) for every pair in
``pairs`` and prints a small table. Collectors store raw counts; these files price them, and a
profile measured elsewhere (e.g. on a GPU) re-prices the same counts without recollecting.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from collectors.latency import LatencyProfile, save_profile
from config.params import Params, ProfileParams, resolve
from decoder.config import TreeConfig
from pipeline.cli import apply_runtime, run_stage
from pipeline.tracking import log_metrics, stage_run

if TYPE_CHECKING:
    from decoder.models import ModelPair

log = logging.getLogger(__name__)


def format_table(profiles: Sequence[LatencyProfile]) -> str:
    """One line per pair: device, the largest verify, AR step, the largest mid call on an empty
    tree and on the most fed nodes, the small costs and the tree work at the largest size."""
    head = (
        f"{'pair':<12} {'device':<8} {'verify@max':>10} {'AR step':>8} {'mid@max':>8} {'+fed':>8} "
        f"{'ngram':>7} {'decide':>7} {'tree@max':>8}  (ms)"
    )
    lines = [head, "-" * len(head)]
    for p in profiles:
        n, t = p.verify_points[-1][0], p.tree_points[-1][0]
        mid = (
            f"{p.mid_ms(p.mid_tokens[-1]):>8.3f} {p.mid_ms(p.mid_tokens[-1], p.mid_fed[-1]):>8.3f}"
            if p.has_mid
            else f"{'-':>8} {'-':>8}"
        )
        lines.append(
            f"{p.pair:<12} {p.device:<8} {p.verify_ms(n):>10.3f} {p.ar_token_ms:>8.3f} {mid} "
            f"{p.ngram_step_ms:>7.4f} {p.decision_ms:>7.4f} {p.tree_ms(t):>8.3f}"
        )
    return "\n".join(lines)


def run_profile(
    settings: ProfileParams,
    load_pair_fn: Callable[[str], ModelPair],
    tree: TreeConfig = TreeConfig(),  # noqa: B008 (frozen: a shared default is safe)
) -> list[Path]:
    """Load each pair with `load_pair_fn`, measure it on real rounds of the given tree settings,
    write ``<out_dir>/<pair>.json``; return the paths."""
    from collectors.profiling import measure_profile  # heavy import (torch) kept off --help

    out_dir = resolve(settings.out_dir)
    paths, profiles = [], []
    for name in settings.pairs:
        if not name or Path(name).name != name:
            raise ValueError(f"pair name {name!r} cannot be a file name")
        pair = load_pair_fn(name)
        profile = measure_profile(
            pair,
            name,
            context_len=settings.context_len,
            sizes=settings.sizes,
            warmup=settings.warmup,
            repeats=settings.repeats,
            mid_tokens=settings.mid_tokens,
            mid_fed=settings.mid_fed,
            samples_per_repeat=settings.samples_per_repeat,
            tree_config=tree,
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

    with stage_run("profile", params):
        paths = run_profile(params.profile, load, TreeConfig(**dataclasses.asdict(params.tree)))
        log_metrics({"n_pairs": len(paths)})
    return paths


if __name__ == "__main__":
    run_stage("profile", main)
