"""What the budget stage sweeps: its pairs, each pair's prompt slices, and the tree shapes.

Contract: :func:`budget_pairs` is collect.pairs, then the evaluate pairs collect lacks, then
budget.extra_pairs, in order.
:func:`budget_specs` deals ``budget.prompts_per_pair`` prompts over ``budget.datasets`` in turn
(prompt i is question collect.prompt_start + i // n of dataset i mod n; the stage refuses a slice
reaching evaluate.prompt_start). :func:`tree_shapes` is ``budget.shapes`` as (width, topk,
ngram_min_n), the tree section's own shape when empty; :func:`shape_key` names a shape in a
budgets.json entry.
"""

from __future__ import annotations

from collectors.collect.report import ReportSpec
from config.params import Params


def budget_pairs(params: Params) -> list[str]:
    """collect.pairs, then the evaluate pairs collect lacks, then budget.extra_pairs, in order."""
    return list(dict.fromkeys((*params.collect.pairs, *params.evaluate.pairs, *params.budget.extra_pairs)))


def budget_specs(params: Params, pair_id: str) -> list[ReportSpec]:
    """The prompt slices of one pair: dataset i mod n gets the i-th of budget.prompts_per_pair."""
    cfg, start = params.budget, params.collect.prompt_start
    n = len(cfg.datasets)
    counts = [len(range(d, cfg.prompts_per_pair, n)) for d in range(n)]
    return [
        ReportSpec(pair_id, ds, start, start + k) for ds, k in zip(cfg.datasets, counts, strict=True) if k
    ]


def tree_shapes(params: Params) -> list[tuple[int, int, int]]:
    """The (width, topk, ngram_min_n) shapes swept: budget.shapes (ngram_min_n the tree section's
    where an entry has two numbers), or the tree section's own shape when empty."""
    tree = params.tree
    return [
        (int(s[0]), int(s[1]), int(s[2]) if len(s) == 3 else tree.ngram_min_n) for s in params.budget.shapes
    ] or [(tree.width, tree.topk, tree.ngram_min_n)]


def shape_key(width: int, topk: int, min_n: int) -> str:
    """A shape's key in the entry's ``shapes``: "WxM", with "/nN" where ngram_min_n is N > 1."""
    return f"{width}x{topk}" + (f"/n{min_n}" if min_n > 1 else "")
