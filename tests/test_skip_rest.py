"""The student's skip-the-rest-of-the-round rule: decided steps, pricing and the offline walk.

A score below threshold - skip_rest_below skips every later step of the round without deciding;
the decoder records which steps were decided, the pricing charges only those, the replay that
prices held-back prompts counts the same, and the decision-priced walk that chooses the gate
offline reproduces a step-by-step walk written out here.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import polars as pl
import pytest
from conftest import noisy_copy, tiny_model
from test_policy_replay import _prompts
from test_scheduler_export import student_artifact

from collectors.collect.policy_replay import replay_policy
from collectors.collect.replay import Replayer
from decoder.core.config import DecodeConfig
from decoder.core.policies import RuntimeContext, StepContext, schedule_bits
from decoder.deploy.artifact import ManifestError
from decoder.deploy.latency import counts_from_round
from decoder.deploy.scheduler import load_scheduler
from decoder.generate import generate
from decoder.models.pair import make_pair
from features.round_states import fixed_schedule_pct, fixed_schedules_pct_by_report, priced_walk_pct
from models import gate as gate_rules
from models.round_walks import RoundSet

RUNTIME = RuntimeContext(prompt_tokens=20, target_ms=2.0, mid_ms=1.0)


class Scripted:
    """Stands in for the MLP and the features: the scores of successive decisions, counted."""

    def __init__(self, scores: list[float]) -> None:
        self.scores, self.asked = list(scores), 0

    def features(self, ctx: StepContext) -> np.ndarray:
        self.asked += 1
        return np.zeros(17)

    def net(self, z: np.ndarray) -> float:
        return self.scores.pop(0)


def _ctx(step: int, runtime: RuntimeContext = RUNTIME) -> StepContext:
    return StepContext(step, 5, (), None, runtime)  # type: ignore[arg-type]  # unused by the script


def test_a_low_score_skips_the_rest_of_the_round_without_deciding(tmp_path) -> None:
    _, path = student_artifact(tmp_path / "s", threshold=0.5, skip_rest_below=1.0)
    sched = load_scheduler(path, 5, 10)
    script = Scripted([0.9, 0.0, -0.7, 0.2])  # invoke, skip (above 0.5 - 1), skip and stop; round 2
    sched.net, sched.features = script.net, script.features
    answers = []
    for step in range(1, 6):
        answers.append((sched(_ctx(step)), sched.decided))
    assert answers == [(True, True), (False, True), (False, True), (False, False), (False, False)]
    assert script.asked == 3  # no features computed for the skipped steps
    assert (sched(_ctx(1)), sched.decided) == (False, True)  # a new round decides again
    assert script.asked == 4


def test_the_gate_is_a_checked_manifest_field(tmp_path) -> None:
    _, path = student_artifact(tmp_path / "s")
    sched = load_scheduler(path, 5, 10)
    assert sched.skip_rest_below is None  # absent: every step decides
    assert sched.skip_rest_max_target_ms is None  # absent: the gate applies at any target_ms
    for i, bad in enumerate((-0.5, float("nan"), "1")):
        with pytest.raises(ManifestError, match="skip_rest_below"):
            student_artifact(tmp_path / f"bad{i}", skip_rest_below=bad)
    for i, bad in enumerate((0.0, -3.0, float("inf"), "5")):
        with pytest.raises(ManifestError, match="skip_rest_max_target_ms"):
            student_artifact(tmp_path / f"cap{i}", skip_rest_below=1.0, skip_rest_max_target_ms=bad)


def test_the_gate_applies_only_up_to_its_target_ms(tmp_path) -> None:
    _, path = student_artifact(
        tmp_path / "s", threshold=0.5, skip_rest_below=1.0, skip_rest_max_target_ms=10.0
    )
    for target_ms, gated in ((2.0, True), (10.0, True), (10.5, False), (40.0, False)):
        runtime = RuntimeContext(prompt_tokens=20, target_ms=target_ms, mid_ms=1.0)
        sched = load_scheduler(path, 5, 10)
        script = Scripted([-0.7, 0.9, 0.0, 0.2, -0.9])  # step 1 far below threshold - 1
        sched.net, sched.features = script.net, script.features
        answers = [(sched(_ctx(step, runtime)), sched.decided) for step in range(1, 6)]
        if gated:  # the rest of the round skipped without deciding
            assert answers == [(False, True)] + [(False, False)] * 4 and script.asked == 1
        else:  # every step decides, as without a gate
            assert answers == [(False, True), (True, True), (False, True), (False, True), (False, True)]
            assert script.asked == 5


@pytest.mark.parametrize("gate", [None, 0.01])
def test_decoding_counts_and_replay_count_the_decisions_taken(tmp_path, gate) -> None:
    target = tiny_model("qwen3", seed=81)
    pair = make_pair(target, noisy_copy(target, 0.3, seed=82), eos_token_ids=(0,))
    config = DecodeConfig(max_new_tokens=24)
    extra = {} if gate is None else {"skip_rest_below": gate}
    # with this random student and threshold the gated rounds stop after 1 to 4 decisions
    _, path = student_artifact(tmp_path / "s", seed=4, y_mean=-0.35, threshold=-0.6, **extra)
    replayer = Replayer(pair, config, [schedule_bits(s, 5) for s in range(32)], round_table_stride=0)
    per_round = []
    for prompt in _prompts(3, seed=83):
        live, replayed = load_scheduler(path, 5, 10), load_scheduler(path, 5, 10)
        res = generate(pair, prompt, live, config, runtime=RUNTIME)
        assert res.new_tokens == generate(pair, prompt, "ar", config).new_tokens  # still lossless
        traj = replay_policy(replayer, replayer.inputs(prompt), replayed, RUNTIME)
        for real, rep in zip(res.rounds, traj.rounds, strict=True):
            decided = [s.decided for s in real.steps]
            n = sum(decided)
            assert decided == [True] * n + [False] * (5 - n)  # undecided steps only at the end
            assert not any(s.used_mid for s in real.steps[n:])  # and they skip
            assert counts_from_round(real).decisions == n == rep.counts().decisions
            per_round.append(n)
    if gate is None:
        assert set(per_round) == {5}
    else:
        assert len(set(per_round)) > 1 and max(per_round) < 5, "the gate fired alike in every round"


TARGET_MS = {"r1": 1.5, "r2": 40.0}  # a cheap pair's report and an expensive one's


def _tables(rng: random.Random, depth: int = 3):
    starts = [("r1", 0, 0), ("r1", 0, 7), ("r2", 1, 0)]
    outcomes, states = [], []
    for report, prompt, start in starts:
        for sid in range(2**depth):
            outcomes.append((report, prompt, start, sid, rng.randrange(0, 6), rng.uniform(5, 9), 0.4, 0.3))
        for k in range(1, depth + 1):
            for prefix in itertools.product("01", repeat=k - 1):
                states.append(
                    (report, prompt, start, k, "".join(prefix), rng.uniform(-2, 2), 0.25, TARGET_MS[report])
                )
    out = pl.DataFrame(
        outcomes,
        schema=["report_id", "prompt_id", "start_position", "schedule_id", "accepted", "round_latency_ms",
                "decision_ms", "decision_cold_ms"], orient="row",
    )  # fmt: skip
    st = pl.DataFrame(
        states,
        schema=["report_id", "prompt_id", "start_position", "step", "prefix", "score", "threshold",
                "target_ms"],
        orient="row",
    )  # fmt: skip
    return out.with_columns(pl.col("schedule_id").cast(pl.Int16)), st


def _by_hand(
    out: pl.DataFrame, st: pl.DataFrame, depth: int, gate: float | None, cap: float | None = None
) -> float:
    row = {
        (r["report_id"], r["prompt_id"], r["start_position"], r["step"], r["prefix"]): r
        for r in st.to_dicts()
    }
    res = {(r["report_id"], r["prompt_id"], r["start_position"], r["schedule_id"]): r for r in out.to_dicts()}
    starts = sorted({k[:3] for k in res})
    pct: dict[str, list[float]] = {}  # report -> [oracle, walk] ms per token over its starts
    for s in starts:
        prefix, skipping, decisions = "", False, 0
        for k in range(1, depth + 1):
            if skipping:
                prefix += "0"
                continue
            r = row[(*s, k, prefix)]
            decisions += 1
            invoke = r["score"] > r["threshold"]
            prefix += "1" if invoke else "0"
            gated = gate is not None and (cap is None or TARGET_MS[s[0]] <= cap)
            skipping = gated and not invoke and r["score"] < r["threshold"] - gate
        sid = next(
            i
            for i in range(2**depth)
            if "".join("1" if b else "0" for b in schedule_bits(i, depth)) == prefix
        )

        def ms_per_token(i: int, n: int, s=s) -> float:
            o = res[(*s, i)]  # the round table prices depth decisions; one cold extra per deciding round
            cold = 0.0 if n else o["decision_cold_ms"]
            return (o["round_latency_ms"] - (depth - n) * o["decision_ms"] - cold) / (o["accepted"] + 1)

        # per report: (the oracle's ms per token, the walk's), each summed over the starts
        oracle, walked = pct.setdefault(s[0], [0.0, 0.0])
        pct[s[0]] = [
            oracle + min(ms_per_token(i, 0) for i in range(2**depth)),
            walked + ms_per_token(sid, decisions),
        ]
    return float(np.mean([100 * oracle / walked for oracle, walked in pct.values()]))


def test_priced_walk_matches_a_walk_written_out_step_by_step() -> None:
    rng = random.Random(5)
    for _ in range(5):
        out, st = _tables(rng)
        for gate in (None, 0.0, 0.8, 3.0):
            assert priced_walk_pct(out, st, 3, gate) == pytest.approx(_by_hand(out, st, 3, gate))
            for cap in (1.0, 1.5, 10.0, 40.0):  # the gate in neither report, in r1 only, in both
                got = priced_walk_pct(out, st, 3, gate, max_target_ms=cap)
                assert got == pytest.approx(_by_hand(out, st, 3, gate, cap))
            if gate is not None:
                assert priced_walk_pct(out, st, 3, gate, max_target_ms=1.0) == pytest.approx(
                    _by_hand(out, st, 3, None)
                )
        # a walk that never invokes and stops at step 1 is All-Small plus one decision's cost
        never = st.with_columns(score=pl.lit(-9.0))
        small = fixed_schedule_pct(out, 3, 0)
        stopped = priced_walk_pct(out, never, 3, 0.0)
        assert stopped < small  # the one decision costs something, All-Small pays none


def test_every_fixed_schedule_in_one_group_by_matches_sums_written_out() -> None:
    """The 2^D fixed schedules priced in one pass: per report, the oracle's ms per token summed
    over the starts / the schedule's, both without decisions, for every schedule; the mean over
    reports is fixed_schedule_pct; a start lacking a schedule is refused."""
    rng, depth = random.Random(11), 3
    for _ in range(4):
        out, _ = _tables(rng, depth)
        every = fixed_schedules_pct_by_report(out, depth)
        assert every.height == 2 * 2**depth
        res = {
            (r["report_id"], r["prompt_id"], r["start_position"], r["schedule_id"]): r for r in out.to_dicts()
        }

        def per_token(key, res=res) -> float:
            o = res[key]
            return (o["round_latency_ms"] - depth * o["decision_ms"] - o["decision_cold_ms"]) / (
                o["accepted"] + 1
            )

        starts = sorted({k[:3] for k in res})
        for sid in range(2**depth):
            by_report = {}
            for report in ("r1", "r2"):
                mine = [s for s in starts if s[0] == report]
                oracle = sum(min(per_token((*s, i)) for i in range(2**depth)) for s in mine)
                by_report[report] = 100 * oracle / sum(per_token((*s, sid)) for s in mine)
            rows = every.filter(pl.col("schedule_id") == sid).to_dicts()
            assert [r["report_id"] for r in rows] == ["r1", "r2"]
            assert {r["schedule"] for r in rows} == {
                "".join("1" if b else "0" for b in schedule_bits(sid, depth))
            }
            assert [r["pct"] for r in rows] == pytest.approx([by_report["r1"], by_report["r2"]])
            assert fixed_schedule_pct(out, depth, sid) == pytest.approx(np.mean(list(by_report.values())))
        assert every.group_by("report_id").agg(pl.col("pct").max())["pct"].max() <= 100 + 1e-9
    with pytest.raises(ValueError, match="lacks some"):
        fixed_schedules_pct_by_report(out.filter(pl.col("schedule_id") != 3), depth)


def _fake_walks(monkeypatch, by_gate: dict) -> None:
    """choose_skip_rest's walks replaced by per-report % given here (gate -> list over reports)."""
    monkeypatch.setattr(
        gate_rules, "_gap_quantiles", lambda states: sorted(g for g in by_gate if g is not None)
    )

    def walk(outcomes, states, depth, gate):
        pct = by_gate[gate]
        return pl.DataFrame({"report_id": [f"r{i:02d}" for i in range(len(pct))], "pct": pct})

    monkeypatch.setattr(gate_rules, "priced_walk_pct_by_report", walk)


def _round_set(outcomes: pl.DataFrame) -> RoundSet:
    """A RoundSet holding only ``outcomes``: all the gate and backoff choices read of it."""
    return RoundSet(pl.DataFrame(), np.zeros(0), np.zeros(0), outcomes)


def _choose(target_ms: list[float] | None = None):
    """choose_skip_rest on the faked walks; ``target_ms`` per report (default: one pair's cost)."""
    n = len(target_ms) if target_ms is not None else 30
    costs = target_ms if target_ms is not None else [2.0] * n
    states = pl.DataFrame({"report_id": [f"r{i:02d}" for i in range(n)], "target_ms": costs})
    return gate_rules.choose_skip_rest(states, _round_set(pl.DataFrame()), 3)


def test_a_gate_within_noise_of_deciding_every_step_is_taken(monkeypatch) -> None:
    rng = np.random.default_rng(0)
    gate = 70 + rng.normal(0, 3, 30)
    # deciding every step is ahead on the mean by 0.05 points, reports scattering by +-2: noise
    none = gate + rng.normal(0, 2, 30)
    none += 0.05 - (none - gate).mean()
    _fake_walks(monkeypatch, {None: none.tolist(), 4.0: gate.tolist()})
    g, walks, noise = _choose()
    assert walks["none"] > walks["4.0000"]  # the old rule (the best mean) took no gate
    assert g == gate_rules.Gate(4.0)
    assert noise["none_lead"] == pytest.approx(0.05) and noise["none_lead_se"] > 0.05
    assert noise["reports"] == 30


def test_deciding_every_step_wins_when_it_leads_on_every_report(monkeypatch) -> None:
    gate = [70.0 + i for i in range(10)]
    none = [v + 1.0 + 0.01 * (i % 3) for i, v in enumerate(gate)]  # +1 point everywhere, little spread
    _fake_walks(monkeypatch, {None: none, 2.0: [v - 5 for v in gate], 4.0: gate})
    g, _, noise = _choose([2.0] * 10)
    assert g == gate_rules.Gate() and g.below is None
    assert noise["none_lead"] == pytest.approx(1.01, abs=0.01)  # against the better gate, g = 4


def test_among_gates_the_best_mean_wins_and_ties_go_to_the_larger_gap(monkeypatch) -> None:
    base = [60.0, 70.0, 80.0]
    behind = [v - 1 for v in base]
    _fake_walks(monkeypatch, {None: behind, 1.0: base, 3.0: base, 0.5: [v - 0.5 for v in base]})
    assert _choose([2.0] * 3)[0] == gate_rules.Gate(3.0)
    _fake_walks(monkeypatch, {None: behind, 1.0: [v + 0.2 for v in base], 3.0: base})
    assert _choose([2.0] * 3)[0] == gate_rules.Gate(1.0)


def test_the_gate_is_limited_to_the_pairs_where_it_pays(monkeypatch) -> None:
    """Reports of three costs: the gate gains 5 points on the 1 ms reports, nothing at 4 ms, and
    loses 8 on the 40 ms ones; the whole gate loses on the mean, the capped one wins."""
    cost = [1.0] * 10 + [4.0] * 10 + [40.0] * 10
    none = [70.0 + (i % 7) for i in range(30)]
    gate = [v + (5.0 if c == 1.0 else 0.0 if c == 4.0 else -8.0) for v, c in zip(none, cost, strict=True)]
    _fake_walks(monkeypatch, {None: none, 2.0: gate})
    g, walks, noise = _choose(cost)
    assert walks["2.0000"] < walks["none"]  # the gate everywhere: 5 up, 8 down
    # candidate caps: the geometric midpoints 2 and sqrt(160) (then no cap); equal walks: the smaller
    assert walks["2.0000_upto_2.000ms"] == pytest.approx(walks["2.0000_upto_12.649ms"])
    assert g == gate_rules.Gate(2.0, 2.0) and g.key == "2.0000_upto_2.000ms"
    assert walks[g.key] == pytest.approx(walks["none"] + 5 / 3)
    assert noise["none_lead"] == pytest.approx(-5 / 3) and noise["reports"] == 30


def test_a_report_with_two_costs_is_refused(monkeypatch) -> None:
    _fake_walks(monkeypatch, {None: [70.0, 71.0], 2.0: [72.0, 73.0]})
    states = pl.DataFrame({"report_id": ["r00", "r00", "r01"], "target_ms": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match="more than one target_ms"):
        gate_rules.choose_skip_rest(states, _round_set(pl.DataFrame()), 3)


def test_the_gate_walks_are_the_priced_walks_per_report() -> None:
    out, st = _tables(random.Random(7))
    g, walks, noise = gate_rules.choose_skip_rest(st, _round_set(out), 3)
    assert walks["none"] == pytest.approx(_by_hand(out, st, 3, None))
    gates = gate_rules._gap_quantiles(st)
    cap = (1.5 * 40.0) ** 0.5  # between the two reports' costs
    assert len(walks) == 1 + 2 * len(gates) and len(gates) > 1
    for gap in gates:
        assert walks[f"{gap:.4f}"] == pytest.approx(_by_hand(out, st, 3, gap))
        assert walks[gate_rules.Gate(gap, cap).key] == pytest.approx(_by_hand(out, st, 3, gap, cap))
    assert noise["reports"] == 2
    assert g.key in walks


def test_a_gate_states_its_manifest_fields_and_rule_and_refuses_bad_values() -> None:
    """What export writes for each gate: nothing without one; g alone; g with its target_ms cap.
    The decoder reads these names (decoder.deploy.scheduler.LearnedScheduler)."""
    assert gate_rules.Gate().manifest_fields() == {} and gate_rules.Gate().rule_text() == ""
    assert gate_rules.Gate(0.5).manifest_fields() == {"skip_rest_below": 0.5}
    capped = gate_rules.Gate(0.5, 8.0)
    assert capped.manifest_fields() == {"skip_rest_below": 0.5, "skip_rest_max_target_ms": 8.0}
    assert "skip_rest_below" in capped.rule_text() and "skip_rest_max_target_ms" in capped.rule_text()
    assert "skip_rest_max_target_ms" not in gate_rules.Gate(0.5).rule_text()
    bad_gates = (
        {"max_target_ms": 8.0},
        {"below": -1.0},
        {"below": math.nan},
        {"below": 1.0, "max_target_ms": 0.0},
    )
    for bad in bad_gates:
        with pytest.raises(ValueError, match="gate"):
            gate_rules.Gate(**bad)
