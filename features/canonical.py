"""Canonical states: action rows with the same (report, step k, prefix a_<k) are one online state.

Contract:
- :func:`merge_states` is order-independent (any permutation of the rows gives bit-identical
  output: sums are exactly rounded with ``math.fsum``) and idempotent (merging its own output
  changes nothing: a group of one row is copied, not recomputed). Features are the weighted mean
  over the merged rows, weights (row counts) add up.
- :func:`assign_folds` is grouped K-fold by report (scikit-learn ``GroupKFold``), deterministic in
  the set of report ids: ``n_splits = min(n_folds, n_reports)``, and at least 2 reports are needed.
- :func:`canonicalize` turns the collectors' ``actions`` table into the ``states`` and ``samples``
  tables of features/schemas.py and checks there are exactly 2^D - 1 states per report.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from decoder.state import state_feature_names
from features.collect_schemas import actions_spec
from features.schemas import samples_spec, states_spec
from features.tables import SchemaError

StateKey = tuple[str, int, str]  # (report_id, step, prefix)


@dataclass(frozen=True)
class Merged:
    keys: list[StateKey]  # sorted
    features: np.ndarray  # (n_states, n_features) float64
    weights: np.ndarray  # (n_states,) int64 rows merged


def merge_states(keys: Sequence[StateKey], features: np.ndarray, weights: np.ndarray | None = None) -> Merged:
    """Weighted mean of the feature rows per key, keys sorted; see the module contract."""
    features = np.asarray(features, dtype=np.float64)
    weights = np.ones(len(keys), dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    groups: dict[StateKey, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        groups[(str(key[0]), int(key[1]), str(key[2]))].append(i)
    out_keys = sorted(groups)
    out = np.empty((len(out_keys), features.shape[1]), dtype=np.float64)
    out_w = np.empty(len(out_keys), dtype=np.int64)
    for j, key in enumerate(out_keys):
        rows = groups[key]
        w = weights[rows]
        out_w[j] = int(w.sum())
        if len(rows) == 1:
            out[j] = features[rows[0]]
            continue
        for c in range(features.shape[1]):
            out[j, c] = math.fsum(float(x) for x in w * features[rows, c]) / out_w[j]
    return Merged(out_keys, out, out_w)


def assign_folds(report_ids: Sequence[str], n_folds: int) -> dict[str, int]:
    """report_id -> fold id in [0, min(n_folds, n_reports)); grouped, deterministic."""
    from sklearn.model_selection import GroupKFold

    reports = sorted(set(report_ids))
    if len(reports) < 2:
        raise ValueError(f"grouped folds need at least 2 reports, got {len(reports)}")
    splitter = GroupKFold(n_splits=min(n_folds, len(reports)))
    folds = {}
    for fold, (_, test) in enumerate(splitter.split(np.zeros(len(reports)), groups=reports)):
        for i in test:
            folds[reports[i]] = fold
    return folds


def check_complete(keys: Sequence[StateKey], depth: int) -> None:
    """Every report must have exactly one state per (k, prefix of k-1 bits): 2^D - 1 states."""
    per_report: dict[str, set[tuple[int, str]]] = defaultdict(set)
    for report, step, prefix in keys:
        per_report[report].add((step, prefix))
    want = {
        (k, format(p, f"0{k - 1}b") if k > 1 else "")
        for k in range(1, depth + 1)
        for p in range(2 ** (k - 1))
    }
    for report, got in per_report.items():
        if got != want:
            missing = sorted(want - got)[:3]
            extra = sorted(got - want)[:3]
            raise ValueError(
                f"report {report!r}: {len(got)} canonical states, expected {len(want)} (2^D - 1); "
                f"missing e.g. {missing}, unexpected e.g. {extra}"
            )


@dataclass(frozen=True)
class CanonicalTables:
    states: pa.Table
    samples: pa.Table


def canonicalize(actions: pa.Table, depth: int, n_folds: int) -> CanonicalTables:
    """The states and samples tables from the collectors' actions table (any row order)."""
    if actions.schema.names != actions_spec(depth).names:
        raise SchemaError(f"actions table does not match {actions_spec(depth).tag}")
    cols = actions.to_pydict()
    names = state_feature_names(depth)
    keys = [(r, int(k), p) for r, k, p in zip(cols["report_id"], cols["step"], cols["prefix"], strict=True)]
    merged = merge_states(keys, np.column_stack([np.asarray(cols[n], dtype=np.float64) for n in names]))
    check_complete(merged.keys, depth)
    folds = assign_folds([k[0] for k in merged.keys], n_folds)
    ids = {key: i for i, key in enumerate(merged.keys)}
    origin = {
        r: (p, d) for r, p, d in zip(cols["report_id"], cols["pair_id"], cols["dataset_id"], strict=True)
    }
    states = {
        "report_id": [k[0] for k in merged.keys],
        "pair_id": [origin[k[0]][0] for k in merged.keys],
        "dataset_id": [origin[k[0]][1] for k in merged.keys],
        "state_id": list(range(len(merged.keys))),
        "fold_id": [folds[k[0]] for k in merged.keys],
        "step": [k[1] for k in merged.keys],
        "prefix": [k[2] for k in merged.keys],
        "n_rows": merged.weights.tolist(),
        **{n: merged.features[:, j] for j, n in enumerate(names)},
    }
    order = sorted(range(len(keys)), key=lambda i: (keys[i], cols["schedule_id"][i]))
    sid = [ids[keys[i]] for i in order]
    samples = {
        "report_id": [keys[i][0] for i in order],
        "pair_id": [cols["pair_id"][i] for i in order],
        "dataset_id": [cols["dataset_id"][i] for i in order],
        "state_id": sid,
        "fold_id": [states["fold_id"][s] for s in sid],
        "step": [keys[i][1] for i in order],
        "prefix": [keys[i][2] for i in order],
        **{c: [cols[c][i] for i in order] for c in ("schedule_id", "is_invoke", "suffix")},
        **{c: [cols[c][i] for i in order] for c in ("mean_accepted_length", "round_latency_ms")},
        "throughput_tok_per_s": [cols["throughput_tok_per_s"][i] for i in order],
    }
    return CanonicalTables(
        pa.table(states, schema=states_spec(depth).schema),
        pa.table(samples, schema=samples_spec(depth).schema),
    )
