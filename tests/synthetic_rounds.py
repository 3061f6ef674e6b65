"""A synthetic round table (features.collect_schemas.rounds_spec) consistent with the synthetic
action and trajectory tables of tests/synthetic_collect.py.

Per report, ``n_prompts`` x ``n_starts`` round starts hold all 2^D schedules. A schedule's round
accepts about its trajectory's mean accepted length (integer, noisy) and costs its trajectory's
mean round latency (noisy), so the round-level margins follow the same planted structure as the
trajectories. The signals before step k are those of the action row of the first schedule with
that prefix plus per-start noise: equal for every schedule sharing the prefix, as in replay.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from decoder.core.policies import schedule_bits
from decoder.core.state import RECORDED_NAMES
from features.collect_schemas import rounds_spec
from features.tables import to_table


def synthetic_rounds(
    actions: pa.Table, trajectories: pa.Table, depth: int, seed: int, n_prompts: int = 2, n_starts: int = 3
) -> pa.Table:
    rng = np.random.default_rng(seed + 1000)
    acts = actions.to_pylist()
    trajs = {(t["report_id"], t["schedule_id"]): t for t in trajectories.to_pylist()}
    by = {(a["report_id"], a["schedule_id"], a["step"]): a for a in acts}
    reports = sorted({a["report_id"] for a in acts})
    rows = []
    for report in reports:
        first = by[report, 0, 1]
        prompt_tokens = round(math.expm1(first["log_prompt_tokens"]))
        lag = round(math.expm1(first["log_mid_lag"]))
        for p in range(n_prompts):
            start = prompt_tokens
            for _ in range(n_starts):
                noise: dict[tuple[int, str], np.ndarray] = {}
                owner: dict[tuple[int, str], int] = {}
                outcomes = []
                for sid in range(2**depth):
                    bits = schedule_bits(sid, depth)
                    text = "".join("1" if b else "0" for b in bits)
                    signals = []
                    for k in range(1, depth + 1):
                        key = (k, text[: k - 1])
                        src = owner.setdefault(key, sid)
                        noise.setdefault(key, 0.05 * rng.normal(size=len(RECORDED_NAMES)))
                        base = by[report, src, k]
                        signals += [base[n] + e for n, e in zip(RECORDED_NAMES, noise[key], strict=True)]
                    traj = trajs[report, sid]
                    accepted = max(0, round(traj["mean_accepted_length"] + 0.7 * rng.normal()))
                    ms = traj["round_latency_ms"] * (1 + 0.05 * rng.normal())
                    outcomes.append((sid, sum(bits), accepted, ms, signals))
                best = max(outcomes, key=lambda o: (1e3 * (o[2] + 1) / o[3], -o[0]))[0]
                for sid, calls, accepted, ms, signals in outcomes:
                    rows.append(
                        {
                            "report_id": report,
                            "pair_id": first["pair_id"],
                            "dataset_id": first["dataset_id"],
                            "prompt_id": p,
                            "prompt_tokens": prompt_tokens,
                            "start_position": start,
                            "mid_lag": lag,
                            "schedule_id": sid,
                            "accepted": accepted,
                            "verified_nodes": 64,
                            "mid_call_tokens": [50] * calls,
                            "n_small_steps": depth - calls,
                            "prompt_blocks": 0,
                            "round_latency_ms": ms,
                            "catch_up_ms": 0.0,  # the synthetic latencies hold no catch-up
                            "decision_ms": 0.01,
                            "decision_cold_ms": 0.02,
                            "throughput_tok_per_s": 1e3 * (accepted + 1) / ms,
                            "is_round_best": sid == best,
                            "signals": signals,
                        }
                    )
                start += 3
    return to_table(rounds_spec(depth), rows)
