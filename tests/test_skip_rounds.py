"""The student's cross-round backoff (manifest ``skip_rounds_max`` = c): rounds skipped whole.

After k idle rounds in a row in which it decided (no decided score above threshold - h, h the
manifest's ``skip_rounds_margin``, 0 by default: no mid call), the student skips the next
min(2^k - 1, c) rounds without deciding; an engaged round resets k, a new generation resets
everything. Checked here: the scheduler's rounds against sequences written out by hand, the
decoder against the policy replay round by round, the offline walk that chooses c against a walk
priced by hand, and the manifest field's refusals.
"""

from __future__ import annotations

import json
import random
import re

import numpy as np
import polars as pl
import pytest
from conftest import noisy_copy, tiny_model
from test_policy_replay import _prompts
from test_scheduler_export import student_artifact
from test_skip_rest import RUNTIME, _ctx, _round_set, _tables

from collectors.collect.policy_replay import replay_policy
from collectors.collect.replay import Replayer
from decoder.core.config import DecodeConfig
from decoder.core.policies import RoundBackoff, schedule_bits, start_generation
from decoder.deploy.artifact import ManifestError
from decoder.deploy.latency import counts_from_round
from decoder.deploy.scheduler import LearnedScheduler, load_scheduler
from decoder.generate import generate
from decoder.models.pair import make_pair
from features.round_states import backoff_walk_pct, priced_walk_pct
from models import gate as gate_rules

LOW, HIGH = -5.0, 5.0  # scores far below / above the threshold 0.5
NEAR = 0.2  # below the threshold 0.5, but within a margin of 1


def _scheduler(tmp_path, **extra) -> tuple[LearnedScheduler, list[float], list[int]]:
    """A loaded student whose net returns ``score[0]`` and whose features are counted."""
    _, path = student_artifact(tmp_path / "s", threshold=0.5, **extra)
    sched = load_scheduler(path, 5, 10)
    score, asked = [LOW], [0]

    def features(ctx) -> np.ndarray:
        asked[0] += 1
        return np.zeros(17)

    sched.net, sched.features = (lambda z: score[0]), features
    return sched, score, asked


def _rounds(sched: LearnedScheduler, score: list[float], scores: list[float]) -> list[int]:
    """Run one 5-step round per entry of ``scores``; the decisions taken in each round."""
    counts = []
    for s in scores:
        score[0] = s
        decided = 0
        for step in range(1, 6):
            invoked = sched(_ctx(step))
            decided += sched.decided
            assert not (invoked and not sched.decided), "a step that did not decide invoked"
        counts.append(decided)
    return counts


def test_backoff_skips_1_then_3_rounds_and_an_invoking_round_resets(tmp_path) -> None:
    sched, score, asked = _scheduler(tmp_path, skip_rest_below=0.0, skip_rounds_max=3)
    scores = [LOW, HIGH, *[LOW] * 12, HIGH, *[LOW] * 7]  # round 2 is skipped: its HIGH is never seen
    got = _rounds(sched, score, scores)
    #        idle skip idle skip x3    idle skip x3   idle skip x3   invoke idle skip idle
    assert got == [1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 5, 1, 0, 1, 0, 0, 0, 1]
    assert asked[0] == sum(got)  # a skipped step computes no features


def test_a_round_within_the_idle_margin_is_not_idle(tmp_path) -> None:
    scores = [LOW, LOW, NEAR, NEAR, LOW, LOW, LOW, *[LOW] * 3, NEAR]
    sched, score, _ = _scheduler(tmp_path, skip_rest_below=0.0, skip_rounds_max=3, skip_rounds_margin=1.0)
    #                      idle skip near near idle skip idle skip x3  near: a NEAR round resets k
    assert _rounds(sched, score, scores) == [1, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1]
    sched, score, _ = _scheduler(tmp_path, skip_rest_below=0.0, skip_rounds_max=3)  # h = 0: NEAR is idle
    assert _rounds(sched, score, scores) == [1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    for i, bad in enumerate((-0.5, float("nan"), "1")):
        with pytest.raises(ManifestError, match="skip_rounds_margin"):
            student_artifact(tmp_path / f"bad{i}", skip_rounds_margin=bad)


def test_a_new_generation_starts_the_backoff_afresh(tmp_path) -> None:
    sched, score, _ = _scheduler(tmp_path, skip_rest_below=0.0, skip_rounds_max=3)
    assert _rounds(sched, score, [LOW] * 7) == [1, 0, 1, 0, 0, 0, 1]  # 3 rounds to skip next
    start_generation(sched)
    assert _rounds(sched, score, [LOW] * 7) == [1, 0, 1, 0, 0, 0, 1]
    # mid-skip-run too: two rounds into a 3-round skip-run
    assert _rounds(sched, score, [LOW] * 2) == [0, 0]
    start_generation(sched)
    assert _rounds(sched, score, [LOW] * 3) == [1, 0, 1]


def test_without_the_field_every_round_decides(tmp_path) -> None:
    sched, score, _ = _scheduler(tmp_path, skip_rest_below=0.0)
    assert sched.skip_rounds_max == 0
    assert _rounds(sched, score, [LOW] * 6) == [1] * 6
    sched, score, _ = _scheduler(tmp_path, skip_rounds_max=0)
    assert _rounds(sched, score, [LOW] * 4) == [5] * 4  # no gate either: every step decides


def test_the_cap_bounds_the_skip_runs() -> None:
    for cap, runs in ((1, [1, 1, 1, 1]), (7, [1, 3, 7, 7]), (5, [1, 3, 5, 5]), (15, [1, 3, 7, 15])):
        b, seen, n = RoundBackoff(cap), [], 0
        while len(seen) < 4:  # every deciding round is idle: lengths of the skip-runs after each
            if b.start_round():
                n += 1
            else:
                if n:
                    seen.append(n)
                n = 0
        assert seen == runs, cap
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="skip_rounds_max"):
            RoundBackoff(bad)  # type: ignore[arg-type]


def test_the_field_is_checked_and_tamper_is_refused(tmp_path) -> None:
    for i, bad in enumerate((-1, 1.5, True, "3")):
        with pytest.raises(ManifestError, match=r"'skip_rounds_max': must be an integer >= 0"):
            student_artifact(tmp_path / f"bad{i}", skip_rounds_max=bad)
    _, path = student_artifact(tmp_path / "ok", skip_rounds_max=3)
    assert load_scheduler(path, 5, 10).skip_rounds_max == 3
    original = json.loads(path.read_text())
    for bad in (-1, 1.5, True, "3"):
        path.write_text(json.dumps({**original, "skip_rounds_max": bad}))
        with pytest.raises(ManifestError, match=re.escape(f"{path}: field 'skip_rounds_max'")):
            load_scheduler(path, 5, 10)
    path.write_text(json.dumps({**original, "skip_rounds_max": 7}))  # valid, but not what was written
    with pytest.raises(ManifestError, match="manifest_sha256"):
        load_scheduler(path, 5, 10)


def test_decoding_and_replay_skip_the_same_rounds(tmp_path) -> None:
    target = tiny_model("qwen3", seed=81)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=82), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=32)
    _, path = student_artifact(tmp_path / "s", seed=4, y_mean=-0.35, threshold=-0.54, skip_rounds_max=3)
    replayer = Replayer(pair, config, [schedule_bits(s, 5) for s in range(32)], round_table_stride=0)
    live = load_scheduler(path, 5, 10)  # one object for every prompt: generate must reset it
    shared = load_scheduler(path, 5, 10)  # the replay's, also one for every prompt
    per_round, invoking = [], 0
    for prompt in _prompts(3, seed=83):
        res = generate(pair, prompt, live, config, runtime=RUNTIME)
        assert res.new_tokens == generate(pair, prompt, "ar", config).new_tokens  # still lossless
        fresh = replay_policy(replayer, replayer.inputs(prompt), load_scheduler(path, 5, 10), RUNTIME)
        again = replay_policy(replayer, replayer.inputs(prompt), shared, RUNTIME)
        assert len(res.rounds) == len(fresh.rounds) == len(again.rounds)
        for real, rep, rep2, bits in zip(res.rounds, fresh.rounds, again.rounds, fresh.bits, strict=True):
            counts = counts_from_round(real)
            assert counts.decisions == rep.counts().decisions == rep2.counts().decisions
            assert counts.mid_call_tokens == rep.counts().mid_call_tokens == rep2.counts().mid_call_tokens
            assert tuple(s.used_mid for s in real.steps) == bits
            assert counts.decisions in (0, 5)  # no gate: a round decides every step or none
            per_round.append(counts.decisions)
            invoking += any(bits)
    assert 0 in per_round and 5 in per_round, "the backoff never fired: the test would not tell"
    assert invoking, "no round invoked: the reset by an invoking round is not exercised"


def _prompt_tables(
    rng: random.Random,
    n_starts: int,
    invoke_at: set[int],
    depth: int = 3,
    near_at: frozenset[int] = frozenset(),
):
    """One report, two prompts of ``n_starts`` starts each; every score is far below the threshold
    except at the starts ``invoke_at`` (indices within each prompt), where every step invokes, and
    ``near_at``, where every score is NEAR (below the threshold, within 1 of it)."""
    out, st = [], []
    for prompt in (0, 1):
        for i in range(n_starts):
            start = 10 * i + 3
            for sid in range(2**depth):
                out.append(("r", prompt, start, sid, rng.randrange(0, 6), rng.uniform(5, 9), 0.4, 0.3))
            for k in range(1, depth + 1):
                for p in range(2 ** (k - 1)):
                    prefix = format(p, f"0{k - 1}b") if k > 1 else ""
                    score = HIGH if i in invoke_at else NEAR if i in near_at else LOW
                    st.append(("r", prompt, start, k, prefix, score, 0.5))
    outcomes = pl.DataFrame(
        out, orient="row",
        schema=["report_id", "prompt_id", "start_position", "schedule_id", "accepted", "round_latency_ms",
                "decision_ms", "decision_cold_ms"],
    ).with_columns(pl.col("schedule_id").cast(pl.Int16))  # fmt: skip
    states = pl.DataFrame(
        st, orient="row",
        schema=["report_id", "prompt_id", "start_position", "step", "prefix", "score", "threshold"],
    )  # fmt: skip
    return outcomes, states.sample(fraction=1.0, shuffle=True, seed=3)  # the walk must sort the starts


def _priced_by_hand(outcomes: pl.DataFrame, plays: list[tuple[int, int]], depth: int = 3) -> float:
    """One report's round oracle's ms per token summed over the starts / the walk's, in %; start i
    of each prompt playing plays[i] = (schedule id, decisions)."""
    oracle = walked = 0.0
    for prompt in (0, 1):
        rows = outcomes.filter(pl.col("prompt_id") == prompt).sort("start_position", "schedule_id")
        for i, (sid, n) in enumerate(plays):
            r = rows.slice(i * 2**depth, 2**depth).to_dicts()

            def ms_per_token(o: dict, n: int) -> float:  # the round table prices depth decisions
                cold = 0.0 if n else o["decision_cold_ms"]  # once per round that decides
                return (o["round_latency_ms"] - (depth - n) * o["decision_ms"] - cold) / (o["accepted"] + 1)

            oracle += min(ms_per_token(o, 0) for o in r)
            walked += ms_per_token(r[sid], n)
    return 100 * oracle / walked


def test_backoff_walk_with_cap_0_is_the_priced_walk() -> None:
    rng = random.Random(11)
    for _ in range(4):
        out, st = _tables(rng)
        for gate in (None, 0.0, 0.8):
            assert backoff_walk_pct(out, st, 3, gate, 0) == pytest.approx(priced_walk_pct(out, st, 3, gate))


def test_backoff_walk_skips_starts_in_order_and_per_prompt() -> None:
    out, st = _prompt_tables(random.Random(7), 8, invoke_at=set())
    # all idle, no gate: a deciding start takes 3 decisions and reaches 000
    no_backoff = backoff_walk_pct(out, st, 3, None, 0)
    assert no_backoff == pytest.approx(_priced_by_hand(out, [(0, 3)] * 8))
    plays = [(0, 3), (0, 0), (0, 3), (0, 0), (0, 0), (0, 0), (0, 3), (0, 0)]  # c = 3: skip 1, then 3
    backed = backoff_walk_pct(out, st, 3, None, 3)
    assert backed == pytest.approx(_priced_by_hand(out, plays))  # both prompts start afresh
    assert backed > no_backoff  # fewer decisions on an all-idle report
    # a start inside a skip-run plays 000 with no decisions, however high its scores
    out, st = _prompt_tables(random.Random(8), 6, invoke_at={1, 4})
    plays = [(0, 3), (0, 0), (0, 3), (0, 0), (7, 3), (0, 3)]  # c = 1: skip 1 after each idle start
    assert backoff_walk_pct(out, st, 3, None, 1) == pytest.approx(_priced_by_hand(out, plays))
    plays = [(0, 1), (7, 3), (0, 1), (0, 1), (7, 3), (0, 1)]  # c = 0 with the gate at 0: stop at 1
    assert backoff_walk_pct(out, st, 3, 0.0, 0) == pytest.approx(_priced_by_hand(out, plays))


def test_backoff_walk_counts_a_start_within_the_margin_as_engaged() -> None:
    out, st = _prompt_tables(random.Random(9), 6, invoke_at=set(), near_at=frozenset({2, 3}))
    # c = 1, h = 1: the NEAR starts 2 and 3 reach 000 but are not idle, so start 3 is not skipped
    plays = [(0, 3), (0, 0), (0, 3), (0, 3), (0, 3), (0, 0)]
    assert backoff_walk_pct(out, st, 3, None, 1, 1.0) == pytest.approx(_priced_by_hand(out, plays))
    plays = [(0, 3), (0, 0), (0, 3), (0, 0), (0, 3), (0, 0)]  # h = 0: start 2 is idle, 3 skipped
    assert backoff_walk_pct(out, st, 3, None, 1) == pytest.approx(_priced_by_hand(out, plays))
    # a margin below NEAR's gap (0.3) leaves it idle; one just above it does not
    assert backoff_walk_pct(out, st, 3, None, 1, 0.29) == pytest.approx(_priced_by_hand(out, plays))
    assert backoff_walk_pct(out, st, 3, None, 1, 0.31) != pytest.approx(_priced_by_hand(out, plays))


def test_a_backoff_walk_that_cannot_tell_two_caps_apart_takes_the_larger(monkeypatch) -> None:
    """Equal walks (a prompt's walk too short for a longer skip-run to show) go to the larger cap,
    then the smaller margin; a strictly better walk wins whatever its cap."""

    def walks(table):
        monkeypatch.setattr(gate_rules, "_gap_quantiles", lambda states: [1.0, 2.0])
        monkeypatch.setattr(
            gate_rules,
            "backoff_walk_pct",
            lambda outcomes, states, depth, gate, c, h, max_target_ms: table.get((c, h), 50.0),
        )
        return gate_rules.choose_skip_rounds(
            pl.DataFrame(), _round_set(pl.DataFrame()), 3, gate_rules.Gate()
        )[:2]

    assert walks({(7, 2.0): 60.0, (15, 2.0): 60.0, (15, 1.0): 60.0, (3, 2.0): 59.9}) == (15, 1.0)
    assert walks({(3, 2.0): 60.0 + 1e-9, (7, 2.0): 60.0, (15, 2.0): 60.0}) == (3, 2.0)
    assert walks({(0, 0.0): 51.0}) == (0, 0.0)
