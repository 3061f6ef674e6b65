"""Synthetic collectors' tables (real schemas) for the learning stages' tests and benchmarks.

Each report is a pair/dataset with its own timings and mid-drafter gain: some favour All-Mid,
some All-Small, some a mixed schedule. Accepted length grows with mid calls with diminishing
returns (odd steps worth more); latency adds the mid call time per call. Tree signals depend on
the prefix plus per-trajectory noise, so action rows of one state differ and must be merged.

``planted`` names one tree signal that instead carries the report's hidden mid-drafter quality
(gain per unit of mid call time), which largely decides whether invoking pays; the other signals
then carry no gain term, so only the planted one reveals it: a signal selection must choose it
and a student can learn the margin's sign from it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
from synthetic_rounds import synthetic_rounds

from decoder.core.policies import schedule_bits
from decoder.core.state import CONTEXT_NAMES, SIGNAL_NAMES, history_features, history_names
from features.collect_schemas import TRAJECTORIES, actions_spec, rounds_spec
from features.tables import to_table, write_table


def _outcome(
    bits: tuple[bool, ...], gain: float, a0: float, target_ms: float, mid_ms: float
) -> tuple[float, float]:
    a, calls = a0, 0
    for k, b in enumerate(bits, start=1):
        if b:
            a += gain * (1.0 if k % 2 else 0.55) * 0.7**calls
            calls += 1
    latency = target_ms + calls * mid_ms + (len(bits) - calls) * 0.9
    return a, latency


def _signals(rng: np.random.Generator, k: int, prefix: tuple[bool, ...], gain: float) -> list[float]:
    calls = sum(prefix)
    depth = 0.4 + 0.8 * (k - 1) - 0.2 * calls + 0.1 * rng.normal()
    preview_depth = 0.5 + 0.5 * (k - 1) + 0.1 * rng.normal()
    delta = preview_depth - depth
    return [
        depth,
        float(np.clip(0.6 + 0.05 * k - 0.1 * calls + 0.05 * rng.normal(), 0, 1)),
        -0.6 * (k - 1) - 0.4 * gain + 0.1 * rng.normal(),
        float(min(10, 1 + 3 * (k - 1))),
        float(10 * (k - 1) + 5 * calls) + rng.normal(),
        -0.5 * (k - 1) - 0.5 * gain + 0.1 * rng.normal(),
        float(np.clip(0.7 - 0.1 * calls + 0.05 * rng.normal(), 0, 1)),
        float(np.clip(0.2 + 0.05 * k + 0.05 * rng.normal(), 0, 1)),
        delta,
        max(0.0, -delta),
    ]


def synthetic_tables(
    n_reports: int = 6, depth: int = 5, seed: int = 0, planted: str | None = None
) -> tuple[pa.Table, pa.Table]:
    """(actions, trajectories) with features.collect_schemas' specs; see the module doc for planted."""
    rng = np.random.default_rng(seed)
    slot = SIGNAL_NAMES.index(planted) if planted is not None else None
    actions, trajectories = [], []
    for r in range(n_reports):
        key = {"report_id": f"pair{r % 3}/ds{r // 3}", "pair_id": f"pair{r % 3}", "dataset_id": f"ds{r // 3}"}
        target_ms = float(rng.uniform(20, 70))
        mid_ms = float(rng.uniform(2, 12))
        quality = float(rng.uniform(0.1, 1.2))
        gain = quality * mid_ms / 6
        a0 = float(rng.uniform(0.8, 2.0))
        prompt_tokens = int(rng.integers(50, 300))
        context = [math.log1p(prompt_tokens), target_ms, mid_ms, math.log(target_ms / mid_ms)]
        mid_lag = 1 + prompt_tokens % 7  # tokens the mid drafter's cache lacks at a round's start
        for sid in range(2**depth):
            bits = schedule_bits(sid, depth)
            a, latency = _outcome(bits, gain, a0, target_ms, mid_ms)
            a += 0.03 * rng.normal()
            tput = 1000 * (a + 1) / latency
            calls = sum(bits)
            text = "".join("1" if b else "0" for b in bits)
            trajectories.append(
                {
                    **key,
                    "schedule_id": sid,
                    "schedule": text,
                    "mode": "replay",
                    "profile_id": f"{key['pair_id']}@cpu",
                    "n_prompts": 2,
                    "n_rounds": 20,
                    "n_tokens": round(20 * (a + 1)),
                    "mean_accepted_length": a,
                    "round_latency_ms": latency,
                    "throughput_tok_per_s": tput,
                    "tokens_per_round": a + 1,
                    "n_small_steps": 20 * (depth - calls),
                    "n_mid_calls": 20 * calls,
                    "mid_tokens": 20 * calls * 50,
                    "mid_catch_up_tokens": 20 * 3 if calls else 0,
                    "verified_nodes": 20 * 64,
                    "mid_call_tokens": [50] * (20 * calls),
                    "verified_nodes_per_round": [64] * 20,
                    "prompt_n_tokens": [round(10 * (a + 1))] * 2,
                    "prompt_latency_ms": [10 * latency] * 2,
                    "measured_round_latency_ms": math.nan,
                    "measured_throughput_tok_per_s": math.nan,
                }
            )
            for k in range(1, depth + 1):
                signals = _signals(rng, k, bits[: k - 1], gain if slot is None else 0.0)
                if slot is not None:
                    signals[slot] = quality
                actions.append(
                    {
                        **key,
                        "schedule_id": sid,
                        "step": k,
                        "is_invoke": bits[k - 1],
                        "prefix": text[: k - 1],
                        "suffix": text[k:],
                        **dict(zip(CONTEXT_NAMES, context, strict=True)),
                        **dict(
                            zip(
                                history_names(depth),
                                history_features(k, depth, bits[: k - 1], mid_lag, 0.0),
                                strict=True,
                            )
                        ),
                        **dict(zip(SIGNAL_NAMES, signals, strict=True)),
                        "mean_accepted_length": a,
                        "round_latency_ms": latency,
                        "throughput_tok_per_s": tput,
                    }
                )
    return to_table(actions_spec(depth), actions), to_table(TRAJECTORIES, trajectories)


def write_synthetic_collect(
    out_dir: Path, n_reports: int = 6, depth: int = 5, seed: int = 0, planted: str | None = None
) -> None:
    """actions, trajectories and rounds .parquet under out_dir, as the collect stage writes them."""
    actions, trajectories = synthetic_tables(n_reports, depth, seed, planted)
    write_table(out_dir / "actions.parquet", actions_spec(depth), actions)
    write_table(out_dir / "trajectories.parquet", TRAJECTORIES, trajectories)
    write_table(
        out_dir / "rounds.parquet", rounds_spec(depth), synthetic_rounds(actions, trajectories, depth, seed)
    )
