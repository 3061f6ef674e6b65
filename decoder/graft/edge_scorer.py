"""GRAFT's target-distilled edge scorer (TDES) at run time: loading, checking, scoring (NumPy only).

The scorer is f(p, c, d) = w^T ReLU(W [g_p(e_p); g_c(e_c); e_d] + b) + b0. Everything before the
ReLU that depends on one token id only is precomputed at export (models/edge_scorer_fit.py):
``parent_table[v] = W_p g_p(e_v)``, ``child_table[v] = W_c g_c(e_v)`` and
``depth_table[d - 1] = W_d e_d + b``, so f is one gather, one add, a ReLU and a dot product.

Edge scores for DDTree (decoder/graft/ddtree.py, ``edge_scores``): at depth d under parent p the m
candidates c get z_c = log q_d(c) + s f(p, c, d) (s > 0, learned), renormalised over the sibling
set to the same total mass as the marginals:

    edge(p, c, d) = z_c - logsumexp(z) + logsumexp(log q_d)  (<= 0, = log q_d(c) when f = 0)

so path scores stay sums of log-scores <= 0 and the heap stays exact. The parent at depth d - 1 is
the root or one of the candidates at d - 1, so :meth:`EdgeScorer.for_round` scores every (parent,
child) pair of a round in one vectorised call (K x m x m x h), sorts every parent's children in the
same call, and hands the heap a ``decoder.graft.ddtree.EdgeGrid`` of Python lists indexed by the parent's
candidate index (per-pop NumPy calls, checks or sorts would cost more than the scoring).

Files: ``edge_scorer.safetensors`` (float32 tensors parent_table (V, h), child_table (V, h),
depth_table (K, h), w (h,)) and ``edge_scorer.json``, the manifest. :func:`load_edge_scorer`
refuses, naming the file and the field, a missing or unknown field, a wrong type or value, tensors
that do not fit the manifest or are not finite, and any edit after writing: ``weights_sha256`` pins
the weights file, ``manifest_sha256`` the canonical JSON of every other field (weights hash
included).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load, save

from decoder.graft.ddtree import EdgeGrid
from decoder.io.files import replace_atomically
from decoder.io.json_manifest import canonical_digest, check_field_names, read_json_object

SCHEMA_VERSION = "treegraft-edge-scorer/1"
MANIFEST_NAME = "edge_scorer.json"
WEIGHTS_NAME = "edge_scorer.safetensors"
TENSORS = ("parent_table", "child_table", "depth_table", "w")


class EdgeScorerError(ValueError):
    """An edge scorer's files are missing, malformed, edited, or do not fit the drafter/target."""


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


FIELDS = {
    "schema_version": lambda v: v == SCHEMA_VERSION,
    "pair_id": _text,
    "drafter_id": _text,
    "vocab_size": _positive_int,
    "k": _positive_int,
    "hidden": _positive_int,
    "scale": lambda v: _finite(v) and v > 0,
    "b0": _finite,
    "weights_sha256": lambda v: isinstance(v, str) and len(v) == 64,
    "manifest_sha256": lambda v: isinstance(v, str) and len(v) == 64,
}


def manifest_digest(manifest: dict[str, Any]) -> str:
    return canonical_digest(manifest, "manifest_sha256")


@dataclass(frozen=True)
class EdgeScorer:
    """The precomputed tables of one pair's TDES; see the module docstring."""

    parent_table: np.ndarray  # (V, h)
    child_table: np.ndarray  # (V, h)
    depth_table: np.ndarray  # (K, h)
    w: np.ndarray  # (h,)
    b0: float
    scale: float

    @property
    def k(self) -> int:
        return int(self.depth_table.shape[0])

    def f(self, depth: int, parents: np.ndarray, children: np.ndarray) -> np.ndarray:
        """f for every (parent, child) pair at one depth: parents (P,), children (m,) -> (P, m)."""
        if not 1 <= depth <= self.k:
            raise ValueError(f"edge scorer: depth {depth} outside 1..{self.k}")
        h = self.parent_table[parents][:, None, :] + self.child_table[children][None, :, :]
        return np.maximum(h + self.depth_table[depth - 1], 0.0) @ self.w + self.b0

    def for_round(self, root_token: int, ids: np.ndarray, logps: np.ndarray) -> EdgeGrid:
        """Edge scores of every (parent, child) pair of one round's candidate grid, in one pass."""
        k, m = ids.shape
        if k > self.k:
            raise ValueError(f"edge scorer: the drafter gives {k} positions, the scorer knows {self.k}")
        parents = np.concatenate([np.full((1, m), root_token), ids[:-1]])  # (K, m); depth 1: the root
        # (K, parent, child, h), summed in place: parent + child, then + depth, then the ReLU
        hid = self.parent_table[parents][:, :, None, :] + self.child_table[ids][:, None, :, :]
        hid += self.depth_table[:k, None, None, :]
        np.maximum(hid, 0.0, out=hid)
        z = logps[:, None, :] + self.scale * (hid @ self.w + self.b0)  # (K, m, m)
        mass = np.minimum(np.logaddexp.reduce(logps, axis=1), 0.0)[:, None, None]
        edge = np.minimum(z - np.logaddexp.reduce(z, axis=2, keepdims=True) + mass, 0.0)
        if not np.isfinite(edge).all():
            raise ValueError("edge scorer: non-finite edge scores (check the marginals' log-probs)")
        # each parent's children by score, ties by rank: a stable sort of the negated scores
        order = np.argsort(-edge, axis=2, kind="stable")
        return EdgeGrid(edge.tolist(), order.tolist())


def save_edge_scorer(folder: Path | str, scorer: EdgeScorer, pair_id: str, drafter_id: str) -> Path:
    """Write the tables and the manifest (both atomically, weights first); returns the manifest path."""
    folder = Path(folder)
    tensors = {n: np.ascontiguousarray(getattr(scorer, n), dtype=np.float32) for n in TENSORS}
    blob = save(tensors)
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "pair_id": pair_id,
        "drafter_id": drafter_id,
        "vocab_size": int(scorer.parent_table.shape[0]),
        "k": scorer.k,
        "hidden": int(scorer.w.shape[0]),
        "scale": float(scorer.scale),
        "b0": float(scorer.b0),
        "weights_sha256": hashlib.sha256(blob).hexdigest(),
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
    _check_manifest(manifest, folder / MANIFEST_NAME)
    _check_tensors(manifest, tensors, folder / WEIGHTS_NAME)
    replace_atomically(folder / WEIGHTS_NAME, blob)
    replace_atomically(
        folder / MANIFEST_NAME, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    )
    return folder / MANIFEST_NAME


def _check_manifest(manifest: Any, where: Path) -> None:
    if not isinstance(manifest, dict):
        raise EdgeScorerError(f"{where}: expected a JSON object")
    check_field_names(manifest, FIELDS, where, EdgeScorerError)
    for name in sorted(FIELDS):
        if not FIELDS[name](manifest[name]):
            raise EdgeScorerError(f"{where}: field {name!r} has a bad value {manifest[name]!r}")
    if manifest["manifest_sha256"] != manifest_digest(manifest):
        raise EdgeScorerError(f"{where}: field 'manifest_sha256' does not match the other fields (edited)")


def _check_tensors(manifest: dict[str, Any], tensors: dict[str, np.ndarray], where: Path) -> None:
    v, k, h = manifest["vocab_size"], manifest["k"], manifest["hidden"]
    shapes = {"parent_table": (v, h), "child_table": (v, h), "depth_table": (k, h), "w": (h,)}
    if set(tensors) != set(shapes):
        raise EdgeScorerError(f"{where}: tensors {sorted(tensors)}, expected {sorted(shapes)}")
    for name, shape in shapes.items():
        if tensors[name].shape != shape:
            raise EdgeScorerError(
                f"{where}: tensor {name!r} has shape {tensors[name].shape}, the manifest says {shape}"
            )
        if not np.all(np.isfinite(tensors[name])):
            raise EdgeScorerError(f"{where}: tensor {name!r} is not finite")


def load_edge_scorer(
    folder: Path | str, vocab_size: int | None = None, k: int | None = None
) -> tuple[EdgeScorer, dict[str, Any]]:
    """Read and check a saved scorer; ``vocab_size``/``k``: what the target and drafter need."""
    folder = Path(folder)
    meta, weights = folder / MANIFEST_NAME, folder / WEIGHTS_NAME
    for path in (meta, weights):
        if not path.is_file():
            raise EdgeScorerError(
                f"{path}: missing (an edge scorer holds {MANIFEST_NAME} and {WEIGHTS_NAME})"
            )
    manifest = read_json_object(meta, EdgeScorerError)
    _check_manifest(manifest, meta)
    blob = weights.read_bytes()
    if hashlib.sha256(blob).hexdigest() != manifest["weights_sha256"]:
        raise EdgeScorerError(f"{meta}: field 'weights_sha256' does not match {weights}")
    for name, want in (("vocab_size", vocab_size), ("k", k)):
        if want is not None and (manifest[name] < want if name == "k" else manifest[name] != want):
            raise EdgeScorerError(f"{meta}: field {name!r} is {manifest[name]}, the runtime needs {want}")
    try:
        tensors = load(blob)
    except Exception as err:  # safetensors raises its own error types on a malformed header
        raise EdgeScorerError(f"{weights}: not a safetensors file ({err})") from None
    _check_tensors(manifest, tensors, weights)
    as64 = {n: tensors[n].astype(np.float64) for n in TENSORS}
    return EdgeScorer(**as64, b0=float(manifest["b0"]), scale=float(manifest["scale"])), manifest
