"""The headline's spread: each figure under every profile pass and over resampled prompts.

A priced figure moves between runs for two reasons the run can measure: the profile (a pass taken in
a slow spell prices everything differently) and the prompts (another 20 would weigh the datasets'
hard cases differently). Every cell is priced under each pass of the profile stage at no extra
replay (collectors/evaluation/priced_eval.py ``pass_ms``), so a headline figure is computed per pass
on the cells' own prompts (its point: the mean over the passes) and over a percentile bootstrap
whose every resample draws one pass and, per cell, the cell's prompts with replacement (its 95%
interval). The resamples depend only on the seed, the number of resamples and the cells' sizes.

Figures (per group of cells: fitting, held-out pair, ...):
- ``mean``: the mean over cells of the deployed row's gain over the better endpoint, the gain of a
  cell being min(All-Small's ms, All-Mid's ms) / the deployed method's ms over its prompts (AR
  cancels: every method emits the same tokens);
- ``worst``: the lowest cell's gain;
- ``vs_adaptive``: the mean over cells of the deployed method over the adaptive rule's chosen variant.
For GRAFT (evaluate_graft's cells, each row's per-prompt ms stored): ``graft_vs_hindsight``, the mean
over cells of DDTree at its best B in hindsight (re-chosen on each resample, as hindsight would) over
full GRAFT.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from collectors.evaluation.priced_eval import ENDPOINTS, Cell, PricedCell

N_BOOT = 2000
SEED = 0
Interval = tuple[float, float, float]  # (point, low, high)


def _pass_ms(cell: PricedCell, method: str) -> np.ndarray:
    """(n_passes, n_prompts): a method's ms under every pass (the stage's profile alone if none)."""
    m = cell.methods[method]
    return m.pass_ms if m.pass_ms is not None else m.ms[None, :]


# A cell's ratio: min over its K candidates of sum(candidate ms) / sum(denominator ms) over prompts;
# candidates [K, n_passes, n_prompts], denominator [n_passes, n_prompts]
Ratio = tuple[np.ndarray, np.ndarray]


def spread(
    ratios: Sequence[Ratio], reduce: Callable[[np.ndarray], np.ndarray], n_boot: int, seed: int
) -> Interval:
    """``reduce`` over the cells (axis 0) of their ratios: its mean over the passes on all prompts,
    and its 95% percentile interval over resamples that draw one pass and each cell's prompts with
    replacement (module docstring)."""
    n_passes = min(den.shape[0] for _, den in ratios)
    per_pass = [
        float(reduce(np.asarray([cand[:, p].sum(1).min() / den[p].sum() for cand, den in ratios])))
        for p in range(n_passes)
    ]
    rng = np.random.default_rng(seed)
    passes = rng.integers(0, n_passes, n_boot)
    boot = []
    for cand, den in ratios:
        n = den.shape[1]
        idx = rng.integers(0, n, (n_boot, n))
        top = np.take_along_axis(cand[:, passes], idx[None], axis=2).sum(2).min(0)  # [n_boot]
        boot.append(top / np.take_along_axis(den[passes], idx, axis=1).sum(1))
    low, high = np.percentile(reduce(np.stack(boot)), [2.5, 97.5])
    return float(np.mean(per_pass)), float(low), float(high)


def _mean(a: np.ndarray) -> np.ndarray:
    return a.mean(0)


def _worst(a: np.ndarray) -> np.ndarray:
    return a.min(0)


def deployed_headline(
    cells: Mapping[Cell, PricedCell],
    deploys: Mapping[str, str],
    adaptive: Mapping[str, str],
    groups: Mapping[Cell, str],
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> dict[str, dict[str, object]]:
    """Per group of cells: the deployed row's ``mean`` and ``worst`` gain over the better endpoint
    and its mean gain over the adaptive rule (``vs_adaptive``, where priced), each [point, low,
    high], with ``n_cells``. ``deploys`` and ``adaptive``: per pair, the method its bundle deploys
    and the adaptive variant it chose."""
    out: dict[str, dict[str, object]] = {}
    for group in dict.fromkeys(groups[c] for c in cells):
        members = [c for c in cells if groups[c] == group]
        gains, over_adaptive = [], []
        for cell in members:
            priced, pair = cells[cell], cell[0]
            deployed = _pass_ms(priced, deploys[pair])
            gains.append((np.stack([_pass_ms(priced, e) for e in ENDPOINTS]), deployed))
            if adaptive.get(pair) in priced.methods:
                over_adaptive.append((_pass_ms(priced, adaptive[pair])[None], deployed))
        entry: dict[str, object] = {
            "mean": list(spread(gains, _mean, n_boot, seed)),
            "worst": list(spread(gains, _worst, n_boot, seed)),
            "n_cells": len(members),
        }
        if over_adaptive:
            entry["vs_adaptive"] = list(spread(over_adaptive, _mean, n_boot, seed))
        out[group] = entry
    return out


def graft_headline(cells: Sequence[Mapping], n_boot: int = N_BOOT, seed: int = SEED) -> Interval:
    """Full GRAFT against DDTree at its best B in hindsight, the mean over evaluate_graft's cells
    (their ``hindsight_grid`` and full GRAFT's ``prompt_ms``): the hindsight B re-chosen on every
    resample of a cell's prompts, as hindsight would. One profile: no pass is drawn."""
    ratios = [
        (np.asarray(c["hindsight_grid"], dtype=float)[:, None, :],
         np.asarray(c["rows"]["full"]["prompt_ms"], dtype=float)[None, :])
        for c in cells
    ]  # fmt: skip
    return spread(ratios, _mean, n_boot, seed)
