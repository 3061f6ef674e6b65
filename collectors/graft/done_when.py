"""The done-when targets of GRAFT's evaluation, checked on its cells.

Contract: :func:`done_when_checks` reads the evaluate_graft stage's cells (collectors/graft/cells.py,
evaluate_cell) and its pairs' summaries and returns, per target, the share of cells where a row's
priced speedup (or A) reaches another's, the mean priced and wall-clock speedup of every row, the
mean priced over wall-clock speedup (1.0: pricing matches the clock), and the largest per-round
overhead of any pair at its fixed B, SABA's B or the per-round rule's cap. Needs >= 1 cell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from collectors.graft.table import ROWS


def done_when_checks(cells: Sequence[dict], pairs: Mapping[str, dict]) -> dict:
    """The done-when targets on these cells (module docstring); ``pairs``: each pair's summary,
    with its overheads."""
    n = len(cells)

    def share(pred) -> float:  # of the cells
        return sum(bool(pred(c)) for c in cells) / n

    def at_least(a: str, b: str, key: str = "speedup") -> float:  # share of cells where row a >= row b
        return share(lambda c: c["rows"][a][key] >= c["rows"][b][key])

    mean = {k: sum(c["rows"][k]["speedup"] for c in cells) / n for k, _ in ROWS}
    return {
        "n_cells": n,
        "graft_at_least_hindsight": at_least("graft", "hindsight"),
        "full_graft_at_least_hindsight": at_least("full", "hindsight"),
        "graft_learned_fixed_at_least_hindsight": at_least("graft_learned", "hindsight"),
        "graft_rule_at_least_hindsight": at_least("graft_rule", "hindsight"),
        "rule_at_least_learned_fixed": at_least("rule", "learned"),
        "learned_at_least_saba_on_mean": mean["learned"] >= mean["saba"],
        "rule_at_least_saba_on_mean": mean["rule"] >= mean["saba"],
        "full_graft_at_least_saba_graft_on_mean": mean["full"] >= mean["graft"],
        "tdes_raises_a": share(
            lambda c: c["rows"]["tdes"]["mean_accepted"] > c["rows"]["ddtree"]["mean_accepted"]
        ),
        "tdes_keeps_or_raises_a": at_least("tdes", "ddtree", "mean_accepted"),
        "tdes_raises_a_at_learned_budget": share(
            lambda c: (
                c["rows"]["graft_learned"]["mean_accepted"]
                > c["ddtree_at_tdes_learned_budget"]["mean_accepted"]
            )
        ),
        "mean_speedup": mean,
        "mean_wall_speedup": {k: sum(c["wall"][k] for c in cells) / n for k in cells[0]["wall"]},
        "priced_over_wall": {
            k: sum(c["rows"][k]["speedup"] / c["wall"][k] for c in cells) / n for k in cells[0]["wall"]
        },
        "max_overhead_ms": max(
            max(p["overhead_ms_at_budget"], p["overhead_ms_at_graft_budget"], p["overhead_ms_at_rule_cap"])
            for p in pairs.values()
        ),
    }
