"""The decoder feeds an exported student exactly the round-level states it was trained on.

A replay collect of tiny zoo-like models writes the round table; features/round_states.py turns it
into round-level states; a student fitted on them is exported and loaded like the decoder loads
it; real decoding with it records every 17-dim vector the runtime feeds the MLP. At every round
start both hold, for every bit prefix the student took there, the vectors must agree in all 17.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from conftest import noisy_copy, repeated_prompts, tiny_model
from test_latency import linear_profile

from collectors.collect.execute import execute_prompt
from collectors.collect.records import runtime_for
from collectors.collect.report import ReportSpec, collect_report
from config.params import TrainConfig
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.outcome import first_round_start
from decoder.core.policies import schedule_bits
from decoder.core.state import CONTEXT_NAMES, LOOKAHEAD_NAME, history_names, state_feature_names
from decoder.deploy.latency import price_round
from decoder.deploy.scheduler import build_manifest, load_scheduler, write_artifact
from decoder.generate import generate
from decoder.models.pair import make_pair
from features.round_states import feature_matrix, report_context, round_states
from models.cross_fit import StudentSpec, fit_student
from models.mlp import mlp_arrays
from models.student import HEAD

DEPTH = 5
SIGNALS = (
    "frontier_mean_depth",
    "frontier_leaf_ratio",
    "preview_collapse_debt",
    "preview_history_share",
    "preview_overlap_ratio",
    "preview_mean_score",
)
FAST = TrainConfig(epochs=20, batch_size=64, lr=0.01, weight_decay=0.0, seed=0)


def _prompts(n: int, seed: int) -> list[list[int]]:
    return repeated_prompts(n, seed, base=(5, 14), cut=(12, 40))


# (tree, replay batch rows): the default tree replayed one start at a time, and the real pair's
# narrow tree (profiles/real-pair.yaml: W x m = 2 x 2, n-gram matches >= 2) replayed batched
SHAPES = {
    "default": (TreeConfig(), 0),
    "narrow-batched": (TreeConfig(width=2, topk=2, budget=13, ngram_min_n=2), 64),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def collected(request):
    tree, batch_rows = SHAPES[request.param]
    target = tiny_model("qwen3", seed=91)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=92), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=24, tree=tree)
    profile = linear_profile()
    prompts = _prompts(3, seed=93)
    spec = ReportSpec("tiny", "toy", 0, len(prompts))
    tables = collect_report(
        spec, pair, prompts, profile, config, "replay", False, round_table_stride=1, batch_rows=batch_rows
    )
    folds = pl.DataFrame({"report_id": [spec.report_id], "fold_id": [0]})
    states = round_states(tables.rounds, report_context(tables.actions, folds), DEPTH)
    return pair, config, profile, prompts, states, tables.rounds


def _export(states: pl.DataFrame, path, width: int) -> None:
    names = state_feature_names(DEPTH, SIGNALS)
    z, margin = feature_matrix(states, names), states["margin_relative"].to_numpy()
    spec = StudentSpec("weighted_logistic", (64, 32), FAST, 0.0, nested_threshold=False)
    st = fit_student(z, margin, np.ones(len(z), dtype=bool), spec)
    # A threshold at the median score: the student invokes at about half the states, so rounds
    # mix small and mid steps and the comparison covers prefixes with and without mid calls.
    threshold = float(np.median(st.score(z)))
    manifest = build_manifest(
        kind="student",
        depth=DEPTH,
        width=width,
        feature_names=names,
        input_names=names,
        x_mean=st.x_std.mean,
        x_std=st.x_std.std,
        heads={HEAD: st.module.sizes},
        y_mean={HEAD: 0.0},
        y_std={HEAD: 1.0},
        threshold=threshold,
        signals=list(SIGNALS),
    )
    write_artifact(path, manifest, mlp_arrays(HEAD, st.module.net))


def test_runtime_vectors_equal_the_round_states(collected, tmp_path):
    pair, config, profile, prompts, states, _ = collected
    _export(states, tmp_path / "student", config.tree.width)
    sched = load_scheduler(tmp_path / "student", DEPTH, config.tree.width)
    names = state_feature_names(DEPTH, SIGNALS)
    lag_col = names.index("log_mid_lag")
    look_col = names.index(LOOKAHEAD_NAME)
    n_context = len(CONTEXT_NAMES) + len(history_names(DEPTH))
    table = {
        (p, s, k, prefix): row
        for p, s, k, prefix, row in zip(
            states["prompt_id"],
            states["start_position"],
            states["step"],
            states["prefix"],
            feature_matrix(states, names),
            strict=True,
        )
    }
    compared, with_mid, later_starts, looked = 0, 0, 0, 0
    for p_id, prompt in enumerate(prompts):
        seen: list[tuple[int, tuple[bool, ...], np.ndarray]] = []
        features = sched.features

        def spy(ctx, features=features, seen=seen):
            z = features(ctx)
            seen.append((ctx.step, ctx.history, z))
            return z

        sched.features = spy  # type: ignore[method-assign]
        # The runtime context of this prompt: its own length and the pair's profiled timings.
        res = generate(pair, prompt, sched, config, runtime=runtime_for(profile, len(prompt), config.tree))
        sched.features = features  # type: ignore[method-assign]
        assert len(seen) == DEPTH * len(res.rounds)
        start = first_round_start(prompt)
        for r, rnd in enumerate(res.rounds):
            for step, history, z in seen[DEPTH * r : DEPTH * (r + 1)]:
                prefix = "".join("1" if b else "0" for b in history)
                want = table.get((p_id, start, step, prefix))
                if want is None:  # a start no fixed schedule's trajectory reaches: not in the table
                    continue
                compared += 1
                later_starts += start != first_round_start(prompt)
                # context (prompt length, timings) and history bits: exactly the same numbers
                same = [j for j in range(n_context) if j not in (lag_col, look_col)]
                assert z[same].tolist() == want[same].tolist(), (p_id, start, step, prefix)
                # the n-gram lookahead: the same match lengths over the same frontier, stored as
                # float32 with the round's signals
                assert np.float32(z[look_col]) == want[look_col], (p_id, start, step, prefix)
                looked += z[look_col] > 0
                # The lag: online it is this student's own (its mid cache lags by what it skipped);
                # the table holds one per start, the median over the fixed schedules arriving there
                # (they arrive with different lags). They agree by construction at the prompt's
                # first start (nothing has run: the whole context) and once the prefix has called
                # the mid drafter (caught up: 0).
                if start == first_round_start(prompt) or any(history):
                    assert z[lag_col] == want[lag_col], (p_id, start, step, prefix)
                # tree signals: stored as float32 in the round table. Before any mid call this round
                # both trees are the same n-gram tree, scored with the target's rows, which the
                # decoder gets from its verify forwards and the replay from one causal forward over
                # the text: equal to a float32 ulp or so. After a mid call, the replay scored the tree
                # in one batched mid forward, the decoder incrementally: equal up to float rounding.
                got, ref = z[n_context:].astype(np.float32).astype(np.float64), want[n_context:]
                if any(history):
                    with_mid += 1
                    assert got == pytest.approx(ref, rel=1e-5, abs=1e-6), (p_id, start, step, prefix)
                else:
                    assert got == pytest.approx(ref, rel=2e-7, abs=1e-7), (p_id, start, step, prefix)
            start += rnd.emitted
    assert compared >= 3 * DEPTH and with_mid > 0 and later_starts > 0, (compared, with_mid, later_starts)
    assert 0 < looked < compared, (looked, compared)  # the lookahead varies: matches and none


def test_round_table_prices_a_round_as_execute_mode_pays_it_at_that_lag(collected):
    """Where a fixed schedule's real trajectory passes a round-table start with the lag and the
    prompt-row blocks to compute the table holds there, the table's round latency is that real
    round's price (catch-up and the blocks included), and its catch_up_ms what the catch-up adds."""
    pair, config, profile, prompts, _, rounds = collected
    table = {
        (p, s, sid): ((lag, blocks), (ms, catch_up))
        for p, s, sid, lag, blocks, ms, catch_up in zip(
            *(
                rounds.column(c).to_pylist()
                for c in ("prompt_id", "start_position", "schedule_id", "mid_lag", "prompt_blocks")
            ),
            rounds.column("round_latency_ms").to_pylist(),
            rounds.column("catch_up_ms").to_pylist(),
            strict=True,
        )
    }
    matched = caught_up = 0
    for sid in (21, 31):  # 10101 and All-Mid: mid calls in every round
        bits = schedule_bits(sid, DEPTH)
        for p_id, prompt in enumerate(prompts):
            records, _ = execute_prompt(pair, prompt, bits, config)
            start = first_round_start(prompt)
            for rec in records:
                lag, (ms, catch_up) = table.get((p_id, start, sid), (None, (None, None)))
                if lag == (rec.mid_lag, rec.prompt_blocks):
                    matched += 1
                    caught_up += rec.mid_catch_up > 0
                    assert ms == pytest.approx(price_round(profile, rec.counts()), rel=1e-12)
                    # the catch-up's part: the round less the same round arriving caught up
                    without = price_round(profile, replace(rec, mid_catch_up=0).counts())
                    assert catch_up == pytest.approx(ms - without, rel=1e-9, abs=1e-12)
                    assert (catch_up > 0) == (rec.mid_catch_up > 0)
                start += rec.emitted
    assert matched >= 4 and caught_up >= 1, (matched, caught_up)
