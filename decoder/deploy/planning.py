"""Planning over future suffixes, pure NumPy: the value system's inputs and the exhaustive
suffix search (shared by the margins stage and the decoder's value planner, so offline margins and
online planning are one piece of code).

- state z: see decoder/core/state.py (the one definition of its feature order).
- future suffix (steps k+1..D, step k+1 first) encoded in D + 1 dims: its bits right-padded with
  zeros to D - 1, then (#mid calls in the suffix) / D and (suffix length) / D. The length term
  tells an empty suffix from an all-skip one of the same padding.
- value-system input x = [z, suffix encoding] (23 dims for D = 5).

Throughput convention (one place: :func:`predicted_throughput`): a branch's predicted tokens/s is
1000 * (A + 1) / exp(log t), with A the predicted mean accepted length (drafted tokens per round,
+1 for the target's bonus token) and t the predicted round latency in ms. This is the collectors'
realised convention, tokens/s = 1000 * tokens per round / round latency ms.

A value function maps value-system inputs (n, |z| + D + 1) to (n, 4) predictions in HEADS order,
in original units. For a state at step k the margin is
  max over suffixes s of tput(invoke now, s) - max over suffixes s of tput(skip now, s),
with s ranging over all 2^(D-k) futures. The oracle margin reads the same maxima off the realised
trajectories instead of predictions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

SUFFIX_STATS = ("suffix_mid_frac", "suffix_len_frac")


def suffix_feature_names(depth: int) -> tuple[str, ...]:
    return (*(f"suffix_bit_{j}" for j in range(1, depth)), *SUFFIX_STATS)


def encode_suffix(suffix: str, depth: int) -> np.ndarray:
    """(D + 1,) encoding of a future suffix given as a bit string, step k+1 first."""
    if len(suffix) > depth - 1 or set(suffix) - {"0", "1"}:
        raise ValueError(f"suffix {suffix!r} is not a bit string of at most {depth - 1} steps")
    bits = [float(c == "1") for c in suffix] + [0.0] * (depth - 1 - len(suffix))
    return np.array([*bits, suffix.count("1") / depth, len(suffix) / depth], dtype=np.float64)


@cache
def all_suffixes(length: int) -> tuple[str, ...]:
    """All 2^length bit strings, in schedule-id order of their bits (first step = lowest bit)."""
    return tuple("".join("1" if (s >> j) & 1 else "0" for j in range(length)) for s in range(2**length))


@cache
def suffix_matrix(length: int, depth: int) -> np.ndarray:
    """(2^length, D + 1) encodings of :func:`all_suffixes`, read-only (cached)."""
    m = np.stack([encode_suffix(s, depth) for s in all_suffixes(length)])
    m.setflags(write=False)
    return m


def value_inputs(z: np.ndarray, suffixes: Sequence[str], depth: int) -> np.ndarray:
    """(n, |z| + D + 1) rows [z_i, encode(suffix_i)] for row-aligned z (n, |z|) and suffixes."""
    enc = np.stack([encode_suffix(s, depth) for s in suffixes]) if len(suffixes) else np.zeros((0, depth + 1))
    return np.concatenate([np.asarray(z, dtype=np.float64), enc], axis=1)


HEADS = ("A_invoke", "logt_invoke", "A_skip", "logt_skip")
ValueFn = Callable[[np.ndarray], np.ndarray]


def predicted_throughput(accepted: np.ndarray, log_latency_ms: np.ndarray) -> np.ndarray:
    """Tokens/s from accepted length and log round latency (ms); see the module docstring."""
    return 1000.0 * (np.asarray(accepted) + 1.0) / np.exp(log_latency_ms)


@dataclass(frozen=True)
class BranchSearch:
    """Per state: best predicted tokens/s when invoking / skipping now, the argmax suffixes, margin."""

    invoke: np.ndarray
    skip: np.ndarray
    invoke_suffix: list[str]
    skip_suffix: list[str]

    @property
    def margin(self) -> np.ndarray:
        return self.invoke - self.skip


def branch_tputs(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return predicted_throughput(out[..., 0], out[..., 1]), predicted_throughput(out[..., 2], out[..., 3])


def search_margins(value_fn: ValueFn, z: np.ndarray, steps: Sequence[int], depth: int) -> BranchSearch:
    """Exhaustive suffix search for every state (rows of z at 1-based `steps`), batched per step."""
    z = np.asarray(z, dtype=np.float64)
    steps = np.asarray(steps)
    n = len(z)
    invoke, skip = np.empty(n), np.empty(n)
    inv_suf, skip_suf = [""] * n, [""] * n
    for k in np.unique(steps):
        idx = np.flatnonzero(steps == k)
        length = depth - int(k)
        enc = suffix_matrix(length, depth)
        x = np.concatenate([np.repeat(z[idx], len(enc), axis=0), np.tile(enc, (len(idx), 1))], axis=1)
        t_inv, t_skip = branch_tputs(value_fn(x).reshape(len(idx), len(enc), len(HEADS)))
        a_inv, a_skip = t_inv.argmax(axis=1), t_skip.argmax(axis=1)
        invoke[idx] = t_inv[np.arange(len(idx)), a_inv]
        skip[idx] = t_skip[np.arange(len(idx)), a_skip]
        names = all_suffixes(length)
        for j, i in enumerate(idx):
            inv_suf[i], skip_suf[i] = names[a_inv[j]], names[a_skip[j]]
    return BranchSearch(invoke, skip, inv_suf, skip_suf)
