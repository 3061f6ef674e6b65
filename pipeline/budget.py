"""DVC stage ``budget``: each pair's verification budget, chosen from its measured cost curves.

For every pair of collect.pairs and evaluate.pairs, on prompts of the collect slice (question
collect.prompt_start + i // n of dataset i mod n of budget.datasets, i < budget.prompts_per_pair;
never reaching evaluate.prompt_start, so the evaluate prompts stay held back), replay sweeps every
budget B in 1..tree.budget for All-Small and All-Mid (collectors/pricing/budget_sweep.py: exact at
temperature 0, priced with the pair's latency profile against AR). The pair's budget is

    B* = argmax over B of max(priced speedup of All-Small(B), All-Mid(B))   (ties: the smaller B),

the max also over ``budget.schedules``, mixed fixed schedules such as 10101, where given.

With ``budget.shapes`` (a list of [width, topk]) the sweep runs once per tree shape and the
best-priced shape's B* wins (ties: the shape whose policies' best speedups sum highest; a CPU wants
narrow trees: a mid call costs what it forwards); the
entry records ``width`` and ``topk`` (collectors/collect/plan.py `pair_tree` decodes with them) and each
shape's own pick. The entry's ``decode_policy`` is what the pair decodes with by default: that
policy at B*, or ``ar`` where no budget of either policy prices faster than AR (on a CPU, a mid
drafter costing most of a target forward, say). Also recorded: each policy's best B and its
curve, and SABA's budget (GRAFT's rule: c_fixed / c_verify of each policy's cost line; the policy
whose SABA budget prices faster).

The per-round rule (``budget.round_gain_scales``; decoder/core/budget.py `verify_budget`): each round
verifies the B_t <= cap that maximises (1 + s x E[A](B)) / (fixed + verify(B + 1)), E[A] from the
round's own path scores, so a round whose drafts are unlikely to be accepted can fall back to one
plain target step. Candidates: caps each policy's best B and tree.budget, s the least-squares
calibration of E[A] to the accepted lengths of the sweep's rounds times each multiplier, fixed 0 or
the policy's mean drafting work; each priced exactly by walking the sweep's outcomes. The best one
replaces the fixed B* only where it prices at least ``budget.round_min_gain`` faster; the entry then
holds ``round_budget`` (verify_ms, fixed_ms, gain_scale) and pair_tree decodes with it.
``mode: fixed`` measures nothing and gives every pair
tree.budget (the stage switched off).

Writes ``budget.out_dir``: ``budgets.json`` (collectors/pricing/budget_file.py reads it), ``budgets.md``,
``speedup_by_budget.png`` and ``plots/speedup_by_budget.csv``, and ``metrics.json``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

from tabulate import tabulate

from collectors.collect.plan import (
    dataset_file,
    load_registered_pair,
    profile_for,
    report_questions,
    tree_config,
)
from collectors.collect.report import ReportSpec
from collectors.evaluation.plots import new_figure
from collectors.pricing.budget_file import BUDGETS_FILE, write_budgets
from collectors.pricing.budget_sweep import PolicySweep, RoundRule, round_rules, sweep_pair
from config.params import Params, resolve
from decoder.core.policies import AR
from decoder.deploy.latency import LatencyProfile
from pipeline.cli import run_stage
from pipeline.runtime import apply_runtime
from pipeline.tracking import log_figure, log_files, log_metrics, stage_run, write_csv, write_json

log = logging.getLogger(__name__)
MODES = ("measured", "fixed")
CURVE_COLUMNS = ("pair_id", "policy", "budget", "priced_speedup")


def budget_pairs(params: Params) -> list[str]:
    """collect.pairs, then the evaluate pairs collect lacks, in order."""
    return list(dict.fromkeys((*params.collect.pairs, *params.evaluate.pairs)))


def validate(params: Params) -> None:
    cfg = params.budget
    if cfg.mode not in MODES:
        raise ValueError(f"budget.mode must be one of {MODES}, got {cfg.mode!r}")
    unknown = [p for p in budget_pairs(params) if p not in params.pairs]
    if unknown:
        raise ValueError(
            f"collect/evaluate.pairs: unknown pair(s) {unknown}; the registry has {sorted(params.pairs)}"
        )
    depth = params.tree.depth
    odd = [b for b in cfg.schedules if len(b) != depth or set(b) - {"0", "1"}]
    if odd:
        raise ValueError(f"budget.schedules: each entry is a string of {depth} bits (tree.depth), got {odd}")
    max_n = params.tree.ngram_max_n
    bad = [
        list(shape)
        for shape in cfg.shapes
        if len(shape) not in (2, 3) or min(shape) < 1 or (len(shape) == 3 and shape[2] > max_n)
    ]
    if bad:
        raise ValueError(
            "budget.shapes: each entry is [width, topk] or [width, topk, ngram_min_n] of positive ints "
            f"(ngram_min_n <= tree.ngram_max_n = {max_n}), got {bad}"
        )
    if cfg.mode == "fixed":
        return
    if cfg.prompts_per_pair <= 0 or cfg.max_new_tokens <= 0 or not cfg.datasets:
        raise ValueError(
            "budget.prompts_per_pair, budget.max_new_tokens and budget.datasets must be positive"
        )
    missing = [d for d in cfg.datasets if not dataset_file(params, d).is_file()]
    if missing:
        raise ValueError(f"budget.datasets: no question file for {missing} under {params.data.out_dir}")
    stop = params.collect.prompt_start + math.ceil(cfg.prompts_per_pair / len(cfg.datasets))
    if stop > params.evaluate.prompt_start:
        raise ValueError(
            f"budget.prompts_per_pair={cfg.prompts_per_pair} over {len(cfg.datasets)} datasets reaches "
            f"question {stop - 1}, at or past evaluate.prompt_start={params.evaluate.prompt_start}: "
            "the evaluate prompts are held back"
        )


def budget_specs(params: Params, pair_id: str) -> list[ReportSpec]:
    """The prompt slices of one pair: dataset i mod n gets the i-th of budget.prompts_per_pair."""
    cfg, start = params.budget, params.collect.prompt_start
    n = len(cfg.datasets)
    counts = [len(range(d, cfg.prompts_per_pair, n)) for d in range(n)]
    return [
        ReportSpec(pair_id, ds, start, start + k) for ds, k in zip(cfg.datasets, counts, strict=True) if k
    ]


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


def measure_pair(params: Params, pair_id: str) -> dict:
    """The pair's entry: B* and its policy under the best-priced tree shape (width, topk), each
    shape's own pick recorded under ``shapes`` ("WxM" -> budget, policy, speedup)."""
    pair = load_registered_pair(params, pair_id)
    profile = profile_for(params, pair_id)
    prompts = [
        p for spec in budget_specs(params, pair_id) for p in report_questions(params, spec, pair.tokenizer)[1]
    ]
    picks = {}
    for width, topk, min_n in tree_shapes(params):
        tree = dataclasses.replace(tree_config(params.tree), width=width, topk=topk, ngram_min_n=min_n)
        sweeps = sweep_pair(
            pair, profile, prompts, tree, params.budget.max_new_tokens, schedules=params.budget.schedules
        )
        cfg = params.budget
        pick = choose(sweeps, profile, len(prompts), cfg.round_gain_scales, cfg.round_min_gain)
        picks[width, topk, min_n] = {**pick, "width": width, "topk": topk, "ngram_min_n": min_n}
        log.info("%s, W = %d, m = %d, n-gram n >= %d: B* = %d (%s, %.2fx)", pair_id, width, topk, min_n,
                 pick["budget"], pick["policy"], pick["speedup_at_budget"])  # fmt: skip
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
    log.info("%s: B* = %d, W = %d, m = %d (%s, %.2fx; %.2fx at B = %d; SABA B = %d, %.2fx)", pair_id,
             entry["budget"], entry["width"], entry["topk"], entry["policy"], entry["speedup_at_budget"],
             entry["speedup_at_max"], params.tree.budget, entry["saba_budget"],
             entry["speedup_at_saba"])  # fmt: skip
    return entry


def markdown(entries: dict[str, dict], b_max: int) -> str:
    """budgets.md: one row per pair (a fixed-mode pair shows its budget and dashes)."""
    head = [
        "pair", "B*", "W x m", "policy", "speedup @ B*", f"speedup @ B={b_max}", "gain", "SABA B",
        "speedup @ SABA", "best B per policy", "per-round rule", "decodes with",
    ]  # fmt: skip
    fixed = ["-", "fixed", *["-"] * 8]  # W x m through decodes with
    body = [
        [pair_id, str(e["budget"]), *fixed] if e["mode"] == "fixed" else _measured_row(pair_id, e)
        for pair_id, e in entries.items()
    ]
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True) + "\n"


def _measured_row(pair_id: str, e: dict) -> list[str]:
    """A measured pair's cells, each formatted as budgets.md prints it."""
    per = ", ".join(f"{n} {p['best_budget']} ({p['best_speedup']:.2f}x)" for n, p in e["policies"].items())
    min_n = e.get("ngram_min_n", 1)
    shape = f"{e['width']} x {e['topk']}" + (f", n-gram n >= {min_n}" if min_n > 1 else "")
    return [
        pair_id,
        str(e["budget"]),
        shape,
        e["policy"],
        f"{e['speedup_at_budget']:.2f}x",
        f"{e['speedup_at_max']:.2f}x",
        f"{e['speedup_at_budget'] / e['speedup_at_max']:.2f}",
        f"{e['saba_budget']} ({e['saba_policy']})",
        f"{e['speedup_at_saba']:.2f}x",
        per,
        rule_text(e),
        e["decode_policy"],
    ]


def rule_text(e: dict) -> str:
    """The per-round rule column: on (B_t <= cap; the fixed B's speedup), or the best tried, or -."""
    tried = e.get("round_rule_tried")
    if e.get("round_budget") is not None:
        return f"on, B_t <= {e['budget']} (fixed B: {e['speedup_fixed_budget']:.2f}x)"
    if tried:
        return f"off (best tried {tried['speedup']:.2f}x)"
    return "-"


def curve_rows(entries: dict[str, dict]) -> list[dict]:
    """One row per (pair, policy, budget): the plot's data for dvc plots."""
    return [
        dict(zip(CURVE_COLUMNS, (pair_id, name, b, s), strict=True))
        for pair_id, e in entries.items()
        for name, p in e.get("policies", {}).items()
        for b, s in enumerate(p["speedup"], start=1)
    ]


def write_curves(path: Path, rows: list[dict]) -> None:
    """The curves CSV; with nothing measured (mode fixed) its header alone."""
    if rows:
        write_csv(path, rows)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(",".join(CURVE_COLUMNS) + "\n")


def curve_plot(entries: dict[str, dict], path: Path) -> object:
    """Priced speedup over AR vs budget, the better policy per budget, one line per pair; B* marked."""
    fig, ax = new_figure(8, 4)
    for pair_id, e in entries.items():
        if e["mode"] == "fixed":
            continue
        best = [max(c) for c in zip(*(p["speedup"] for p in e["policies"].values()), strict=True)]
        (line,) = ax.plot(range(1, len(best) + 1), best, label=pair_id)
        ax.plot([e["budget"]], [e["speedup_at_budget"]], "o", color=line.get_color())
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verification budget B (nodes besides the root)")
    ax.set_ylabel("priced speedup over AR (better of All-Small, All-Mid)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncols=2)
    fig.savefig(path, dpi=120)
    return fig


def summary(entries: dict[str, dict]) -> dict:
    measured = {k: e for k, e in entries.items() if e["mode"] == "measured"}
    metrics: dict = {"n_pairs": len(entries), "n_measured": len(measured)}
    if measured:
        for key in ("speedup_at_budget", "speedup_at_max", "speedup_at_saba"):
            metrics[f"mean_{key}"] = sum(e[key] for e in measured.values()) / len(measured)
        metrics["mean_gain"] = sum(
            e["speedup_at_budget"] / e["speedup_at_max"] for e in measured.values()
        ) / len(measured)
    keys = ("budget", "saba_budget", "speedup_at_budget", "speedup_at_max", "speedup_at_saba")
    metrics["pairs"] = {k: {f: e[f] for f in keys if f in e} for k, e in entries.items()}
    return metrics


def main(params: Params) -> dict:
    validate(params)
    apply_runtime(params)
    out = resolve(params.budget.out_dir)
    b_max = params.tree.budget
    with stage_run("budget", params):
        if params.budget.mode == "fixed":
            entries = {p: {"mode": "fixed", "budget": b_max} for p in budget_pairs(params)}
        else:
            entries = {p: measure_pair(params, p) for p in budget_pairs(params)}
        table, metrics = markdown(entries, b_max), summary(entries)
        write_budgets(out / BUDGETS_FILE, entries)
        (out / "budgets.md").write_text(table)
        write_curves(out / "plots" / "speedup_by_budget.csv", curve_rows(entries))
        log_figure(curve_plot(entries, out / "speedup_by_budget.png"), "speedup_by_budget.png")
        write_json(out / "metrics.json", metrics)
        log_metrics(metrics)
        log_files([out / BUDGETS_FILE, out / "budgets.md"])
    print(table)
    return entries


if __name__ == "__main__":
    run_stage("budget", main)
