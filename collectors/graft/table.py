"""GRAFT's evaluation table: a row's priced speedup, A, mismatch rate and tree size over a cell's prompts.

A row of a cell is the rounds of each of its prompts (collectors/graft/walk.py, Round) with the
price each round costs (collectors/graft/costs.py). Speedup = AR's priced ms for the cell's tokens
over the rounds' priced ms; A = mean accepted drafted tokens per round; mismatch = mismatched /
target-carrying nodes at depth >= 2; size = mean drafted nodes verified per round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from tabulate import tabulate

from collectors.graft.walk import Round

ROWS = (
    ("ddtree", "DDTree, fixed B"),
    ("hindsight", "DDTree, best fixed B in hindsight"),
    ("tdes", "DDTree + TDES, fixed B"),
    ("saba", "DDTree + SABA"),
    ("graft", "DDTree + TDES + SABA (GRAFT)"),
    ("learned", "DDTree + learned B"),
    ("graft_learned", "DDTree + TDES + learned B"),
    ("rule", "DDTree + learned per-round B"),
    ("graft_rule", "DDTree + TDES + learned per-round B"),
    ("full", "full GRAFT: the learned budget, TDES on or off, chosen on collect prompts"),
)


@dataclass(frozen=True)
class RowStats:
    budget: int
    speedup: float
    mean_accepted: float
    mismatch_rate: float
    tree_size: float
    rounds: int
    tokens: int
    prompt_ms: tuple[float, ...] = ()  # each prompt's priced ms (the headline's bootstrap resamples them)

    def to_json(self) -> dict:
        return {**asdict(self), "prompt_ms": list(self.prompt_ms)}


def row_stats(
    budget: int, prompts: Sequence[Sequence[Round]], price: Callable[[Round], float], ar_token_ms: float
) -> RowStats:
    """One row of one cell over its prompts' rounds."""
    rounds = [r for p in prompts for r in p]
    if not rounds:
        raise ValueError("a table row needs at least one round")
    priced = [[price(r) for r in p] for p in prompts]
    tokens = sum(r.emitted for r in rounds)
    carrying = sum(r.target_nodes for r in rounds)
    return RowStats(
        budget=budget,
        speedup=tokens * ar_token_ms / sum(ms for p in priced for ms in p),
        mean_accepted=sum(r.accepted for r in rounds) / len(rounds),
        mismatch_rate=sum(r.mismatched for r in rounds) / carrying if carrying else 0.0,
        tree_size=sum(r.nodes for r in rounds) / len(rounds),
        rounds=len(rounds),
        tokens=tokens,
        prompt_ms=tuple(sum(p) for p in priced),
    )


def markdown(cells: Sequence[dict]) -> str:
    """One line per cell: each row as `speedup (A, mismatch, size @ B)`."""
    head = ["pair", "dataset", "group", *(label for _, label in ROWS)]
    body = [
        [c["pair_id"], c["dataset_id"], c["group"], *(_row_cell(c["rows"][key]) for key, _ in ROWS)]
        for c in cells
    ]
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True) + "\n"


def _row_cell(r: dict) -> str:
    return (
        f"{r['speedup']:.2f}x (A {r['mean_accepted']:.2f}, mm {r['mismatch_rate']:.2f}, "
        f"n {r['tree_size']:.1f} @ B={r['budget']})"
    )


def markdown_wall(cells: Sequence[dict]) -> str:
    """One line per cell: each decoded row's wall-clock speedup over AR and, last, the priced over
    the wall-clock speedup of full GRAFT (1.00 = pricing matches the clock)."""
    keys = [(k, label) for k, label in ROWS if k in cells[0]["wall"]]
    head = ["pair", "dataset", *(f"{label}, wall" for _, label in keys), "full GRAFT priced / wall"]
    body = [
        [
            c["pair_id"],
            c["dataset_id"],
            *(f"{c['wall'][k]:.2f}x" for k, _ in keys),
            f"{c['rows']['full']['speedup'] / c['wall']['full']:.2f}",
        ]
        for c in cells
    ]
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True) + "\n"
