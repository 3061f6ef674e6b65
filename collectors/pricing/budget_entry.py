"""A pair's budgets.json entry, chosen from its policy sweeps (collectors/pricing/budget_sweep.py).

Contract: for one tree shape, :func:`choose` gives

    B* = argmax over B of max over policies of the priced speedup at B   (ties: the smaller B),

SABA's budget (GRAFT's rule: c_fixed / c_verify of each policy's cost line; the policy whose SABA
budget prices faster), each policy's best B and curve, and ``decode_policy``: the winning policy,
or ``ar`` where no budget of any policy prices faster than AR. With gain scales it also tries the
per-round rule (:func:`best_round_rule`: caps each policy's best B and the largest, every scale),
which replaces the fixed B* only where it prices at least ``min_gain`` faster; the entry then holds
``round_budget``. :func:`measure_shapes` sweeps every tree shape of the stage and keeps the
best-priced shape's entry (ties: the shape whose policies' best speedups sum highest), each
shape's own pick recorded under ``shapes``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from collectors.pricing.budget_plan import shape_key
from collectors.pricing.budget_sweep import PolicySweep, RoundRule, round_rules, sweep_pair
from config.params import BudgetParams
from decoder.core.config import TreeConfig
from decoder.core.policies import AR
from decoder.deploy.latency import LatencyProfile
from decoder.models.pair import ModelPair

log = logging.getLogger(__name__)


def best_round_rule(
    sweeps: dict[str, PolicySweep], profile: LatencyProfile, scales: tuple[float, ...]
) -> tuple[str, RoundRule, float] | None:
    """(policy, rule, priced speedup) of the best per-round budget rule over every policy, with
    caps its own best B and the largest; None without gain scales."""
    if not scales:
        return None
    best = None
    for name, sw in sweeps.items():
        for rule in round_rules(profile, sw, sorted({sw.best(), sw.budgets[-1]}), scales):
            speed = sw.round_rule_speedup(profile, rule)
            if best is None or speed > best[2]:
                best = (name, rule, speed)
    return best


def choose(
    sweeps: dict[str, PolicySweep],
    profile: LatencyProfile,
    n_prompts: int,
    scales: tuple[float, ...] = (),
    min_gain: float = 0.02,
) -> dict:
    """The pair's entry of budgets.json: B*, SABA's pick, each policy's curve, and the per-round
    rule where one prices at least ``min_gain`` faster than the fixed B* (then the entry's
    ``budget`` is the rule's cap and ``policy`` the rule's)."""
    budgets = next(iter(sweeps.values())).budgets
    best_at = {b: max(sweeps, key=lambda name: sweeps[name].speedup(b)) for b in budgets}
    chosen = max(budgets, key=lambda b: (sweeps[best_at[b]].speedup(b), -b))
    policies, saba = {}, {}
    for name, sw in sweeps.items():
        b_saba, c_verify, c_fixed = sw.saba(profile)
        saba[name] = b_saba
        best = sw.best()
        policies[name] = {
            "best_budget": best,
            "best_speedup": sw.speedup(best),
            "saba_budget": b_saba,
            "saba_c_verify_ms": c_verify,
            "saba_c_fixed_ms": c_fixed,
            "speedup": [sw.speedup(b) for b in budgets],
            "accepted": list(sw.accepted),
        }
    saba_policy = max(sweeps, key=lambda name: sweeps[name].speedup(saba[name]))
    best_speedup = sweeps[best_at[chosen]].speedup(chosen)
    policy, fixed_speedup = best_at[chosen], best_speedup
    round_budget, tried = None, best_round_rule(sweeps, profile, scales)
    if tried is not None and tried[2] >= (1.0 + min_gain) * best_speedup:
        policy, rule, best_speedup = tried
        chosen, round_budget = rule.cap, rule.fields()
    return {
        "mode": "measured",
        "budget": chosen,
        "policy": policy,
        # what the pair decodes with by default: AR where no budget of either policy prices faster
        "decode_policy": policy if best_speedup >= 1.0 else AR,
        "speedup_at_budget": best_speedup,
        "round_budget": round_budget,  # null: every round verifies `budget` nodes
        "speedup_fixed_budget": fixed_speedup,  # the best fixed B (every round the same)
        "round_rule_tried": None
        if tried is None
        else {
            "policy": tried[0],
            "cap": tried[1].cap,
            "fixed_ms": tried[1].fixed_ms,
            "gain_scale": tried[1].gain_scale,
            "speedup": tried[2],
        },
        "speedup_at_max": max(sw.speedup(budgets[-1]) for sw in sweeps.values()),
        "saba_budget": saba[saba_policy],
        "saba_policy": saba_policy,
        "speedup_at_saba": sweeps[saba_policy].speedup(saba[saba_policy]),
        "n_prompts": n_prompts,
        "policies": policies,
    }


def best_shape(picks: dict[tuple[int, int, int], dict]) -> dict:
    """The entry of the best-priced shape among ``picks`` ((width, topk, ngram_min_n) -> that
    shape's :func:`choose` entry), with every shape's pick under ``shapes`` ("WxM" -> budget,
    policy, speedup, each policy's best B and speedup)."""
    # ties (All-Small's n-gram tree hardly depends on W and m): the shape where the policies do best
    # together, so a scheduler mixing in the mid drafter at this shape finds it cheapest
    entry = max(
        picks.values(),
        key=lambda e: (e["speedup_at_budget"], sum(p["best_speedup"] for p in e["policies"].values())),
    )
    entry["shapes"] = {
        shape_key(w, m, n): {
            **{k: e[k] for k in ("budget", "policy", "speedup_at_budget")},
            "best": {n: [p["best_budget"], p["best_speedup"]] for n, p in e["policies"].items()},
        }
        for (w, m, n), e in picks.items()
    }
    return entry


def measure_shapes(
    pair_id: str,
    pair: ModelPair,
    profile: LatencyProfile,
    prompts: list[list[int]],
    tree: TreeConfig,
    shapes: Sequence[tuple[int, int, int]],
    cfg: BudgetParams,
    batch_rows: int = 0,
) -> dict:
    """The pair's entry: B* and its policy under the best-priced tree shape of ``shapes`` (width,
    topk, ngram_min_n; ``tree`` gives the rest of the tree), each shape swept on ``prompts``
    (``batch_rows``: the replay's, collectors.collect.replay.Replayer)."""
    picks = {}
    for width, topk, min_n in shapes:
        shaped = dataclasses.replace(tree, width=width, topk=topk, ngram_min_n=min_n)
        sweeps = sweep_pair(
            pair, profile, prompts, shaped, cfg.max_new_tokens, schedules=cfg.schedules, batch_rows=batch_rows
        )
        pick = choose(sweeps, profile, len(prompts), cfg.round_gain_scales, cfg.round_min_gain)
        picks[width, topk, min_n] = {**pick, "width": width, "topk": topk, "ngram_min_n": min_n}
        log.info("%s, W = %d, m = %d, n-gram n >= %d: B* = %d (%s, %.2fx)", pair_id, width, topk, min_n,
                 pick["budget"], pick["policy"], pick["speedup_at_budget"])  # fmt: skip
    entry = best_shape(picks)
    log.info("%s: B* = %d, W = %d, m = %d (%s, %.2fx; %.2fx at B = %d; SABA B = %d, %.2fx)", pair_id,
             entry["budget"], entry["width"], entry["topk"], entry["policy"], entry["speedup_at_budget"],
             entry["speedup_at_max"], tree.budget, entry["saba_budget"],
             entry["speedup_at_saba"])  # fmt: skip
    return entry
