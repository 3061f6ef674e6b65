"""Side-by-side timing (decoder/measure.py): a prompt timed again and again where it is fast, each
method keeping its run of median wall time, so one slow moment of the machine moves no row."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import noisy_copy, tiny_model

from decoder import measure
from decoder.core.config import DecodeConfig
from decoder.core.outcome import GenerationResult
from decoder.core.policies import AR, parse_policy
from decoder.generate import generate, generate_steps
from decoder.measure import (
    ONCE,
    Method,
    PolicyMeasurement,
    Repeats,
    format_table,
    median_run,
    run_lockstep,
    run_side_by_side,
    summarise_results,
)
from decoder.models.pair import make_pair


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen3", seed=91)
    return make_pair(target, noisy_copy(target, 0.3, seed=92), eos_token_ids=(0,))


PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9]]
METHODS = [Method("all-small", "all-small"), Method("all-mid", "all-mid")]


def test_count_reaches_the_wanted_ar_time_within_the_cap() -> None:
    repeats = Repeats(min_ar_s=1.0, most=9)
    for ar_s in (0.01, 0.09, 0.3, 0.55, 0.99, 1.0, 2.5):
        n = repeats.count(ar_s)
        assert 1 <= n <= 9
        # enough runs to last min_ar_s, unless capped; one fewer would not be enough
        assert n * ar_s >= 1.0 or n == 9
        assert n == 1 or (n - 1) * ar_s < 1.0
    assert repeats.count(2.5) == 1 and repeats.count(0.01) == 9
    assert ONCE.count(0.001) == 1


@pytest.mark.parametrize("bad", [{"min_ar_s": -1.0, "most": 3}, {"min_ar_s": 1.0, "most": 0}])
def test_bad_repeats_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="repeats"):
        Repeats(**bad)


def test_median_run_is_the_lower_median_of_wall_time() -> None:
    runs = [GenerationResult([1], [], 0.0, w, False) for w in (0.5, 0.1, 0.9, 0.3)]
    assert median_run(runs).wall_s == 0.3
    assert median_run(runs[:3]).wall_s == 0.5
    assert median_run(runs[:1]) is runs[0]


def recording(monkeypatch, slow_ar_run: int | None = None) -> list[tuple[str, GenerationResult]]:
    """Record every timed `generate` call of decoder.measure (policy, result); with ``slow_ar_run``,
    that autoregressive run (counted from 0, warm-up included) takes 5 s longer, as a moment of a
    contended machine would make it."""
    calls: list[tuple[str, GenerationResult]] = []
    real = measure.generate

    def timed(pair, prompt, policy, config, runtime, timing, *graft):
        result = real(pair, prompt, policy, config, runtime, timing, *graft)
        if policy == AR and slow_ar_run is not None and sum(p == AR for p, _ in calls) == slow_ar_run:
            result = replace(result, wall_s=result.wall_s + 5.0)
        calls.append((policy, result))
        return result

    monkeypatch.setattr(measure, "generate", timed)
    return calls


def test_each_prompt_runs_interleaved_and_keeps_the_median_run(pair, monkeypatch) -> None:
    calls = recording(monkeypatch)
    config = DecodeConfig(max_new_tokens=12)
    every: dict[str, list[list[GenerationResult]]] = {}
    results = run_side_by_side(
        pair, PROMPTS, METHODS, config, warmup_tokens=4, repeats=Repeats(1e6, 3), every_run=every
    )
    names = [AR, "all-small", "all-mid"]
    # warm-up once per method, then per prompt three rounds of AR, all-small, all-mid in turn
    assert [p for p, _ in calls] == names + names * 3 * len(PROMPTS)
    timed = calls[len(names) :]
    for i in range(len(PROMPTS)):
        rounds = timed[9 * i : 9 * (i + 1)]
        for k, name in enumerate(names):
            runs = [r for _, r in rounds[k::3]]
            assert len({tuple(r.new_tokens) for r in runs}) == 1  # greedy: every run the same text
            assert results[name][i] is sorted(runs, key=lambda r: r.wall_s)[1]
            assert every[name][i] == runs  # every run kept, in run order


def test_a_slow_moment_moves_a_single_run_but_not_the_median(pair, monkeypatch) -> None:
    """The first timed AR run of the first prompt is 5 s slower: timed once, every method looks
    far faster than AR; timed three times, each keeping its median, the speedups stay below 5x."""
    config = DecodeConfig(max_new_tokens=12)
    speedups = {}
    for label, repeats in (("once", ONCE), ("median", Repeats(1e6, 3))):
        recording(monkeypatch, slow_ar_run=1)  # run 0 is the warm-up
        results = run_side_by_side(pair, PROMPTS, METHODS, config, warmup_tokens=4, repeats=repeats)
        speedups[label] = {n: m.speedup_vs_ar for n, m in summarise_results(results, 0.0).items()}
        monkeypatch.undo()
    assert speedups["once"]["all-small"] > 20
    assert speedups["median"]["all-small"] < 5 and speedups["median"]["all-mid"] < 5


def test_a_prompt_as_long_as_wanted_runs_once(pair, monkeypatch) -> None:
    calls = recording(monkeypatch)
    run_side_by_side(pair, PROMPTS, METHODS, DecodeConfig(max_new_tokens=8), warmup_tokens=4,
                     repeats=Repeats(min_ar_s=1e-9, most=9))  # fmt: skip
    assert len(calls) == 3 + 3 * len(PROMPTS)


def test_the_table_lines_up_and_carries_the_gain_column_only_when_asked() -> None:
    rows = {
        "ar": PolicyMeasurement("ar", 40, 2.0, 20.0, 1.0, 0.0, 0.0),
        "all-mid": PolicyMeasurement("all-mid", 40, 1.25, 32.0, 1.6, 2.5, 1.0, lossless=False),
    }
    plain, with_gain = format_table(rows).splitlines(), format_table(rows, gain=True).splitlines()
    for lines in (plain, with_gain):
        assert len({len(ln) for ln in lines}) == 1  # every line, header and rule as wide
        assert [ln.split()[0] for ln in lines[2:]] == ["ar", "all-mid"]
    assert "gain" not in plain[0] and with_gain[0].split()[-2:] == ["gain", "lossless"]
    assert plain[2].split()[3] == "1.00x" and plain[3].split()[-1] == "NO"
    assert [ln.split()[-2] for ln in with_gain[2:]] == ["+0.0%", "+60.0%"]
    assert [ln.split()[:-2] for ln in with_gain[2:]] == [ln.split()[:-1] for ln in plain[2:]]


def test_generate_reports_the_cpu_seconds_of_the_call() -> None:
    """cpu_s is time.process_time over the call: positive, and at most the threads' share of wall
    time allows (a value from another clock, or left at 0, fails)."""
    target = tiny_model("qwen3", seed=3)
    pair = make_pair(target, None, eos_token_ids=())
    for policy in ("ar", "all-small"):
        r = generate(pair, [5, 6, 7, 5, 6], policy, DecodeConfig(max_new_tokens=12))
        assert 0 < r.cpu_s <= r.wall_s * max(1, torch.get_num_threads()) + 0.05, (policy, r.cpu_s, r.wall_s)


def test_generate_steps_yield_once_per_round_and_return_what_generate_does(pair) -> None:
    """A decode run piece by piece: one step for the prefill and one per round (per token for AR),
    nothing done before the first step, and the same tokens and rounds as `generate`."""
    config = DecodeConfig(max_new_tokens=12)
    for policy in (AR, "all-small", "all-mid"):
        whole = generate(pair, PROMPTS[0], policy, config)
        steps = generate_steps(pair, PROMPTS[0], policy, config)
        n = 0
        try:
            while True:
                next(steps)
                n += 1
        except StopIteration as done:
            result = done.value
        assert result.new_tokens == whole.new_tokens
        assert [r.emitted for r in result.rounds] == [r.emitted for r in whole.rounds]
        want = len(whole.new_tokens) if policy == AR else 1 + len(whole.rounds)
        assert n == want, (policy, n, want)
    bad = generate_steps(pair, list(range(10_000)), AR, config)  # too long: refused, but only when run
    with pytest.raises(ValueError):
        next(bad)


def test_lockstep_alternates_steps_and_times_each_decode_by_its_own_steps() -> None:
    """Two decodes of 3 and 5 steps, each step advancing a fake clock by its decode's cost: they run
    in turn (a, b, a, b, a, b, b, b... plus each final resume) and each gets only its own time."""
    t = [0.0]
    order: list[str] = []

    def decode(name: str, steps: int, cost: float):
        for _ in range(steps):
            order.append(name)
            t[0] += cost
            yield
        t[0] += cost
        return GenerationResult([1] * steps, [], 0.0, -1.0, False)

    a, b = run_lockstep([decode("a", 3, 1.0), decode("b", 5, 10.0)], clock=lambda: t[0])
    assert order == ["a", "b", "a", "b", "a", "b", "b", "b"]
    assert a.wall_s == 4.0 and b.wall_s == 60.0  # its steps and final resume, never the other's
    assert len(a.new_tokens) == 3 and len(b.new_tokens) == 5
    assert a.cpu_s >= 0 and b.cpu_s >= 0


def test_lockstep_refuses_methods_that_share_one_policy_object(pair) -> None:
    """Interleaved decodes would mix a shared policy's per-generation state; a name is parsed
    afresh for each decode, so two methods naming one policy are fine."""
    one = parse_policy("10101", 5)
    assert not isinstance(one, str)
    shared = [Method("a", one), Method("b", one)]
    with pytest.raises(ValueError, match=r"lockstep: methods \['a', 'b'\] share one policy object"):
        run_side_by_side(
            pair, PROMPTS, shared, DecodeConfig(max_new_tokens=4), warmup_tokens=2, lockstep=True
        )
    named = [Method("a", "10101"), Method("b", "10101")]
    out = run_side_by_side(
        pair, PROMPTS[:1], named, DecodeConfig(max_new_tokens=4), warmup_tokens=2, lockstep=True
    )
    assert out["a"][0].new_tokens == out["b"][0].new_tokens == out[AR][0].new_tokens


def test_lockstep_side_by_side_decodes_the_same_tokens_as_one_after_another(pair) -> None:
    config = DecodeConfig(max_new_tokens=12)
    seq = run_side_by_side(pair, PROMPTS, METHODS, config, warmup_tokens=4)
    every: dict[str, list[list[GenerationResult]]] = {}
    lock = run_side_by_side(
        pair,
        PROMPTS,
        METHODS,
        config,
        warmup_tokens=4,
        repeats=Repeats(1e6, 2),
        every_run=every,
        lockstep=True,
    )
    for name in seq:
        assert [r.new_tokens for r in lock[name]] == [r.new_tokens for r in seq[name]]
        assert all(len(runs) == 2 and all(r.wall_s > 0 and r.cpu_s > 0 for r in runs) for runs in every[name])
