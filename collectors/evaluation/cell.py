"""End-to-end evaluation of decoding methods on one (pair, dataset) cell, and its tables.

Contract: every method decodes the same prompts after the same warm-up, timed by the same clock
(`decoder.measure.run_side_by_side`); every method's output is compared with autoregressive
decoding by `decoder.check_lossless`: in fp32 any difference is a real mismatch; in bf16/fp16 a
divergence at a numerical near-tie (fp32 top-2 logit gap within the stated tolerance) is reported
but allowed. On any real mismatch `LosslessError` is raised and nothing is written; the agreement
rates of every method are in `CellResult.lossless`. Each method
gets wall-clock numbers and the same counts re-priced with the pair's latency profile, so the
table can be shown for another device's profile. Per-question records follow the Spec-Bench
answer format (per-turn new tokens, wall time, accepted lengths).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace

from collectors.collect.replay import Replayer
from collectors.data.prompts import Question
from decoder.check_lossless import LosslessReport, check_outputs, fp32_judge
from decoder.core.config import DecodeConfig
from decoder.core.outcome import GenerationResult
from decoder.core.policies import AR, FixedSchedule, RuntimeContext, schedule_bits
from decoder.deploy.latency import LatencyProfile, counts_from_round, price_ar, price_round
from decoder.measure import ONCE, Method, Repeats, run_side_by_side, summarise
from decoder.models.pair import ModelPair

# Warm-up tokens per method before a pair's timed runs: the full warm-up on a pair's first cell, a
# token on its later cells (the same models and methods decoded just before, so already warm).
WARMUP_TOKENS, WARM_AGAIN_TOKENS = 16, 1


class LosslessError(RuntimeError):
    """A method's output differs from autoregressive decoding by more than a numerical near-tie."""


@dataclass(frozen=True)
class CellResult:
    rows: list[dict]  # one per method
    answers: dict[str, list[dict]]  # method -> Spec-Bench answer records
    results: dict[str, list[GenerationResult]]  # method -> its generations, prompt by prompt
    lossless: dict[str, dict] = field(default_factory=dict)  # method -> LosslessReport.summary()


def lossless_gate(
    pair: ModelPair, prompts: list[list[int]], results: dict[str, list[GenerationResult]]
) -> dict[str, LosslessReport]:
    """Classify every method's divergences from AR; raise LosslessError on any real mismatch."""
    refs = [r.new_tokens for r in results[AR]]
    differs = any([r.new_tokens for r in res] != refs for res in results.values())
    judge = fp32_judge(pair.target) if differs else pair.target  # an fp32 copy only when needed
    dtype = pair.target.dtype
    reports = {
        name: check_outputs(judge, prompts, refs, [r.new_tokens for r in res], dtype)
        for name, res in results.items()
    }
    bad = {n: r.n_real_mismatches for n, r in reports.items() if not r.ok}
    if bad:
        raise LosslessError(
            f"methods {sorted(bad)} produced output that differs from autoregressive decoding "
            f"beyond numerical near-ties (real mismatches per method: {bad}; dtype {pair.target.dtype})"
        )
    return reports


def best_fixed_in_hindsight(pair: ModelPair, prompts: list[list[int]], config: DecodeConfig, profile) -> str:
    """The fixed schedule with the best priced tokens/s on these very prompts (replay, exact A)."""
    depth = config.tree.depth
    schedules = [schedule_bits(s, depth) for s in range(2**depth)]
    replayer = Replayer(pair, config, schedules, profile=profile)
    ms, tokens = [0.0] * len(schedules), [0] * len(schedules)
    for prompt in prompts:
        rep = replayer.replay_prompt(prompt)
        for s in range(len(schedules)):
            # A fixed schedule makes no decisions at run time: no scheduler cost.
            ms[s] += sum(price_round(profile, replace(r.counts(), decisions=0)) for r in rep.rounds[s])
            tokens[s] += rep.n_tokens[s]
    best = max(range(len(schedules)), key=lambda s: (tokens[s] / ms[s], -s))
    return FixedSchedule(schedules[best]).text


def priced_ms(result: GenerationResult, profile: LatencyProfile, policy: object) -> float:
    """Modelled decoding time of a generation under the profile (prefill excluded)."""
    if not result.rounds:
        return price_ar(profile, result.decoded_tokens)
    fixed = isinstance(policy, FixedSchedule | str)
    total = 0.0
    for r in result.rounds:
        counts = counts_from_round(r)
        total += price_round(profile, replace(counts, decisions=0) if fixed else counts)
    return total


def priced_speedup(
    results: list[GenerationResult], ar: list[GenerationResult], profile: LatencyProfile, policy: object
) -> float:
    """The generations' priced speedup over the AR ones under the profile: AR's priced ms over the
    method's, each summed over the prompts (prefill excluded)."""
    return sum(priced_ms(r, profile, AR) for r in ar) / sum(priced_ms(r, profile, policy) for r in results)


def method_row(
    name: str,
    results: list[GenerationResult],
    ar: list[GenerationResult],
    profile: LatencyProfile,
    policy: object,
    depth: int,
    beside: LatencyProfile | None = None,
) -> dict:
    """A method's row; with ``beside`` (the pair profiled again next to these decodes) also the same
    counts priced with it, ``beside_priced_speedup``."""
    ar_tps = sum(len(r.new_tokens) for r in ar) / sum(r.wall_s for r in ar)
    m = summarise(name, results, ar_tps, lossless=True)
    priced = sum(priced_ms(r, profile, policy) for r in results)
    ar_priced = sum(priced_ms(r, profile, AR) for r in ar)
    rounds = [rd for r in results for rd in r.rounds]
    mid_steps = [st for rd in rounds for st in rd.steps if st.used_mid]
    per_step = [
        sum(rd.steps[k].used_mid for rd in rounds) / len(rounds) if rounds else 0.0 for k in range(depth)
    ]
    row = {
        "method": name,
        "n_tokens": m.n_tokens,
        "wall_s": m.wall_s,
        "tokens_per_s": m.tokens_per_s,
        "speedup": m.speedup_vs_ar,
        "priced_tokens_per_s": 1e3 * m.n_tokens / priced,
        "priced_speedup": ar_priced / priced,
        "mean_accepted_length": m.mean_accepted_length,
        "mid_call_rate": m.mid_call_rate,
        "mid_calls_per_step": per_step,
        "mid_pool_mean": sum(s.pool_size for s in mid_steps) / len(mid_steps) if mid_steps else 0.0,
        "historical_pick_share": (
            sum(s.historical_picks for s in mid_steps) / max(1, sum(s.frontier_size for s in mid_steps))
        ),
    }
    if beside is not None:
        row["beside_priced_speedup"] = priced_speedup(results, ar, beside, policy)
    return row


def evaluate_cell(
    pair: ModelPair,
    questions: list[Question],
    prompts: list[list[int]],
    methods: list[Method],
    config: DecodeConfig,
    runtime: RuntimeContext,
    profile: LatencyProfile,
    warmup_tokens: int = 16,
    beside: LatencyProfile | None = None,
    repeats: Repeats = ONCE,
    lockstep: bool = False,
) -> CellResult:
    """Decode with every method; raise LosslessError on any mismatch; return rows and answers.

    ``warmup_tokens``: every method's identical warm-up (decoder.measure.run_side_by_side); a cell
    whose pair and methods the previous cell has just decoded is already warm and may pass fewer.
    ``repeats``: how often each prompt is timed (decoder.measure.Repeats: a fast pair's prompts again
    and again, each method keeping its run of median wall time).
    ``beside``: a second profile of the pair, measured next to these decodes; every row then also
    prices its counts with it (``beside_priced_speedup``), to tell a machine that changed speed since
    ``profile`` was measured from a cost model that is wrong.
    ``lockstep``: a prompt's methods decode together, one round of each in turn
    (decoder.measure.run_lockstep), instead of one whole decode after another.
    """
    results = run_side_by_side(
        pair, prompts, methods, config, runtime, warmup_tokens, repeats=repeats, lockstep=lockstep
    )
    reports = lossless_gate(pair, prompts, results)
    policies = {AR: AR, **{m.name: m.policy for m in methods}}
    rows = [
        method_row(n, res, results[AR], profile, policies[n], config.tree.depth, beside)
        for n, res in results.items()
    ]
    answers = {
        n: [specbench_record(q, r, pair, n) for q, r in zip(questions, res, strict=True)]
        for n, res in results.items()
    }
    return CellResult(rows, answers, results, {n: r.summary() for n, r in reports.items()})


def specbench_record(question: Question, result: GenerationResult, pair: ModelPair, model_id: str) -> dict:
    """One answer line in the Spec-Bench format (single turn: the paper decodes the first turn)."""
    text = pair.tokenizer.decode(result.new_tokens) if pair.tokenizer is not None else ""
    return {
        "question_id": question.question_id,
        "category": question.category,
        "answer_id": uuid.uuid5(
            uuid.NAMESPACE_URL, f"{model_id}/{question.dataset}/{question.question_id}"
        ).hex,
        "model_id": model_id,
        "choices": [
            {
                "index": 0,
                "turns": [text],
                "decoding_steps": [max(1, len(result.rounds))],
                "new_tokens": [len(result.new_tokens)],
                "wall_time": [result.wall_s],
                "accept_lengths": [[r.emitted for r in result.rounds] or [1] * len(result.new_tokens)],
            }
        ],
        "tstamp": time.time(),
    }
