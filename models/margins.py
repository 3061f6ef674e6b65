"""Offline margins, pure NumPy: a brute-force test oracle for decoder.deploy.planning.search_margins and
the oracle margins read from the enumerated trajectories.

The throughput convention and the margin's definition: decoder/deploy/planning.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decoder.core.policies import schedule_bits
from decoder.deploy.planning import BranchSearch, ValueFn, branch_tputs, encode_suffix


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
            t_inv, t_skip = branch_tputs(out)
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
