"""A pair's cost model: a measured latency profile, and the price of a round from its counts.

The runtime prices rounds with it (the per-request switch-off, decoder/deploy/switch_off.py; a
bundle's runtime costs, decoder/deploy/runtime_costs.py); the offline side prices every replayed
round with the same functions, and combines and compares profiles in
collectors/pricing/profile_passes.py.

Contract:
- Collectors store what a round did (`RoundCounts`: verified nodes including the root, tokens per
  mid call and the tree nodes each call found already fed, small steps, scheduler decisions, live
  tree nodes before the prune). `price_round` turns counts into ms with a `LatencyProfile`, so the
  same counts can be re-priced with another profile (device, dtype, context length) without
  recollecting.
- Profiles come from collectors.pricing.profiling.measure_profile (kept apart: this module imports neither
  torch nor transformers, so any stage can re-price counts). A profile holds robust medians after
  warm-up on a fixed cached context of `context_len` tokens, and says what device, dtype, threads
  and clock (on a one-thread CPU the thread's CPU time: the cost without other processes' waits).
- Cost model of one round, each term priced as the decoder runs it online (`round_parts`):
    verify(verified nodes) + sum over mid calls of mid(new tokens, tree nodes already fed)
      (a round that verifies the root alone ran as one autoregressive step: the AR step instead of
      verify(1), `round_verify_ms`; on zoo-s verify(1) costs 0.69 ms, an AR step 0.48)
    + (mid end-of-round KV compaction, in rounds with a mid call)
    + small steps x n-gram step + decisions x decision (tree signals + features + MLP)
    + prompt blocks x prompt block: the blocks of the prompt's top-m rows the round's n-gram steps
      computed on first read (decoder/core/verify.py PromptRows; priced with the n-gram steps, whose
      clock they run in)
    + tree(live tree nodes): the per-round Python tree work outside drafting and verification
    + the round's cold-cache terms: a component that runs right after another model's forward
      finds its weights and code out of the CPU caches. The curves are timed warm (verify after an
      n-gram step, as in a round without a mid call; mid calls and decisions after their own kind);
      a round with a mid call forward adds `mid_cold_ms` (its first mid call follows the target's
      verify) and `verify_cold_points` at the tokens its last mid forward fed (its verify follows
      that call, and a larger call evicts more), a round with a decision adds `decision_cold_ms`
      (its first decision follows the verify).
- A 1-D cost is piecewise-linear through the measured (size, median ms) points. Past the largest
  size it extends the last segment, with the slope floored at 0 so timing noise never makes a bigger
  forward cheaper; below the smallest size it keeps that size's cost. The mid call's 2-D table is
  priced the same way along each axis (bilinear inside the grid, those clamping rules outside).
  A mid call that forwards 0 tokens costs 0 ms (MidDrafter.rescore skips the forward).
- A profile may combine several passes measured minutes apart (the median of each figure over the
  passes, collectors/pricing/profile_passes.py), so a slow spell of a shared machine that hits one
  pass is outvoted.
- Profiles are JSON with a schema_version (written by collectors/pricing/profile_passes.py
  `save_profile`); `load_profile` rejects another version and missing or unknown keys with a
  ValueError naming the file.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kept off import so re-pricing needs neither torch nor transformers
    from decoder.core.records import RoundStats

SCHEMA_VERSION = 7  # 3: passes; 4: cold-cache round terms, verify timed after an n-gram step;
# 5: the verify's cold term over the last mid call's tokens; 6: long_job_ms; 7: prompt_block_ms
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 96, 128)
DEFAULT_MID_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_MID_FED = (0, 16, 64, 256)
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


def interpolate_grid(
    rows: Sequence[int], cols: Sequence[int], grid: Sequence[Sequence[float]], row: float, col: float
) -> float:
    """Bilinear cost at (row, col) of grid[i][j] measured at (rows[i], cols[j]): `interpolate` along
    the columns within every row, then along the rows, so both axes clamp as the 1-D curve does."""
    per_row = [interpolate(tuple(zip(cols, values, strict=True)), col) for values in grid]
    return interpolate(tuple(zip(rows, per_row, strict=True)), row)


def _check_sizes(name: str, sizes: Sequence[int], minimum: int) -> None:
    if any(s < minimum for s in sizes) or list(sizes) != sorted(set(sizes)):
        raise ValueError(f"{name}: sizes must be >= {minimum} and strictly increasing, got {list(sizes)}")


def _check_times(name: str, values: Sequence[float]) -> None:
    if not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"{name}: times must be finite and >= 0, got {list(values)}")


def _clean_points(name: str, points: Sequence[Sequence[float]]) -> Points:
    out = tuple((int(s), float(ms)) for s, ms in points)
    _check_sizes(name, [s for s, _ in out], 1)
    _check_times(name, [ms for _, ms in out])
    return out


@dataclass(frozen=True)
class LatencyProfile:
    """Measured costs (ms) of one pair on one device; see the module docstring for the cost model."""

    pair: str
    device: str  # torch device string, e.g. "cuda:0"
    device_name: str  # CPU model or GPU name
    torch_threads: int
    clock: str  # "thread_cpu" (CPU time of the one torch thread) or "wall"
    torch_version: str
    dtype: str
    context_len: int  # cached tokens every timed forward ran on top of
    warmup: int  # discarded repeats
    repeats: int  # kept repeats (all passes); a pass's figure is the median of its per-repeat medians
    samples_per_repeat: int  # round-robin passes over all components within one repeat
    verify_points: Points  # target verification: tree nodes incl. the root -> ms
    mid_tokens: tuple[int, ...]  # mid table columns: tokens one call forwards (catch-up + new nodes)
    mid_fed: tuple[int, ...]  # mid table rows: tree nodes the call found already fed this round
    mid_grid_ms: tuple[tuple[float, ...], ...]  # [fed row][tokens column]; all empty without a mid
    mid_end_ms: float  # once per round with a mid call: the mid KV kept for the accepted path (0 w/o mid)
    ngram_step_ms: float  # one small (n-gram) step: fixed part
    ngram_node_ms: float  # one small step: per frontier node it expands (n-gram lookups + grafts)
    ngram_mean_frontier: float  # mean frontier of the profiled small steps (counts that lack it)
    decision_ms: float  # one online decision: tree signals + history/context features + 17-64-32-1 MLP
    ar_token_ms: float  # one autoregressive target step
    tree_points: Points  # per-round tree work (prune, bookkeeping): live tree nodes incl. root -> ms
    passes: int = 1  # separate measurements, pairs in turn, combined figure by figure (median_profile)
    # once per round, extra over the warm figures (cold caches; see the module docstring):
    verify_cold_points: Points = ()  # the verify after a mid forward: its tokens -> ms (() w/o mid)
    mid_cold_ms: float = 0.0  # the first mid call forward of a round
    decision_cold_ms: float = 0.0  # the first decision of a round
    long_job_ms: float = 0.0  # jobs this long ran one sample per repeat (0: every job all of them)
    prompt_block_ms: float = 0.0  # one block (ROW_BLOCK positions) of a prompt's top-m rows

    def __post_init__(self) -> None:
        if isinstance(self.passes, bool) or not isinstance(self.passes, int) or self.passes < 1:
            raise ValueError(f"passes must be an integer >= 1, got {self.passes!r}")
        object.__setattr__(self, "verify_points", _clean_points("verify_points", self.verify_points))
        object.__setattr__(self, "tree_points", _clean_points("tree_points", self.tree_points))
        object.__setattr__(
            self, "verify_cold_points", _clean_points("verify_cold_points", self.verify_cold_points)
        )
        object.__setattr__(self, "mid_tokens", tuple(int(n) for n in self.mid_tokens))
        object.__setattr__(self, "mid_fed", tuple(int(n) for n in self.mid_fed))
        grid = tuple(tuple(float(ms) for ms in row) for row in self.mid_grid_ms)
        object.__setattr__(self, "mid_grid_ms", grid)
        if not self.verify_points or not self.tree_points:
            raise ValueError("verify_points and tree_points must not be empty")
        _check_sizes("mid_tokens", self.mid_tokens, 1)
        _check_sizes("mid_fed", self.mid_fed, 0)
        if len(grid) != len(self.mid_fed) or any(len(row) != len(self.mid_tokens) for row in grid):
            raise ValueError(
                f"mid_grid_ms must be {len(self.mid_fed)} rows (mid_fed) x {len(self.mid_tokens)} "
                f"columns (mid_tokens), got {[len(row) for row in grid]}"
            )
        if bool(self.mid_tokens) != bool(self.mid_fed):
            raise ValueError("mid_tokens and mid_fed are both empty (no mid) or both given")
        _check_times("mid_grid_ms", list(itertools.chain.from_iterable(grid)))
        for name in (
            "ngram_step_ms",
            "ngram_node_ms",
            "ngram_mean_frontier",
            "decision_ms",
            "ar_token_ms",
            "mid_end_ms",
            "mid_cold_ms",
            "decision_cold_ms",
            "prompt_block_ms",
        ):
            _check_times(name, [getattr(self, name)])

    @property
    def has_mid(self) -> bool:
        return bool(self.mid_grid_ms)

    def verify_ms(self, n_nodes: int) -> float:
        """Target verification of a tree of n_nodes nodes, the root included."""
        if n_nodes < 1:
            raise ValueError(f"a verified tree has at least the root, got n_nodes={n_nodes}")
        return interpolate(self.verify_points, n_nodes)

    def round_verify_ms(self, n_nodes: int) -> float:
        """A round's target forward over n_nodes tree nodes, the root included, as the decoder runs
        it: a tree with no drafted node (n_nodes 1) runs as one autoregressive step (a DRAFTLESS
        round, decoder.core.decode), any other as one tree verify."""
        return self.ar_token_ms if n_nodes == 1 else self.verify_ms(n_nodes)

    def verify_cold_ms(self, counts: RoundCounts) -> float:
        """The verify's extra cost in a round whose last mid forward fed n tokens (0 without one)."""
        last = next((t for t in reversed(counts.mid_call_tokens) if t > 0), 0)
        return interpolate(self.verify_cold_points, last) if last and self.verify_cold_points else 0.0

    def mid_ms(self, n_tokens: int, n_fed: int = 0) -> float:
        """One mid-drafter call forwarding n_tokens on top of n_fed tree nodes fed earlier this round."""
        if not self.has_mid:
            raise ValueError(f"profile of pair {self.pair!r} has no mid-drafter timings (pair without mid)")
        if n_tokens < 0 or n_fed < 0:
            raise ValueError(f"n_tokens and n_fed must be >= 0, got {n_tokens}, {n_fed}")
        if n_tokens == 0:
            return 0.0
        return interpolate_grid(self.mid_fed, self.mid_tokens, self.mid_grid_ms, n_fed, n_tokens)

    def small_ms(self, n_steps: int, n_frontier: float | None = None) -> float:
        """n_steps small steps expanding n_frontier frontier nodes in all (None: the profiled mean)."""
        if n_frontier is None:
            n_frontier = n_steps * self.ngram_mean_frontier
        return n_steps * self.ngram_step_ms + n_frontier * self.ngram_node_ms

    def tree_ms(self, n_nodes: int) -> float:
        """Per-round tree work for a tree of n_nodes live nodes before the prune, the root included."""
        if n_nodes < 1:
            raise ValueError(f"a tree has at least the root, got n_nodes={n_nodes}")
        return interpolate(self.tree_points, n_nodes)


FIELDS = tuple(f.name for f in dataclasses.fields(LatencyProfile))


def load_profile(path: str | Path) -> LatencyProfile:
    """Read a profile; ValueError naming the file on bad JSON, another version, or wrong keys."""
    path = Path(path)
    return profile_from_bytes(path.read_bytes(), path)


def profile_from_bytes(raw: bytes, path: str | Path) -> LatencyProfile:
    """A profile from a file's bytes (read once by a caller that also hashes them); errors name
    ``path``, as load_profile's."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
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


def fed_before_calls(tree_tokens: Sequence[int]) -> tuple[int, ...]:
    """Tree nodes already fed before each mid call of a round: the sum of the earlier calls' new
    tree nodes (catch-up tokens are committed context, not tree nodes)."""
    return tuple(itertools.accumulate(tree_tokens[:-1], initial=0)) if tree_tokens else ()


@dataclass(frozen=True)
class RoundCounts:
    """What one round did, independent of any clock.

    mid_call_fed None: derived as `fed_before_calls(mid_call_tokens)`, exact when no call carries
    catch-up tokens (the rounds table); tree_nodes None: verified_nodes (a lower bound);
    small_frontier None: the profile's mean frontier per small step."""

    verified_nodes: int  # nodes the target verified, the root included
    mid_call_tokens: tuple[int, ...]  # per mid call: catch-up + tree tokens forwarded
    small_steps: int
    decisions: int  # scheduler decisions taken
    mid_call_fed: tuple[int, ...] | None = None  # per mid call: tree nodes fed by earlier calls
    tree_nodes: int | None = None  # live tree nodes before the prune, the root included
    small_frontier: int | None = None  # frontier nodes the small steps expanded, summed over them
    prompt_blocks: int = 0  # blocks of the prompt's top-m rows the round computed (first reads)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mid_call_tokens", tuple(int(t) for t in self.mid_call_tokens))
        fed = fed_before_calls(self.mid_call_tokens) if self.mid_call_fed is None else self.mid_call_fed
        object.__setattr__(self, "mid_call_fed", tuple(int(f) for f in fed))
        tree = self.verified_nodes if self.tree_nodes is None else int(self.tree_nodes)
        object.__setattr__(self, "tree_nodes", tree)
        if (
            self.verified_nodes < 1
            or self.small_steps < 0
            or self.decisions < 0
            or self.prompt_blocks < 0
            or tree < self.verified_nodes
        ):
            raise ValueError(f"invalid counts: {self}")
        if self.small_frontier is not None and self.small_frontier < 0:
            raise ValueError(f"small_frontier must be >= 0, got {self.small_frontier}")
        if any(t < 0 for t in self.mid_call_tokens) or any(f < 0 for f in self.mid_call_fed):
            raise ValueError(f"mid call counts must be >= 0: {self.mid_call_tokens}, {self.mid_call_fed}")
        if len(self.mid_call_fed) != len(self.mid_call_tokens):
            raise ValueError(f"one fed count per mid call: {self.mid_call_tokens} vs {self.mid_call_fed}")

    @property
    def mid_forwards(self) -> bool:
        """Whether a mid call of this round forwarded tokens (a call of 0 tokens runs no forward)."""
        return any(t > 0 for t in self.mid_call_tokens)


def counts_from_round(stats: RoundStats) -> RoundCounts:
    """Counts of a decoder round: the decisions its scheduler took (one per step unless it skipped
    the rest of a round without deciding), +1 node for the root (verified and tree)."""
    mids = [s for s in stats.steps if s.used_mid]
    return RoundCounts(
        verified_nodes=stats.verified_size + 1,
        mid_call_tokens=tuple(s.mid_catch_up + s.mid_tree_tokens for s in mids),
        small_steps=len(stats.steps) - len(mids),
        decisions=sum(s.decided for s in stats.steps),
        mid_call_fed=fed_before_calls([s.mid_tree_tokens for s in mids]),
        tree_nodes=stats.tree_size + 1,
        small_frontier=sum(s.frontier_size for s in stats.steps if not s.used_mid),
        prompt_blocks=stats.prompt_blocks,
    )


def round_parts(profile: LatencyProfile, counts: RoundCounts) -> dict[str, float]:
    """Modelled ms of one round, split the way the decoder's round clock (RoundStats.times) splits
    it: each cold-cache term with the component it slows; a round that verifies the root alone runs
    as an autoregressive step (`round_verify_ms`); MidDrafter.end_round and the n-gram
    score-row update run after the verify and count in "tree" (the profile's tree(n) job times the
    score-row update too)."""
    mid_calls = zip(counts.mid_call_tokens, counts.mid_call_fed, strict=True)
    cold_mid = counts.mid_forwards
    cold_decision = profile.decision_cold_ms if counts.decisions else 0.0
    return {
        "verify": profile.round_verify_ms(counts.verified_nodes) + profile.verify_cold_ms(counts),
        "mid": sum(profile.mid_ms(t, f) for t, f in mid_calls) + (profile.mid_cold_ms if cold_mid else 0.0),
        "ngram": profile.small_ms(counts.small_steps, counts.small_frontier)
        + counts.prompt_blocks * profile.prompt_block_ms,
        "scheduler": counts.decisions * profile.decision_ms + cold_decision,
        "tree": profile.tree_ms(counts.tree_nodes)  # type: ignore[arg-type]  # filled in __post_init__
        + (profile.mid_end_ms if counts.mid_call_tokens else 0.0),
    }


def price_round(profile: LatencyProfile, counts: RoundCounts) -> float:
    """Modelled ms of one round: the sum of its `round_parts`."""
    return sum(round_parts(profile, counts).values())


def price_ar(profile: LatencyProfile, n_tokens: int) -> float:
    """Modelled ms of n_tokens autoregressive target steps (prefill excluded, as for rounds)."""
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    return n_tokens * profile.ar_token_ms
