"""Latency profiles across passes and machines: the median of a stage's passes, the comparison of
two profiles component by component, and the profile file writer.

Offline only: the profile stage takes the median of its passes (`median_profile`) and records how
far each pass strays from it (`compare_profiles`); wall_check compares a fresh profile with the
stage's. The runtime reads profiles with decoder.deploy.latency.load_profile.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from decoder.deploy.latency import SCHEMA_VERSION, LatencyProfile, Points
from decoder.io.files import replace_atomically


def save_profile(profile: LatencyProfile, path: str | Path) -> Path:
    """Write JSON atomically (temp file in the same folder, then os.replace); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(profile)}
    return replace_atomically(path, (json.dumps(data, indent=2) + "\n").encode())


@dataclass(frozen=True)
class Agreement:
    """How a second profile's figures for one component compare to a first's (ratios b / a)."""

    component: str
    n_points: int
    geomean_ratio: float
    worst_ratio: float  # the point furthest from 1 (in log terms)

    @property
    def worst_deviation(self) -> float:
        return abs(self.worst_ratio - 1.0)


def _curve(profile: LatencyProfile, component: str) -> dict[tuple[int, ...], float]:
    if component == "verify":
        return {(n,): ms for n, ms in profile.verify_points}
    if component == "tree":
        return {(n,): ms for n, ms in profile.tree_points}
    if component == "mid":
        return {
            (f, n): ms
            for f, row in zip(profile.mid_fed, profile.mid_grid_ms, strict=True)
            for n, ms in zip(profile.mid_tokens, row, strict=True)
        }
    if component == "small":  # one small step expanding f frontier nodes
        return {(f,): profile.small_ms(1, f) for f in (1, 4, 10)}
    return {(): float(getattr(profile, _SCALARS[component]))}


_SCALARS = {
    "mid_end": "mid_end_ms",
    "decision": "decision_ms",
    "ar": "ar_token_ms",
    "prompt_block": "prompt_block_ms",
}
# the cold-cache terms are differences of two medians floored at 0, often 0 on small pairs: no ratio
COMPONENTS = ("verify", "mid", "mid_end", "small", "decision", "ar", "tree", "prompt_block")


def compare_profiles(a: LatencyProfile, b: LatencyProfile) -> list[Agreement]:
    """Per component, the ratios b / a at the points both profiles measured (zero-cost points skipped)."""
    out = []
    for component in COMPONENTS:
        ca, cb = _curve(a, component), _curve(b, component)
        ratios = [cb[k] / ca[k] for k in ca if k in cb and ca[k] > 0 and cb[k] > 0]
        if not ratios:
            continue
        logs = [math.log(r) for r in ratios]
        worst = ratios[max(range(len(ratios)), key=lambda i: abs(logs[i]))]
        out.append(Agreement(component, len(ratios), math.exp(sum(logs) / len(logs)), worst))
    return out


_SAME = ("pair", "device", "device_name", "torch_threads", "clock", "torch_version", "dtype", "context_len",
         "warmup", "samples_per_repeat", "long_job_ms", "mid_tokens", "mid_fed")  # fmt: skip
_MEDIANS = ("ngram_step_ms", "ngram_node_ms", "ngram_mean_frontier", "decision_ms", "ar_token_ms",
            "mid_end_ms", "mid_cold_ms", "decision_cold_ms", "prompt_block_ms")  # fmt: skip


def median_profile(passes: Sequence[LatencyProfile]) -> LatencyProfile:
    """One profile from passes of the same measurement taken at different times: every figure (each
    verify and tree point, each mid table cell, each scalar) is the median over the passes, so a
    pass that a slow spell of the machine hit is outvoted (with 3 or more passes). ``repeats`` and
    ``passes`` add up. The passes must agree on everything but the figures (pair, device, clock,
    settings, the sizes measured); a ValueError names the first field that differs."""
    if not passes:
        raise ValueError("median_profile needs at least one pass")
    first = passes[0]
    for other in passes[1:]:
        for name in (*_SAME, "verify_points", "tree_points", "verify_cold_points"):
            a, b = getattr(first, name), getattr(other, name)
            if name.endswith("_points"):
                a, b = [n for n, _ in a], [n for n, _ in b]
            if a != b:
                raise ValueError(f"profile passes differ in {name}: {a!r} vs {b!r}")

    def med(values: Sequence[float]) -> float:
        ordered = sorted(values)
        k = len(ordered)
        return ordered[k // 2] if k % 2 else (ordered[k // 2 - 1] + ordered[k // 2]) / 2

    def points(name: str) -> Points:
        rows = [getattr(p, name) for p in passes]
        return tuple((n, med([r[i][1] for r in rows])) for i, (n, _) in enumerate(rows[0]))

    grid = tuple(
        tuple(med([p.mid_grid_ms[r][c] for p in passes]) for c in range(len(row)))
        for r, row in enumerate(first.mid_grid_ms)
    )
    return dataclasses.replace(
        first,
        repeats=sum(p.repeats for p in passes),
        passes=sum(p.passes for p in passes),
        verify_points=points("verify_points"),
        tree_points=points("tree_points"),
        verify_cold_points=points("verify_cold_points"),
        mid_grid_ms=grid,
        **{name: med([getattr(p, name) for p in passes]) for name in _MEDIANS},
    )
