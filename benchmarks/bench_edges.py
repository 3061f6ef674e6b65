"""Per-round overhead of TDES: DDTree by marginals vs DDTree with the edge scorer, side by side.

Usage (after collect_edges and fit_edges: artifacts/collect_edges/edge_rounds.parquet and
artifacts/fit_edges/scorers/<pair>/ exist):
    .venv/bin/python benchmarks/bench_edges.py [--budgets 16 32 63] [--repeats 5] [--rounds 100]
        [--out artifacts/bench/edges.json]

For every recorded round (up to --rounds per pair), the two ways of building its tree run
alternately, ``--repeats`` times each: ``marginal`` = build_ddtree on the marginals (what the
ddtree path does today), ``tdes`` = the scorer's per-round grid (EdgeScorer.for_round) plus
build_ddtree with those edge scores. The added overhead per round is the median over rounds of
(tdes - marginal), each the median of its repeats, in ms; the ratio is tdes / marginal. The verify
forward is not part of either, so this is the decision work GRAFT's 0.3 ms target is about.

``rule ms`` is full GRAFT's other per-round decision: the learned per-round budget
(decoder/graft/budget.py, rule_budget) on the round's TDES tree at cap = B, timed in the same
alternation with a fixed rule (its weights and cost curve do not change the work: the tree's first
B nodes are always scored), and ``graft ms`` = added + rule, the figure the target caps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import polars as pl
from tabulate import tabulate

from decoder.core.config import BlockBudgetRule
from decoder.graft.budget import rule_budget
from decoder.graft.ddtree import build_ddtree
from decoder.graft.edge_scorer import load_edge_scorer
from features.edge_schemas import EDGE_ROUNDS
from features.tables import read_table
from models.edge_cv import round_arrays


def bench_rule(budget: int) -> BlockBudgetRule:
    """A rule of cap ``budget``: a rising cost curve, weights of the fitted rules' signs."""
    return BlockBudgetRule((1.0, -1.0, 0.5, 0.5), 0.0, tuple(1.0 + 0.05 * b for b in range(budget + 1)), 0.5)


def time_round(row: dict, scorer, budget: int, repeats: int) -> tuple[float, float, float]:
    """(marginal ms, tdes ms, rule ms) medians of one round's ``repeats`` builds and decisions,
    alternating."""
    root, ids, logps, _ = round_arrays(row)
    rule, first_logp, k = bench_rule(budget), float(logps[0, 0]), ids.shape[0]
    plain, scored, ruled = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        build_ddtree(root, ids, logps, budget)
        t1 = time.perf_counter()
        tree = build_ddtree(root, ids, logps, budget, edge_scores=scorer.for_round(root, ids, logps))
        t2 = time.perf_counter()
        rule_budget(tree, first_logp, 2, k, rule)
        t3 = time.perf_counter()
        plain.append(t1 - t0)
        scored.append(t2 - t1)
        ruled.append(t3 - t2)
    return 1e3 * float(np.median(plain)), 1e3 * float(np.median(scored)), 1e3 * float(np.median(ruled))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds-file", default="artifacts/collect_edges/edge_rounds.parquet")
    parser.add_argument("--scorers", default="artifacts/fit_edges/scorers")
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 63])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--out", default="artifacts/bench/edges.json")
    args = parser.parse_args()
    rounds = pl.from_arrow(read_table(Path(args.rounds_file), EDGE_ROUNDS))
    result = {}
    head = ["pair", "B", "marginal ms", "tdes ms", "added ms", "ratio", "rule ms", "graft ms"]
    body = []
    for pair_id in sorted(set(rounds["pair_id"].to_list())):
        scorer, _ = load_edge_scorer(Path(args.scorers) / pair_id)
        rows = list(rounds.filter(pl.col("pair_id") == pair_id).head(args.rounds).iter_rows(named=True))
        for budget in args.budgets:
            times = np.array([time_round(r, scorer, budget, args.repeats) for r in rows])
            plain, scored, ruled = np.median(times, axis=0)
            added = float(np.median(times[:, 1] - times[:, 0]))
            graft = float(np.median(times[:, 1] - times[:, 0] + times[:, 2]))
            result[f"{pair_id}/B{budget}"] = {"marginal_ms": plain, "tdes_ms": scored, "added_ms": added,
                                              "ratio": scored / plain, "rule_ms": ruled, "graft_ms": graft,
                                              "n_rounds": len(rows)}  # fmt: skip
            body.append([pair_id, str(budget), f"{plain:.3f}", f"{scored:.3f}", f"{added:.3f}",
                         f"{scored / plain:.2f}", f"{ruled:.3f}", f"{graft:.3f}"])  # fmt: skip
    print(tabulate(body, head, tablefmt="github", disable_numparse=True))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
