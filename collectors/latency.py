"""Latency accounting for the collectors: raw counts in, milliseconds out, through a measured profile.

Contract:
- Collectors store what a round did (`RoundCounts`: verified nodes including the root, tokens per
  mid call, small steps, scheduler decisions). `price_round` turns counts into ms with a
  `LatencyProfile`, so the same counts can be re-priced with another profile (another device,
  dtype or context length) without recollecting.
- Profiles come from collectors.profiling.measure_profile (kept apart: this module imports neither
  torch nor transformers, so any stage can re-price counts). A profile holds medians after warm-up
  on a fixed cached context of `context_len` tokens, and says what device, dtype and threads.
- A forward's cost is piecewise-linear through the measured (size, median ms) points. Past the
  largest size it extends the last segment, with the slope floored at 0 so timing noise never makes
  a bigger forward cheaper; below the smallest size it keeps that size's cost. A mid call that
  forwards 0 tokens costs 0 ms (MidDrafter.rescore skips the forward).
- Profiles are JSON with a schema_version. `save_profile` replaces the file atomically;
  `load_profile` rejects another version and missing or unknown keys with a ValueError naming the file.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kept off import so re-pricing needs neither torch nor transformers
    from decoder.generate import RoundStats

SCHEMA_VERSION = 1
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 96, 128)
Points = tuple[tuple[int, float], ...]  # (size, median ms), sizes strictly increasing


def interpolate(points: Points, n: float) -> float:
    """Piecewise-linear cost at size n (see the module docstring for both ends)."""
    if not points:
        raise ValueError("no measured points to interpolate")
    sizes = [s for s, _ in points]
    if n <= sizes[0] or len(points) == 1:
        return points[0][1]
    i = bisect.bisect_left(sizes, n)
    if i == len(points):
        (x0, y0), (x1, y1) = points[-2], points[-1]
        return y1 + max(0.0, (y1 - y0) / (x1 - x0)) * (n - x1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


def _clean_points(name: str, points: Sequence[Sequence[float]]) -> Points:
    out = tuple((int(s), float(ms)) for s, ms in points)
    sizes = [s for s, _ in out]
    if any(s < 1 for s in sizes) or sizes != sorted(set(sizes)):
        raise ValueError(f"{name}: sizes must be positive and strictly increasing, got {sizes}")
    if not all(math.isfinite(ms) and ms >= 0 for _, ms in out):
        raise ValueError(f"{name}: times must be finite and >= 0, got {[ms for _, ms in out]}")
    return out


@dataclass(frozen=True)
class LatencyProfile:
    """Measured costs (ms) of one pair on one device; see the module docstring for the cost model."""

    pair: str
    device: str  # torch device string, e.g. "cuda:0"
    device_name: str  # CPU model or GPU name
    torch_threads: int
    torch_version: str
    dtype: str
    context_len: int  # cached tokens every timed forward ran on top of
    warmup: int
    repeats: int
    verify_points: Points  # target verification: tree nodes incl. the root -> ms
    mid_points: Points  # one mid call: tokens forwarded -> ms; empty when the pair has no mid
    ngram_step_ms: float  # one small (n-gram) drafting step
    scheduler_ms: float  # one 17->64->32->1 MLP decision in NumPy
    ar_token_ms: float  # one autoregressive target step
    tree_overhead_ms: float  # per-round bookkeeping outside drafting and verification (prune etc.)

    def __post_init__(self) -> None:
        object.__setattr__(self, "verify_points", _clean_points("verify_points", self.verify_points))
        object.__setattr__(self, "mid_points", _clean_points("mid_points", self.mid_points))
        if not self.verify_points:
            raise ValueError("verify_points must not be empty")
        for name in ("ngram_step_ms", "scheduler_ms", "ar_token_ms", "tree_overhead_ms"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def verify_ms(self, n_nodes: int) -> float:
        """Target verification of a tree of n_nodes nodes, the root included."""
        if n_nodes < 1:
            raise ValueError(f"a verified tree has at least the root, got n_nodes={n_nodes}")
        return interpolate(self.verify_points, n_nodes)

    def mid_ms(self, n_tokens: int) -> float:
        """One mid-drafter call forwarding n_tokens (catch-up + tree nodes)."""
        if not self.mid_points:
            raise ValueError(f"profile of pair {self.pair!r} has no mid-drafter timings (pair without mid)")
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        return 0.0 if n_tokens == 0 else interpolate(self.mid_points, n_tokens)


FIELDS = tuple(f.name for f in dataclasses.fields(LatencyProfile))


def save_profile(profile: LatencyProfile, path: str | Path) -> Path:
    """Write JSON atomically (temp file in the same folder, then os.replace); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(profile)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_profile(path: str | Path) -> LatencyProfile:
    """Read a profile; ValueError naming the file on bad JSON, another version, or wrong keys."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    version = data.pop("schema_version", None)
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version!r}, this code reads {SCHEMA_VERSION}")
    missing, unknown = sorted(set(FIELDS) - set(data)), sorted(set(data) - set(FIELDS))
    if missing or unknown:
        raise ValueError(f"{path}: missing key(s) {missing}, unknown key(s) {unknown}")
    try:
        return LatencyProfile(**data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from err


@dataclass(frozen=True)
class RoundCounts:
    """What one round did, independent of any clock."""

    verified_nodes: int  # nodes the target verified, the root included
    mid_call_tokens: tuple[int, ...]  # per mid call: catch-up + tree tokens forwarded
    small_steps: int
    decisions: int  # scheduler decisions taken

    def __post_init__(self) -> None:
        object.__setattr__(self, "mid_call_tokens", tuple(int(t) for t in self.mid_call_tokens))
        if self.verified_nodes < 1 or self.small_steps < 0 or self.decisions < 0:
            raise ValueError(f"invalid counts: {self}")
        if any(t < 0 for t in self.mid_call_tokens):
            raise ValueError(f"mid_call_tokens must be >= 0, got {self.mid_call_tokens}")


def counts_from_round(stats: RoundStats) -> RoundCounts:
    """Counts of a decoder round: one decision per step, +1 verified node for the root."""
    return RoundCounts(
        verified_nodes=stats.verified_size + 1,
        mid_call_tokens=tuple(s.mid_catch_up + s.mid_tree_tokens for s in stats.steps if s.used_mid),
        small_steps=sum(not s.used_mid for s in stats.steps),
        decisions=len(stats.steps),
    )


def price_round(profile: LatencyProfile, counts: RoundCounts) -> float:
    """Modelled ms of one round: verify + mid calls + small steps + decisions + tree overhead."""
    return (
        profile.verify_ms(counts.verified_nodes)
        + sum(profile.mid_ms(t) for t in counts.mid_call_tokens)
        + counts.small_steps * profile.ngram_step_ms
        + counts.decisions * profile.scheduler_ms
        + profile.tree_overhead_ms
    )


def price_ar(profile: LatencyProfile, n_tokens: int) -> float:
    """Modelled ms of n_tokens autoregressive target steps (prefill excluded, as for rounds)."""
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    return n_tokens * profile.ar_token_ms
