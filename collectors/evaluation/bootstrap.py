"""Paired percentile bootstraps over prompts, the one interval every speedup table reports.

Contract: ``paired_interval`` resamples prompts with replacement, every sample array (AR's and a
method's figures, priced or measured) on the same draws; the draws depend only on the seed, the
resample count and the prompt count, so the methods of one table share them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import stats


def paired_interval(
    samples: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], n_boot: int, seed: int
) -> tuple[float, float, float]:
    """(point, low, high): ``statistic`` of the prompts and its 95% percentile bootstrap, prompts
    resampled together across ``samples`` (scipy.stats.bootstrap, paired, vectorized: ``statistic``
    takes an ``axis``). With one prompt (or no resamples) the interval is the point. The same seed,
    resample count and prompt count give the same resamples, whatever the statistic."""
    point = float(statistic(*samples))
    if len(samples[0]) < 2 or n_boot < 1:
        return point, point, point
    res = stats.bootstrap(
        samples,
        statistic,
        n_resamples=n_boot,
        vectorized=True,
        paired=True,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


def ratio_of_sums(ar_ms: np.ndarray, ms: np.ndarray, axis: int = -1) -> np.ndarray:
    """sum(ar_ms) / sum(ms) along ``axis``: a speedup over prompts."""
    return ar_ms.sum(axis=axis) / ms.sum(axis=axis)
