"""Exhaustive suffix search equals brute force over full schedules; the oracle margin by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.deploy.planning import predicted_throughput, search_margins
from models.margins import brute_force_margins, oracle_margins


def random_value_fn(rng: np.random.Generator, n_in: int):
    """A random ReLU net with outputs in plausible ranges (A in [0, 4], log t in [2, 5])."""
    w1, b1, w2 = rng.normal(size=(n_in, 16)), rng.normal(size=16), rng.normal(size=(16, 4))

    def f(x: np.ndarray) -> np.ndarray:
        h = np.tanh(np.maximum(x @ w1 + b1, 0) @ w2)
        return np.column_stack([2 + 2 * h[:, 0], 3.5 + 1.5 * h[:, 1], 2 + 2 * h[:, 2], 3.5 + 1.5 * h[:, 3]])

    return f


def all_states(depth: int) -> tuple[list[int], list[str]]:
    steps, prefixes = [], []
    for k in range(1, depth + 1):
        for p in range(2 ** (k - 1)):
            steps.append(k)
            prefixes.append(format(p, f"0{k - 1}b") if k > 1 else "")
    return steps, prefixes


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_search_equals_brute_force(depth, n_z, seed):
    rng = np.random.default_rng(seed)
    steps, prefixes = all_states(depth)
    z = rng.normal(size=(len(steps), n_z))
    f = random_value_fn(rng, n_z + depth + 1)
    fast = search_margins(f, z, steps, depth)
    slow = brute_force_margins(f, z, steps, prefixes, depth)
    np.testing.assert_allclose(fast.invoke, slow.invoke, rtol=1e-12)
    np.testing.assert_allclose(fast.skip, slow.skip, rtol=1e-12)
    np.testing.assert_allclose(fast.margin, slow.margin, rtol=1e-9, atol=1e-9)
    assert fast.invoke_suffix == slow.invoke_suffix and fast.skip_suffix == slow.skip_suffix
    assert all(len(s) == depth - k for s, k in zip(fast.invoke_suffix, steps, strict=True))


def test_throughput_convention():
    # 1000 * (A + 1) / t: A = 2 accepted + 1 bonus token per 30 ms round = 100 tok/s
    assert float(predicted_throughput(np.array(2.0), np.log(30.0))) == pytest.approx(100.0)


def test_oracle_margin_is_the_best_realised_branch():
    rng = np.random.default_rng(0)
    depth = 3
    schedules = [format(s, "03b")[::-1] for s in range(8)]
    tput = {s: float(rng.uniform(10, 50)) for s in schedules}
    steps, prefixes = all_states(depth)
    sid, inv, tp = [], [], []
    for i, (k, p) in enumerate(zip(steps, prefixes, strict=True)):
        for s in schedules:
            if s.startswith(p):
                sid.append(i)
                inv.append(s[k - 1] == "1")
                tp.append(tput[s])
    om = oracle_margins(np.array(sid), np.array(inv), np.array(tp), len(steps))
    for i, p in enumerate(prefixes):
        best_inv = max(t for s, t in tput.items() if s.startswith(p + "1"))
        best_skip = max(t for s, t in tput.items() if s.startswith(p + "0"))
        assert om.margin[i] == best_inv - best_skip
    best = max(tput, key=tput.get)
    prefix = ""
    for _ in range(depth):  # following the oracle's sign reaches the best schedule
        prefix += "1" if om.margin[prefixes.index(prefix)] > 0 else "0"
    assert prefix == best
