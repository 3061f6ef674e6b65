"""The wall_check stage's decodes: a pair's prompts decoded for real, side by side, and timed.

Contract: per pair, evaluate's held-back prompts (round-robin over ``evaluate.datasets``),
``wall_check.prompts_per_pair`` at a time until every row is resolved or
``wall_check.most_prompts_per_pair`` are in, are decoded by the named methods and autoregressive
decoding with the same warm-up (in lockstep by default: ``wall_check.order``), each prompt timed as
often as decoder.measure.Repeats asks, every output checked against autoregressive decoding
(collectors/evaluation/cell.py: LosslessError on a real mismatch). The pair is profiled again just
before (one pass of the profile stage's measurement), and each prompt's decode time and its counts
priced with both profiles are handed to collectors/evaluation/wall_agreement.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from collectors.collect.plan import load_registered_pair, tree_config
from collectors.evaluation.cell import WARMUP_TOKENS, evaluate_cell, priced_ms
from collectors.evaluation.priced_tasks import cell_inputs, decode_config
from collectors.evaluation.wall_agreement import PromptTimes, agreement_rows
from collectors.pricing.profile_passes import compare_profiles
from collectors.pricing.profile_settings import measure_with_settings
from config.params import Params
from decoder.core.outcome import GenerationResult
from decoder.core.policies import AR, FixedSchedule, parse_policy
from decoder.deploy.latency import LatencyProfile
from decoder.measure import Method, Repeats
from decoder.models.pair import ModelPair


def profile_beside(params: Params, pair: ModelPair, pair_id: str) -> LatencyProfile:
    """One pass of the profile stage's measurement of the pair (``params.profile``'s settings, the
    stage's tree): taken just before the pair's decodes, it prices them as the machine ran them."""
    return measure_with_settings(pair, pair_id, params.profile, tree_config(params.tree))


def profile_drift(stage: LatencyProfile, beside: LatencyProfile) -> dict[str, float]:
    """Per component, the re-measured profile over the stage's (geometric mean over the points both
    measured): below 1, the machine ran that part faster than when it was profiled."""
    return {a.component: a.geomean_ratio for a in compare_profiles(stage, beside)}


def pair_prompts(params: Params, pair_id: str, pair: ModelPair, n: int) -> tuple:
    """(questions, prompts, profile, runtimes) of ``n`` of evaluate's held-back prompts of the pair,
    round-robin over ``evaluate.datasets`` (the k-th prompt is dataset k mod len's (k div len)-th),
    so every dataset's prompts are in the check before any dataset's second one."""
    datasets = params.evaluate.datasets
    per = {d: len(range(i, n, len(datasets))) for i, d in enumerate(datasets)}
    parts = {d: cell_inputs(params, pair_id, d, pair, per[d]) for d in datasets if per[d]}
    order = [(datasets[k % len(datasets)], k // len(datasets)) for k in range(n)]
    questions = [parts[d][0][j] for d, j in order]
    prompts = [parts[d][1][j] for d, j in order]
    runtimes = [parts[d][3][j] for d, j in order]
    return questions, prompts, parts[datasets[0]][2], runtimes


def wall_methods(names: Sequence[str], learned: Mapping[str, object], depth: int) -> list[Method]:
    """The methods to decode: a learned policy of ``learned`` by its name, or a fixed schedule
    (``all-small``, ``all-mid`` or ``depth`` bits); a ValueError names one that is neither."""
    out = []
    for name in names:
        if name in learned:
            out.append(Method(name, learned[name]))
            continue
        try:
            fixed = isinstance(parse_policy(name, depth), FixedSchedule)
        except ValueError:
            fixed = False
        if not fixed:
            raise ValueError(
                f"wall_check.methods: {name!r} is neither a learned policy {sorted(learned)} nor a "
                f"fixed schedule (all-small, all-mid or {depth} bits)"
            )
        out.append(Method(name, name))
    return out


def prompt_times(
    results: Sequence[GenerationResult], policy: object, profiles: Mapping[str, LatencyProfile]
) -> PromptTimes:
    """A method's decode seconds per prompt (wall minus prefill) and its rounds priced with each of
    ``profiles`` (cell.priced_ms: a fixed schedule pays no decisions)."""
    decode = np.array([r.wall_s - r.prefill_s for r in results], dtype=float)
    priced = {
        k: np.array([priced_ms(r, p, policy) for r in results], dtype=float) for k, p in profiles.items()
    }
    return PromptTimes(decode, priced)


@dataclass(frozen=True)
class PairCheck:
    """What :func:`check_pair` measured on one pair."""

    rows: list[dict]  # agreement_rows of the pair
    drift: dict[str, float]  # profile_drift of the pair
    beside: LatencyProfile
    lossless: dict[str, dict]  # method -> LosslessReport.summary()
    answers: dict[tuple[str, str], list[dict]]  # (method, dataset) -> Spec-Bench answer records


def check_pair(
    params: Params, pair_id: str, names: Sequence[str], learned: Mapping[str, object], repeats: Repeats
) -> PairCheck:
    """Profile the pair again, then decode its prompts (:func:`pair_prompts`) with the methods
    ``names`` (:func:`wall_methods`, from ``learned`` or fixed) and AR side by side, in
    ``wall_check.order`` (LosslessError on any real mismatch), ``wall_check.prompts_per_pair`` at a
    time until every method's priced / measured interval is resolved (within the band or outside it)
    or ``wall_check.most_prompts_per_pair`` are decoded; returns the pair's rows and what the stage
    writes. Deciding after each batch makes a wrong verdict somewhat likelier than one look's 5%."""
    cfg = params.wall_check
    pair = load_registered_pair(params, pair_id)
    questions, prompts, profile, runtimes = pair_prompts(params, pair_id, pair, cfg.most_prompts_per_pair)
    config = decode_config(params, pair_id)
    methods = wall_methods(names, learned, config.tree.depth)
    beside = profile_beside(params, pair, pair_id)
    lockstep = cfg.order == "lockstep"
    policy = {AR: AR, **{m.name: m.policy for m in methods}}
    profiles = {"stage": profile, "beside": beside}
    results: dict[str, list[GenerationResult]] = {}
    lossless: dict[str, list[dict]] = {}
    answers: dict[tuple[str, str], list[dict]] = {}
    done = 0
    while True:
        todo = slice(done, min(done + cfg.prompts_per_pair, len(prompts)))
        cell = evaluate_cell(pair, questions[todo], prompts[todo], methods, config, runtimes[todo], profile,
                             WARMUP_TOKENS, beside, repeats, lockstep)  # fmt: skip
        for name, res in cell.results.items():
            results.setdefault(name, []).extend(res)
            lossless.setdefault(name, []).append(cell.lossless[name])
        for name, records in cell.answers.items():
            for q, record in zip(questions[todo], records, strict=True):
                answers.setdefault((name, q.dataset), []).append(record)
        done = todo.stop
        times = {n: prompt_times(res, policy[n], profiles) for n, res in results.items()}
        rows = agreement_rows(pair_id, times, cfg.bootstrap)
        if done >= len(prompts) or all(r["stage_verdict"] != "unresolved" for r in rows):
            break
    return PairCheck(rows, profile_drift(profile, beside), beside, merge_lossless(lossless), answers)


def merge_lossless(parts: Mapping[str, Sequence[dict]]) -> dict[str, dict]:
    """Per method, its LosslessReport summaries of several batches of prompts as one: sequence
    agreement weighted by prompts, token agreement by the tokens each batch compared."""
    out = {}
    for name, summaries in parts.items():
        n, t = sum(s["prompts"] for s in summaries), sum(s["tokens_compared"] for s in summaries)
        agreement = sum(s["sequence_agreement"] * s["prompts"] for s in summaries) / n if n else 1.0
        tokens = sum(s["token_agreement"] * s["tokens_compared"] for s in summaries) / t if t else 1.0
        out[name] = {**summaries[0], "prompts": n, "sequence_agreement": agreement, "token_agreement": tokens,
                     "tokens_compared": t,
                     "near_ties": sum(s["near_ties"] for s in summaries),
                     "real_mismatches": sum(s["real_mismatches"] for s in summaries)}  # fmt: skip
    return out
