"""The text of `make results`: the lines and tables that read the pipeline's metrics.

Pure functions from the stages' metrics dicts to Markdown; pipeline/readme.py reads the artifacts
and writes the pages. Kept apart so the wording can be tested without any artifact.
"""

from __future__ import annotations

from tabulate import tabulate

from collectors.evaluation.eval_report import metric_prefix
from collectors.evaluation.wall_agreement import AGREEMENT


def gain_text(v) -> str:
    """A gain as +x.x%, with its 95% interval where it is [point, low, high]."""
    if isinstance(v, list | tuple):
        return f"{v[0] - 1:+.1%} [{v[1] - 1:+.1%}, {v[2] - 1:+.1%}]"
    return f"{v - 1:+.1%}"


def _gain_words(stats: dict, spread: dict | None = None) -> str:
    """The deployed row's mean and worst gain, with the intervals of the headline (evaluate's
    ``headline``: under every profile pass and resampled prompts) where the run has them."""
    if spread:
        return f"mean {gain_text(spread['mean'])}, worst {gain_text(spread['worst'])}"
    return f"mean {gain_text(stats['student_gain_mean'])}, worst {gain_text(stats['student_gain_worst'])}"


def headline_table(ev_metrics: dict, graft_metrics: dict, wall_metrics: dict | None = None) -> str:
    """One row per group of cells for the deployed scheduler (priced against the better of All-Small
    and All-Mid, and how often it reaches the best fixed schedule in hindsight), the pricing check
    against the clock (``wall_metrics``, the wall_check stage's, where given), then full GRAFT's
    mean speedup over autoregressive decoding."""
    priced = metric_prefix("priced_speedup", "deployed")
    head = [
        "held-back cells",
        "deployed scheduler vs the better of All-Small and All-Mid, priced [95% interval]",
        ">= the best fixed schedule in hindsight",
        "vs the adaptive rule",
    ]
    body = []
    headline = ev_metrics.get("headline", {})
    for name, stats in sorted(ev_metrics.items()):
        if not name.startswith(priced):
            continue
        group = name.removeprefix(priced)
        best, spread = stats.get("student_at_least_best_fixed"), headline.get(group.replace("_", " "))
        over = (spread or {}).get("vs_adaptive") or stats.get("student_vs_adaptive_mean")
        body.append(
            [
                f"{group.replace('_', ' ')} ({stats['n_cells']})",
                _gain_words(stats, spread),
                "n/a" if best is None else f"{best:.0%}",
                "n/a" if over is None else gain_text(over),
            ]
        )
    if not body:
        raise ValueError("evaluate metrics.json: no deployed.priced_speedup.* groups")
    stage = (wall_metrics or {}).get("summary", {}).get("stage")
    if stage:
        body.append(
            [
                f"pricing vs the clock (`wall_check`, {stage['rows']} pair x policy)",
                f"priced / measured median {stage['median']:.2f} ({stage['min']:.2f}-{stage['max']:.2f}); "
                f"95% interval within {AGREEMENT[0]:.2f}-{AGREEMENT[1]:.2f} "
                f"on {stage['within']} of {stage['rows']}",
                "",
                "",
            ]
        )
    means = graft_metrics["mean_speedup"]
    walls = graft_metrics.get("mean_wall_speedup", {})
    wall_full = f", {walls['full']:.2f}x wall clock" if "full" in walls else ""
    vs = graft_metrics.get("graft_vs_hindsight")
    against = f"; full GRAFT vs that best B {gain_text(vs)}" if vs else ""
    body.append(
        [
            f"GRAFT, block drafters ({graft_metrics['n_cells']})",
            f"full GRAFT {means['full']:.2f}x over autoregressive decoding{wall_full}; "
            f"DDTree at its best B in hindsight {means['hindsight']:.2f}x{against}",
            f"{graft_metrics['full_graft_at_least_hindsight']:.0%} (vs DDTree's best B)",
            "",
        ]
    )
    return tabulate(body, head, tablefmt="github", disable_numparse=True)


def half_split_line(metrics: dict, prompts: int) -> str:
    """What '% of best' is measured against: the collect stage's half-split figure (collect/summary.py)
    as the scale for the offline table; empty when the run did not produce it."""
    if "mean_half_split" not in metrics:
        return ""
    return (
        f"For scale: the best enumerated schedule is the fastest in hindsight on the report's own {prompts} "
        f"prompts. A schedule chosen on half of them reaches {metrics['mean_half_split']:.1%} of the best "
        f"on the other half (mean over reports and every split; worst report "
        f"{metrics['min_half_split']:.1%}; the collected reports' half-split column): the part of 100% "
        "that no choice made without seeing the prompts can count on."
    )


def learned_budget_line(metrics: dict) -> str:
    """B_learned per pair and the mean speedup of every row."""
    chosen = {pair_id: p["learned_budget"] for pair_id, p in sorted(metrics["pairs"].items())}
    budgets = "; ".join(
        f"{k} B = {c['plain']['budget']} (TDES: {c['tdes']['budget']})" for k, c in chosen.items()
    )
    rules = "; ".join(rule_words(k, c["tdes"]) for k, c in chosen.items() if "rule" in c["tdes"])
    means = ", ".join(f"{k} {v:.2f}x" for k, v in metrics["mean_speedup"].items())
    walls = ", ".join(f"{k} {v:.2f}x" for k, v in metrics.get("mean_wall_speedup", {}).items())
    line = f"Learned budgets: {budgets}. Mean priced speedup over the cells: {means}."
    if rules:
        line += f" Per-round rule with TDES, on the collect prompts out of fold: {rules}."
    tasks = "; ".join(
        per_task_words(k, c["per_task"])
        for k, c in chosen.items()
        if "left_out_speedup" in c.get("per_task", {})
    )
    if tasks:
        line += (
            " Full GRAFT's budget per task or once for all tasks, each collect prompt priced at the "
            f"choice made without it: {tasks}."
        )
    if walls:
        line += f" Mean wall-clock speedup: {walls}."
    return line


def rule_words(pair_id: str, choice: dict) -> str:
    rule = choice["rule"]
    used = "per-round rule" if choice["use_rule"] else "fixed B"
    return (
        f"{pair_id} cap {rule['cap']}, {choice['oof_speedup_rule']:.3f}x vs fixed B "
        f"{choice['oof_speedup_fixed']:.3f}x, full GRAFT chosen once for all tasks uses the {used}"
    )


def per_task_words(pair_id: str, task: dict) -> str:
    """Whether a pair's full GRAFT chose per task, and each task's arm when it did."""
    head = (
        f"{pair_id} {task['left_out_speedup']:.3f}x per task vs {task['left_out_speedup_pooled']:.3f}x once"
    )
    if not task["use"]:
        return head + ", chosen once"

    def arm(a: dict) -> str:
        what = f"per-round rule (cap {a['budget']})" if a["rule"] else f"B = {a['budget']}"
        return what + (" + TDES" if a["tdes"] else " without TDES")

    return head + ", per task (" + ", ".join(f"{t}: {arm(a)}" for t, a in task["arms"].items()) + ")"


def graft_checks_line(metrics: dict) -> str:
    """The issue's done-when targets as measured; full GRAFT is the learned budget with TDES on or off."""
    return (
        f"Over {metrics['n_cells']} cells: full GRAFT (learned B, TDES on or off) >= DDTree at its best "
        f"fixed B in hindsight on {metrics['full_graft_at_least_hindsight']:.0%} (GRAFT with SABA's budget "
        f"on {metrics['graft_at_least_hindsight']:.0%}, TDES + the per-round rule on "
        f"{metrics['graft_rule_at_least_hindsight']:.0%}); learned B "
        f"{yes(metrics['learned_at_least_saba_on_mean'])} SABA's rule on the mean (with TDES: "
        f"{yes(metrics['full_graft_at_least_saba_graft_on_mean'])}); "
        f"TDES raises A at equal budget on "
        f"{metrics['tdes_raises_a']:.0%} at the fixed B (keeps or raises it on "
        f"{metrics['tdes_keeps_or_raises_a']:.0%}) and on "
        f"{metrics['tdes_raises_a_at_learned_budget']:.0%} at "
        "TDES's learned B (DDTree's A there from the exact walk); "
        f"added decision time per round (TDES + SABA or the per-round rule) at most "
        f"{metrics['max_overhead_ms']:.3f} ms."
    )


def yes(ok: bool) -> str:
    return ">=" if ok else "<"


def student_table(cells: list[dict], main: list[dict]) -> str:
    """TreeGraft's student (evaluate stage, its own prompt count) beside GRAFT on the same cells."""
    student = {(r["pair_id"], r["dataset_id"]): r for r in main if r.get("method") == "student"}
    head = [
        "pair",
        "dataset",
        "TreeGraft student (evaluate)",
        "GRAFT (SABA)",
        "full GRAFT (learned B)",
        "DDTree, best B in hindsight",
    ]
    body = []
    for c in cells:
        s = student.get((c["pair_id"], c["dataset_id"]))
        tg = "n/a" if s is None else f"{s['priced_speedup']:.2f}x (A {s['mean_accepted_length']:.2f})"
        rows = [c["rows"][k] for k in ("graft", "full", "hindsight")]
        cols = [f"{r['speedup']:.2f}x (A {r['mean_accepted']:.2f})" for r in rows]
        body.append([c["pair_id"], c["dataset_id"], tg, *cols])
    return tabulate(body, head, tablefmt="github", disable_numparse=True)


def _offset_or_name(method: str) -> str:
    """A student threshold by its offset (``student`` is 0, ``student:-0.50`` is -0.50); any other
    method by its name."""
    return "0" if method == "student" else method.removeprefix("student:")


def pair_check_line(metrics: dict) -> str:
    """What each pair deploys, with the pooled priced speedups on its calibration prompts (the
    student's at each threshold the check tried, named by their offsets)."""

    def speedups(c: dict) -> str:
        ends = [f"{m} {v:.2f}x" for m, v in c["speedup"].items() if not m.startswith("student")]
        student = [
            f"{_offset_or_name(m)}: {v:.2f}x" for m, v in c["speedup"].items() if m.startswith("student")
        ]
        return ", ".join(ends) + ("; student at threshold offset " + ", ".join(student) if student else "")

    parts = [
        f"{pair_id} {c['deploys']} ({speedups(c)})" for pair_id, c in metrics.get("pair_check", {}).items()
    ]
    return (
        "Pair check (the `deployed` column): per pair, the student at the threshold (the exported one "
        "plus an offset) that prices fastest on the pair's calibration prompts (the questions right "
        "after the collect slice, of the fitting datasets: neither trained on nor held back) where it "
        "prices strictly faster than the better of All-Small and All-Mid there, that endpoint "
        "otherwise; pooled calibration speedups: " + "; ".join(parts) + "."
    )


def transfer_line(metrics: dict) -> str:
    """The pair check's threshold choices beside the fastest threshold on the held-back prompts."""
    transfer = metrics.get("threshold_transfer", {})
    if not transfer:
        return ""

    parts = []
    for pair_id, t in transfer.items():
        shown = ", ".join(
            f"{_offset_or_name(m)}: {v:.2f}x" for m, v in t["speedup"].items() if m.startswith("student")
        )
        parts.append(
            f"{pair_id} chose {_offset_or_name(t['chosen'])}, "
            f"fastest here {_offset_or_name(t['held_back_best'])} ({shown})"
        )
    deploying = [t for t in transfer.values() if t["chosen"].startswith("student")]
    same = sum(t["chosen"] == t["held_back_best"] for t in deploying)
    return (
        "The pair check's choice on the held-back prompts (every threshold replayed on every cell, "
        "pooled over each pair's fitting cells, by threshold offset; of the pairs deploying the "
        f"student, {same} of {len(deploying)} chose the threshold fastest here): " + "; ".join(parts) + "."
    )


def pricing_line(metrics: dict) -> str:
    """The wall_check stage's verdicts: per profile (the stage's, and each pair's re-measured one),
    of how many (pair, method) rows the 95% interval of priced / measured lies within the band,
    outside it, or holds an edge, with the median and range, and how far the machine drifted."""
    summary = metrics.get("summary", {})
    if not summary:
        return ""
    low, high = AGREEMENT
    words = {
        "stage": "with the profile stage's profiles (the prices of every table above)",
        "beside": "with each pair profiled again just before its decodes (one pass)",
    }
    parts = [
        f"{words[k]}: within on {a['within']} of {a['rows']}, outside on {a['outside']}, unresolved on "
        f"{a['unresolved']} (median {a['median']:.2f}, {a['min']:.2f}-{a['max']:.2f})"
        for k, a in summary.items()
    ]
    drift = metrics.get("profile_drift", {})
    moved = "; ".join(
        f"{pair_id} " + ", ".join(f"{c} {r:.2f}" for c, r in d.items()) for pair_id, d in drift.items()
    )
    line = (
        f"Priced / measured (decoding only), its 95% interval against {low:.2f}-{high:.2f}: "
        + "; ".join(parts)
        + "."
    )
    if moved:
        line += (
            " Re-profiled over the stage's profile per component (geometric mean over the points, "
            f"below 1: faster now): {moved}."
        )
    return line


def gains_line(metrics: dict, key: str = "priced_speedup", learned: str = "student") -> str:
    """The learned row's (the student's, or the deployed row's) gain over the better endpoint per
    group of cells (mean, best, worst), and the share of cells where it is at least the best fixed
    schedule in hindsight."""
    parts = []
    prefix = metric_prefix(key, learned)
    for name, stats in sorted(metrics.items()):
        if name.startswith(prefix):
            group = name.removeprefix(prefix).replace("_", " ")
            part = (
                f"{group} ({stats['n_cells']} cells): mean {stats['student_gain_mean'] - 1:+.1%}, "
                f"best {stats['student_gain_best'] - 1:+.1%}, worst {stats['student_gain_worst'] - 1:+.1%}"
            )
            if stats.get("student_at_least_best_fixed") is not None:
                part += f", >= best fixed on {stats['student_at_least_best_fixed']:.0%} of cells"
            parts.append(part)
    label = "priced" if key == "priced_speedup" else "wall clock"
    who = "Student" if learned == "student" else "Deployed (the pair check's choice)"
    return f"{who} vs the better of All-Small and All-Mid, {label}: " + "; ".join(parts) + "."
