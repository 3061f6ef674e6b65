"""The headline's spread (collectors/evaluation/headline.py): points per pass, intervals over
resampled passes and prompts, GRAFT's hindsight re-chosen on every resample."""

from __future__ import annotations

import numpy as np
import pytest

from collectors.evaluation.headline import deployed_headline, graft_headline, spread
from collectors.evaluation.priced_eval import PricedCell, PricedMethod


def _cell(ms: dict[str, list[list[float]]]) -> PricedCell:
    """A cell whose methods have the given ms per pass (rows) and prompt (columns)."""
    methods = {}
    for name, per_pass in ms.items():
        a = np.asarray(per_pass, dtype=float)
        methods[name] = PricedMethod(name, "", a.mean(0), np.ones(a.shape[1]), 1.0, (), a)
    n = len(next(iter(ms.values()))[0])
    return PricedCell(np.full(n, 300.0), np.ones(n), methods, "")


def test_the_point_is_the_mean_over_passes_of_the_gain_over_the_better_endpoint():
    """Pass 0: All-Mid the better endpoint (gain 80/64 = 1.25); pass 1: All-Small (90/75 = 1.2)."""
    a = _cell({"all-small": [[100, 100], [90, 90]], "all-mid": [[80, 80], [100, 100]],
               "student": [[64, 64], [75, 75]], "adaptive:0.05:8": [[70, 70], [75, 75]]})  # fmt: skip
    b = _cell({"all-small": [[50, 150], [50, 150]], "all-mid": [[60, 160], [60, 160]],
               "student": [[50, 150], [50, 150]], "adaptive:0.05:8": [[50, 150], [50, 150]]})  # fmt: skip
    cells = {("p", "x"): a, ("p", "y"): b}
    got = deployed_headline(
        cells, {"p": "student"}, {"p": "adaptive:0.05:8"}, dict.fromkeys(cells, "fitting")
    )
    fitting = got["fitting"]
    assert fitting["n_cells"] == 2
    assert fitting["mean"][0] == pytest.approx(((1.25 + 1.0) / 2 + (1.2 + 1.0) / 2) / 2)
    assert fitting["worst"][0] == pytest.approx(1.0)
    assert fitting["vs_adaptive"][0] == pytest.approx(((70 / 64 + 1.0) / 2 + 1.0) / 2)
    low, high = fitting["mean"][1:]
    assert low <= fitting["mean"][0] <= high and high - low > 0.01  # the passes disagree: a spread


def test_a_cell_that_every_pass_and_prompt_agree_on_has_no_spread():
    cell = _cell(
        {"all-small": [[100, 200, 50]] * 2, "all-mid": [[120, 240, 60]] * 2, "student": [[80, 160, 40]] * 2}
    )
    got = deployed_headline({("p", "x"): cell}, {"p": "student"}, {}, {("p", "x"): "held-out task"})
    assert got["held-out task"]["mean"] == pytest.approx([1.25, 1.25, 1.25])
    assert "vs_adaptive" not in got["held-out task"]


def test_the_interval_comes_from_resampled_prompts():
    """One pass; the deployed method wins on half the prompts and loses on the others: the
    interval straddles the point, and the draws depend on the seed only."""
    rng = np.random.default_rng(3)
    base = rng.uniform(50, 150, 30)
    deployed = base * np.where(np.arange(30) % 2 == 0, 0.8, 1.15)
    ratio = (np.stack([base[None], 2 * base[None]]), deployed[None])
    point, low, high = spread([ratio], lambda a: a.mean(0), 2000, 0)
    assert point == pytest.approx(base.sum() / deployed.sum())
    assert low < point < high and spread([ratio], lambda a: a.mean(0), 2000, 0) == (point, low, high)


def test_graft_hindsight_is_rechosen_on_every_resample():
    """Two budgets, each best on half the prompts: on a resample the hindsight B is the better of
    the two on that resample (never worse than either on it), so GRAFT, at the better one's ms on
    every prompt, beats hindsight by at most 3x and at least 1x on any resample."""
    grid = [[10.0, 30.0, 10.0, 30.0], [30.0, 10.0, 30.0, 10.0]]
    cells = [{"hindsight_grid": grid, "rows": {"full": {"prompt_ms": [10.0, 10.0, 10.0, 10.0]}}}]
    point, low, high = graft_headline(cells)
    assert point == pytest.approx(80.0 / 40.0)
    assert low >= 1.0 and high <= 3.0
