"""GRAFT's budget choice for one pair, made on the collect prompts before a held-back prompt is read.

Contract: :func:`choose_budgets` walks the collect prompts of the fitting datasets
(collectors/graft/budget.py, walk_choice_groups) and, by marginals ("plain") and by TDES ("tdes"),
picks the learned fixed B (learned_budget) and fits the per-round rule (models/budget_rule.py,
fit_budget_rule); with >= 2 datasets the two are compared out of fold by dataset
(cross_fitted_speedups) and ``use_rule`` says the rule priced faster, else they are compared in
sample. Per task, each fitting dataset gets its best arm among every fixed B with or without TDES
and the two rules (per_task_choice), used where leaving each prompt out prices it faster than
choosing once for all tasks. Returns a JSON summary of all of it (``seconds`` aside, a function of
the pair, the collect prompts and the costs), the two rules, and each task's arm.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence

from collectors.graft.budget import (
    Arm,
    ChoiceWalks,
    learned_budget,
    per_task_choice,
    round_price,
    walk_choice_groups,
)
from collectors.graft.costs import GraftCosts
from config.params import Params
from decoder.core.config import BlockBudgetRule
from decoder.graft.block import BlockProposer
from decoder.graft.edge_scorer import EdgeScorer
from decoder.models.pair import ModelPair
from models.budget_rule import cross_fitted_speedups, fit_budget_rule

log = logging.getLogger(__name__)


def fit_learned_budgets(
    groups: Sequence[Sequence[ChoiceWalks]],
    costs: GraftCosts,
    fixed_budget: int,
    b_max: int,
    caps: Sequence[int],
    l2: float,
) -> tuple[dict, dict[str, BlockBudgetRule]]:
    """(summary, rules), each keyed "plain" and "tdes": the learned fixed B and its collect speedup
    (also at ``fixed_budget``, the stage's fixed B), the per-round rule, and whether the rule prices
    faster (out of fold by group where there are >= 2 groups)."""
    out, rules = {}, {}
    for name, tdes in (("plain", False), ("tdes", True)):
        price = functools.partial(round_price, costs, tdes, False)
        split = [[w.tdes if tdes else w.plain for w in g] for g in groups]
        got = [w for g in split for w in g]
        budget, curve = learned_budget(got, price, costs.ar_token_ms, b_max)
        rules[name], rule_summary = fit_budget_rule(got, budget, curve[budget - 1], costs, tdes, caps, l2)
        oof = (curve[budget - 1], rule_summary["collect_speedup"])
        if len(groups) >= 2:  # out of fold by dataset: the fair comparison of the two
            oof = cross_fitted_speedups(split, costs, tdes, caps, l2, b_max)
        out[name] = {"budget": budget, "collect_speedup": curve[budget - 1],
                     "collect_speedup_at_fixed_budget": curve[fixed_budget - 1], "rule": rule_summary,
                     "oof_speedup_fixed": oof[0], "oof_speedup_rule": oof[1],
                     "use_rule": oof[1] > oof[0]}  # fmt: skip
    return out, rules


def choose_budgets(
    params: Params,
    pair: ModelPair,
    pair_id: str,
    drafter: BlockProposer,
    scorer: EdgeScorer,
    costs: GraftCosts,
    collected: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> tuple[dict, dict[str, BlockBudgetRule], dict[str, Arm]]:
    """B_learned and the per-round rule, by marginals ("plain") and by TDES ("tdes"), from the
    collect prompts only (module docstring): (summary, rules, each fitting task's own arm, for full
    GRAFT where the summary's ``per_task.use`` says so). ``collected``: the collect stage's
    continuations, which give the prompts' outputs where they hold them all."""
    cfg = params.graft_eval
    t0 = time.perf_counter()
    walked = walk_choice_groups(params, pair, pair_id, drafter, scorer, collected)
    out, rules = fit_learned_budgets(
        walked.groups, costs, params.edges.budget, cfg.budget_max, cfg.rule_caps, cfg.rule_l2
    )
    out["per_task"], task_arms = per_task_choice(
        walked.by_task, costs, (rules["plain"], rules["tdes"]), cfg.budget_max
    )
    out["prompts"] = sum(map(len, walked.groups))
    out["datasets_from_collected_continuations"] = walked.reused  # of collect, not a batched decode
    out["questions"] = {s.dataset_id: [s.prompt_start, s.prompt_stop] for s in walked.specs}
    out["seconds"] = time.perf_counter() - t0
    log.info("%s: learned budgets %s", pair_id, out)
    return out, rules, task_arms
