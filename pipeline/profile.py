"""DVC stage ``profile``: measure one latency profile per registered pair.

Writes ``<out_dir>/<pair>.json`` (decoder.deploy.latency JSON, replaced atomically) for every pair in
``pairs``, each the median of ``passes`` passes measured in turn (:func:`run_profile`), every pass
itself as ``<out_dir>/passes/<pair>.<i>.json`` (evaluate prices its headline under each), with
``<out_dir>/passes.json`` (each pass's worst ratio to that median, per component), and prints
both as tables. Collectors store raw counts; these files price them, and a
profile measured elsewhere (e.g. on a GPU) re-prices the same counts without recollecting.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from collectors.collect.plan import PASSES_DIR
from collectors.pricing.profile_passes import compare_profiles, median_profile, save_profile
from config.params import Params, ProfileParams, resolve
from decoder.core.config import TreeConfig
from decoder.deploy.latency import LatencyProfile
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_metrics, stage_run, write_json

if TYPE_CHECKING:
    from decoder.models.pair import ModelPair

log = logging.getLogger(__name__)


def format_table(profiles: Sequence[LatencyProfile]) -> str:
    """One line per pair: device, the largest verify, AR step, the largest mid call on an empty
    tree and on the most fed nodes, the small costs, the tree work at the largest size and the
    cold-cache round terms (the verify's largest, mid, decision)."""
    head = (
        f"{'pair':<12} {'device':<8} {'verify@max':>10} {'AR step':>8} {'mid@max':>8} {'+fed':>8} "
        f"{'ngram':>7} {'decide':>7} {'tree@max':>8} {'cold v/m/d':>17}  (ms)"
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
            f"{p.ngram_step_ms:>7.4f} {p.decision_ms:>7.4f} {p.tree_ms(t):>8.3f} "
            f"{max((ms for _, ms in p.verify_cold_points), default=0.0):>5.3f}/{p.mid_cold_ms:.3f}/"
            f"{p.decision_cold_ms:.3f}"
        )
    return "\n".join(lines)


def run_profile(
    settings: ProfileParams,
    load_pair_fn: Callable[[str], ModelPair],
    tree: TreeConfig = TreeConfig(),  # noqa: B008 (frozen: a shared default is safe)
) -> list[Path]:
    """Measure every pair ``settings.passes`` times, the pairs in turn (pass 1 of each pair, then
    pass 2 of each, ...), each pass a full measure_profile on real rounds of the given tree
    settings; write ``<out_dir>/<pair>.json``, the median of the passes figure by figure
    (decoder.deploy.latency.median_profile), and ``<out_dir>/passes.json``, how far each pass strayed
    from that median per component; return the pairs' paths.

    Why passes: this box's speed drifts over minutes. One pass of zoo-m measured every figure
    1.3-2.2x what a pass hours later measured (the AR step 1.97 vs 0.88 ms) while the large pairs
    moved 3-10%: a slow spell during the half minute a small pair is timed. Spread over the whole
    stage, a spell hits one pass of a pair and the median outvotes it."""
    from collectors.pricing.profile_settings import measure_with_settings  # heavy (torch): off --help

    if settings.passes < 1:
        raise ValueError(f"profile.passes must be >= 1, got {settings.passes}")
    for name in settings.pairs:
        if not name or Path(name).name != name:
            raise ValueError(f"pair name {name!r} cannot be a file name")
    out_dir = resolve(settings.out_dir)
    measured: dict[str, list[LatencyProfile]] = {name: [] for name in settings.pairs}
    for _ in range(settings.passes):
        for name in settings.pairs:
            pair = load_pair_fn(name)
            measured[name].append(measure_with_settings(pair, name, settings, tree))
            del pair  # one pair's weights in memory at a time
    paths, profiles = [], []
    for name, passes in measured.items():
        profile = median_profile(passes)
        paths.append(save_profile(profile, out_dir / f"{name}.json"))
        for i, one in enumerate(passes):  # each pass too: the headline is priced under every one
            save_profile(one, out_dir / PASSES_DIR / f"{name}.{i}.json")
        profiles.append(profile)
        log.info("wrote %s and its %d passes", paths[-1], len(passes))
    spread = pass_spread(measured)
    write_json(out_dir / PASSES_FILE, spread)
    print(format_table(profiles))
    print(format_spread(spread))
    return paths


PASSES_FILE = "passes.json"


def pass_spread(measured: dict[str, list[LatencyProfile]]) -> dict[str, dict[str, list[float]]]:
    """Per pair and component, each pass's worst ratio to the combined profile (1: it agreed)."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, passes in measured.items():
        combined = median_profile(passes)
        rows: dict[str, list[float]] = {}
        for p in passes:
            for g in compare_profiles(combined, p):
                rows.setdefault(g.component, []).append(g.worst_ratio)
        out[name] = rows
    return out


def format_spread(spread: dict[str, dict[str, list[float]]]) -> str:
    """One line per pair: per component, the worst pass's ratio to the combined figure."""
    lines = ["pass vs combined profile, worst point per component (1.00: the pass agreed):"]
    for name, rows in spread.items():
        worst = {c: max(v, key=lambda r: abs(math.log(r))) for c, v in rows.items()}
        lines.append(f"  {name:<12} " + "  ".join(f"{c} {r:.2f}" for c, r in worst.items()))
    return "\n".join(lines)


def main(params: Params) -> list[Path]:
    apply_runtime(params)
    from decoder.models.pair import load_pair

    def load(name: str) -> ModelPair:
        target, mid = params.pair_paths(name)
        spec = params.pairs[name]
        return load_pair(target, mid, spec.dtype, spec.device, spec.linear)

    with stage_run("profile", params):
        paths = run_profile(params.profile, load, TreeConfig(**params.tree.model_dump()))
        spread = json.loads((resolve(params.profile.out_dir) / PASSES_FILE).read_text())
        worst = {
            f"pass_deviation_{name}": max(abs(r - 1.0) for v in rows.values() for r in v)
            for name, rows in spread.items()
        }
        log_metrics({"n_pairs": len(paths), "passes": params.profile.passes, **worst})
    return paths


if __name__ == "__main__":
    run_stage("profile", main)
