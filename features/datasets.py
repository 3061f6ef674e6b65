"""Model-ready arrays from the states and samples tables (pure NumPy; row order = table order).

- :func:`state_matrix`: z for every canonical state, columns in the given feature order.
- :func:`value_data`: one row per sample, x = [z of its state, suffix encoding], y (n, 4) in
  decoder.deploy.planning.HEADS order with the other branch's two heads NaN (masked in training), and
  y = [A, ln(round latency ms)] for the branch the row took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from decoder.core.state import state_feature_names
from decoder.deploy.planning import value_inputs


def state_matrix(states: pa.Table, names: Sequence[str]) -> np.ndarray:
    return np.column_stack([states.column(n).to_numpy().astype(np.float64) for n in names])


def column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


@dataclass(frozen=True)
class ValueData:
    x: np.ndarray  # (n, |z| + D + 1)
    y: np.ndarray  # (n, 4), NaN for the branch not taken
    folds: np.ndarray  # (n,)
    state_ids: np.ndarray  # (n,)
    is_invoke: np.ndarray  # (n,) bool
    throughput: np.ndarray  # (n,) realised tokens/s


def value_data(states: pa.Table, samples: pa.Table, depth: int, signals: Sequence[str]) -> ValueData:
    z = state_matrix(states, state_feature_names(depth, signals))
    sid = column(samples, "state_id").astype(np.int64)
    invoke = column(samples, "is_invoke").astype(bool)
    a = column(samples, "mean_accepted_length").astype(np.float64)
    logt = np.log(column(samples, "round_latency_ms").astype(np.float64))
    y = np.full((len(sid), 4), np.nan)
    y[invoke, 0], y[invoke, 1] = a[invoke], logt[invoke]
    y[~invoke, 2], y[~invoke, 3] = a[~invoke], logt[~invoke]
    x = value_inputs(z[sid], [str(s) for s in column(samples, "suffix")], depth)
    return ValueData(
        x,
        y,
        column(samples, "fold_id").astype(np.int64),
        sid,
        invoke,
        column(samples, "throughput_tok_per_s"),
    )
