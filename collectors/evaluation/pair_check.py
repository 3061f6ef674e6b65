"""The pair check: what a pair deploys, chosen on its calibration prompts by paired comparisons.

Contract: the options come in a stated order of preference (the deploy stage's: the student at its
exported threshold, its other thresholds by distance from it, then All-Small and All-Mid). The
first is kept unless another *wins by more than its interval*: for each option X, its speedup over
the preferred option is the ratio of sums of their priced ms over every calibration prompt of the
pair (its cells pooled, each prompt once), with a 95% percentile bootstrap over those prompts (the
same resamples for every option, collectors/evaluation/bootstrap.py); X wins when the interval's low
end is above 1. Among the winners the one whose low end is highest is chosen (the earlier one on a
tie). So a near-tie on the calibration prompts, or a re-measured profile that moves two options by
a hair, keeps what the student was fit for; only a difference the prompts agree on changes it.

The record (:func:`pair_check`) names the choice, the preferred option, every option's pooled
speedup over AR and its paired speedup over the preferred one with the interval, and the chosen
option's margin (its paired speedup and interval over the preferred option; 1 when it is the
preferred one). The same rule chooses the adaptive rule's thresholds among its variants
(decoder/core/adaptive.py), preferring its defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collectors.evaluation.bootstrap import paired_interval, ratio_of_sums
from collectors.evaluation.priced_eval import PricedCell, pooled_speedups

N_BOOT = 2000
SEED = 0


def pooled_ms(cells: Sequence[PricedCell], method: str) -> np.ndarray:
    """A method's priced ms per prompt, over the cells' prompts in order."""
    return np.concatenate([c.methods[method].ms for c in cells])


def against(cells: Sequence[PricedCell], preferred: str, option: str) -> tuple[float, float, float]:
    """(point, low, high): ``option``'s paired speedup over ``preferred`` on the cells' prompts."""
    samples = (pooled_ms(cells, preferred), pooled_ms(cells, option))
    return paired_interval(samples, ratio_of_sums, N_BOOT, SEED)


Paired = dict[str, tuple[float, float, float]]


def choose(cells: Sequence[PricedCell], options: Sequence[str]) -> tuple[str, Paired]:
    """(the chosen option, each option's paired speedup over the first with its interval)."""
    if not cells:
        raise ValueError("pair_check: no calibration cells")
    if not options:
        raise ValueError("pair_check: no options to check")
    preferred = options[0]
    paired = {o: (1.0, 1.0, 1.0) if o == preferred else against(cells, preferred, o) for o in options}
    winners = [o for o in options[1:] if paired[o][1] > 1.0]
    chosen = max(winners, key=lambda o: paired[o][1], default=preferred)  # max keeps the first of equals
    return chosen, paired


def pair_check(cells: Sequence[PricedCell], options: Sequence[str]) -> dict:
    """What a pair deploys among ``options`` (preferred first): {"deploys", "preferred", "prompts",
    "speedup" (over AR, pooled), "paired" (over the preferred option: [point, low, high]),
    "margin" (the chosen option's paired entry)}."""
    chosen, paired = choose(cells, options)
    return {
        "deploys": chosen,
        "preferred": options[0],
        "prompts": int(sum(len(c.tokens) for c in cells)),
        "speedup": pooled_speedups(cells, options),
        "paired": {o: list(v) for o, v in paired.items()},
        "margin": list(paired[chosen]),
    }
