"""The wall-clock check of the prices: per pair and method, priced over measured decoding speedup.

Contract: pure functions of per-prompt figures (collectors/evaluation/wall_decode.py measures
them). Per prompt, a method's decode time (wall minus prefill) and its counts priced with the pair's
profile (prefill excluded, as every priced figure) give its measured speedup, sum(AR decode s) /
sum(method decode s), and its priced speedup on the same runs, sum(AR priced ms) / sum(method
priced ms). The check is their ratio, priced / measured, with a 95% percentile bootstrap over
prompts (the priced and measured sums of every method and profile on the same resamples, so a price
proportional to the clock agrees exactly however much prompts differ); AGREEMENT is the band it
should fall in, and a verdict says whether the interval lies within the band, outside it, or holds
an edge (unresolved: more prompts would be needed to tell). ``beside`` is the pair profiled again
just before its decodes: a ratio out of the band with the stage's profile but in it with the beside
one is a machine that changed speed, not a wrong cost model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tabulate import tabulate

from collectors.evaluation.bootstrap import paired_interval, ratio_of_sums
from decoder.core.policies import AR

AGREEMENT = (0.90, 1.10)  # the band priced / measured should fall in
PROFILES = ("stage", "beside")  # the profile stage's prices; the pair profiled again beside its decodes


@dataclass(frozen=True)
class PromptTimes:
    """One method's figures per prompt, each of shape (n_prompts,): decode seconds (wall minus
    prefill) and the counts priced in ms with the stage's and the beside profile."""

    decode_s: np.ndarray
    priced_ms: dict[str, np.ndarray]  # PROFILES -> (n_prompts,)


def verdict(low: float, high: float) -> str:
    """``within`` AGREEMENT, ``outside`` it, or ``unresolved`` (the interval holds a band edge)."""
    if AGREEMENT[0] <= low and high <= AGREEMENT[1]:
        return "within"
    if high < AGREEMENT[0] or low > AGREEMENT[1]:
        return "outside"
    return "unresolved"


def _priced_over_measured(
    ar_p: np.ndarray, m_p: np.ndarray, ar_d: np.ndarray, m_d: np.ndarray, axis: int = -1
) -> np.ndarray:
    return ratio_of_sums(ar_p, m_p, axis) / ratio_of_sums(ar_d, m_d, axis)


def agreement_rows(pair_id: str, times: Mapping[str, PromptTimes], n_boot: int, seed: int = 0) -> list[dict]:
    """One row per method but AR (``times`` holds AR's too): the measured and priced speedups on
    the same runs, priced / measured with its 95% bootstrap interval and verdict per profile."""
    ar = times[AR]
    rows = []
    for name, m in times.items():
        if name == AR:
            continue
        row = {"pair_id": pair_id, "method": name, "n_prompts": len(ar.decode_s)}
        measured = paired_interval((ar.decode_s, m.decode_s), ratio_of_sums, n_boot, seed)
        row["measured_speedup"], row["measured_ci_low"], row["measured_ci_high"] = measured
        for key in PROFILES:
            if key not in m.priced_ms:
                continue
            priced = float(ratio_of_sums(ar.priced_ms[key], m.priced_ms[key]))
            samples = (ar.priced_ms[key], m.priced_ms[key], ar.decode_s, m.decode_s)
            ratio, low, high = paired_interval(samples, _priced_over_measured, n_boot, seed)
            row |= {f"{key}_priced_speedup": priced, f"{key}_ratio": ratio, f"{key}_ci_low": low,
                    f"{key}_ci_high": high, f"{key}_verdict": verdict(low, high)}  # fmt: skip
        rows.append(row)
    return rows


def _ci(r: dict, key: str) -> str:
    """``ratio [low, high] verdict`` of one profile's priced / measured."""
    ratio, low, high = r[f"{key}_ratio"], r[f"{key}_ci_low"], r[f"{key}_ci_high"]
    return f"{ratio:.2f} [{low:.2f}, {high:.2f}] {r[f'{key}_verdict']}"


def agreement_table(rows: Sequence[dict]) -> str:
    """Markdown: per pair and method, the measured decoding speedup with its 95% interval, the same
    runs priced, and priced / measured with its interval and verdict, with the stage's profile and
    with the pair re-profiled beside the decodes; ``deployed`` marks what the pair deploys."""
    head = ["pair", "method", "deployed", "prompts", "measured (decoding only)", "95% CI",
            "priced, same runs", "priced / measured [95% CI]", "re-profiled: priced / measured [95% CI]",
            "priced, evaluate"]  # fmt: skip
    body = [
        [r["pair_id"], r["method"], "yes" if r.get("is_deployed") else "", r["n_prompts"],
         f"{r['measured_speedup']:.2f}x", f"[{r['measured_ci_low']:.2f}, {r['measured_ci_high']:.2f}]",
         f"{r['stage_priced_speedup']:.2f}x", _ci(r, "stage"),
         _ci(r, "beside") if "beside_ratio" in r else "-",
         f"{r['evaluate_priced_speedup']:.2f}x" if r.get("evaluate_priced_speedup") is not None else "-"]
        for r in rows
    ]  # fmt: skip
    return tabulate(body, head, tablefmt="github", disable_numparse=True)


def agreement_summary(rows: Sequence[dict]) -> dict[str, dict]:
    """Per profile with figures: how many (pair, method) rows, how many of their intervals lie
    within the band, outside it, or unresolved, the share of points in the band, and the lowest,
    median and highest ratio."""
    out = {}
    for key in PROFILES:
        have = [r for r in rows if f"{key}_ratio" in r]
        if not have:
            continue
        ratio = np.array([r[f"{key}_ratio"] for r in have])
        verdicts = [r[f"{key}_verdict"] for r in have]
        out[key] = {
            "rows": len(have),
            **{v: verdicts.count(v) for v in ("within", "outside", "unresolved")},
            "ci_within_share": verdicts.count("within") / len(have),
            "point_within_share": float(np.mean((ratio >= AGREEMENT[0]) & (ratio <= AGREEMENT[1]))),
            "min": float(ratio.min()),
            "median": float(np.median(ratio)),
            "max": float(ratio.max()),
        }
    return out


def evaluate_priced(main: Sequence[dict]) -> dict[tuple[str, str], float]:
    """(pair, method) -> evaluate's priced speedup of the method, mean over the pair's cells (its
    rows in evaluate's results.json ``main``)."""
    sums: dict[tuple[str, str], list[float]] = {}
    for r in main:
        sums.setdefault((r["pair_id"], r["method"]), []).append(r["priced_speedup"])
    return {k: float(np.mean(v)) for k, v in sums.items()}


def mark_rows(
    rows: Sequence[dict], deploys: Mapping[str, str], held_out: Sequence[str], evaluate_main: Sequence[dict]
) -> list[dict]:
    """The rows with ``is_deployed`` (the method is what the pair's bundle deploys, ``deploys``:
    pair -> method, or the row decoded as ``deployed``), ``is_held_out_pair`` and evaluate's priced
    speedup of the same pair and method (:func:`evaluate_priced`; None where evaluate has none)."""
    priced = evaluate_priced(evaluate_main)
    return [
        {
            **r,
            "is_deployed": r["method"] in (deploys.get(r["pair_id"]), "deployed"),
            "is_held_out_pair": r["pair_id"] in held_out,
            "evaluate_priced_speedup": priced.get((r["pair_id"], r["method"])),
        }
        for r in rows
    ]
