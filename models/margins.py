"""Margins by exhaustive search over future suffixes, pure NumPy (shared by the margins stage and
the decoder's value planner, so offline margins and online planning are one piece of code).

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

import numpy as np

from decoder.policies import schedule_bits
from features.encoding import all_suffixes, encode_suffix, suffix_matrix

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


def _branch_tputs(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        t_inv, t_skip = _branch_tputs(value_fn(x).reshape(len(idx), len(enc), len(HEADS)))
        a_inv, a_skip = t_inv.argmax(axis=1), t_skip.argmax(axis=1)
        invoke[idx] = t_inv[np.arange(len(idx)), a_inv]
        skip[idx] = t_skip[np.arange(len(idx)), a_skip]
        names = all_suffixes(length)
        for j, i in enumerate(idx):
            inv_suf[i], skip_suf[i] = names[a_inv[j]], names[a_skip[j]]
    return BranchSearch(invoke, skip, inv_suf, skip_suf)


def brute_force_margins(
    value_fn: ValueFn, z: np.ndarray, steps: Sequence[int], prefixes: Sequence[str], depth: int
) -> BranchSearch:
    """The same maxima by walking all 2^D full schedule ids one row at a time (a test oracle)."""
    out_inv, out_skip, inv_suf, skip_suf = [], [], [], []
    for zi, k, prefix in zip(np.asarray(z, dtype=np.float64), steps, prefixes, strict=True):
        best = {True: (-np.inf, ""), False: (-np.inf, "")}
        for sid in range(2**depth):
            bits = "".join("1" if b else "0" for b in schedule_bits(sid, depth))
            if bits[: k - 1] != prefix:
                continue
            action, suffix = bits[k - 1] == "1", bits[k:]
            out = value_fn(np.concatenate([zi, encode_suffix(suffix, depth)])[None])[0]
            t_inv, t_skip = _branch_tputs(out)
            tput = float(t_inv if action else t_skip)
            if tput > best[action][0]:
                best[action] = (tput, suffix)
        out_inv.append(best[True][0])
        out_skip.append(best[False][0])
        inv_suf.append(best[True][1])
        skip_suf.append(best[False][1])
    return BranchSearch(np.array(out_inv), np.array(out_skip), inv_suf, skip_suf)


@dataclass(frozen=True)
class OracleMargins:
    invoke: np.ndarray  # best realised tokens/s over prefix + '1' + any suffix
    skip: np.ndarray  # best realised tokens/s over prefix + '0' + any suffix

    @property
    def margin(self) -> np.ndarray:
        return self.invoke - self.skip


def oracle_margins(
    state_ids: np.ndarray, is_invoke: np.ndarray, throughput: np.ndarray, n_states: int
) -> OracleMargins:
    """Per state, the best realised throughput of each branch over the enumerated trajectories."""
    invoke, skip = np.full(n_states, -np.inf), np.full(n_states, -np.inf)
    is_invoke = np.asarray(is_invoke, dtype=bool)
    np.maximum.at(invoke, np.asarray(state_ids)[is_invoke], np.asarray(throughput)[is_invoke])
    np.maximum.at(skip, np.asarray(state_ids)[~is_invoke], np.asarray(throughput)[~is_invoke])
    if not (np.isfinite(invoke).all() and np.isfinite(skip).all()):
        raise ValueError("some state lacks trajectories for one of its branches")
    return OracleMargins(invoke, skip)
