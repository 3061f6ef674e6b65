"""The two tables of the collect_edges stage (GRAFT's TDES training data), declared once.

``edge_rounds``: one row per recorded DDTree round: the block drafter's per-position candidates
(K x m token ids and log-probs, flattened row-major: position d = 1..K is row d - 1) and the
target's greedy continuation after the root (K tokens), enough to rebuild and replay the round's
tree under any budget and any edge score.

``edges``: one row per candidate edge of a round's DDTree: every node of the tree above the last
depth is a parent, every one of the m candidates at the next depth a child. ``is_target`` is the
label: the parent lies on the target's accepted path and the child is the target's greedy next
token after it. ``target_logit`` is the target's logit of the child after the parent, for accepted
parents only (null elsewhere): a (round, depth) group of those rows is the sibling set of L_KL.

Value contracts (features/contracts.py), from collectors/graft/edges.py: token ids and indices are
non-negative, log-probabilities finite and <= 0, a round's candidate lists hold K x m entries and
its accepted length is at most K; an edge's target logit is present exactly for accepted parents,
and only an accepted parent has a target child.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from features.contracts import Contract, Rule, constant_per, non_negative, positive
from features.tables import TableSpec

EDGES_VERSION = "v1"
_KEYS = (
    ("pair_id", pa.string()),
    ("drafter_id", pa.string()),
    ("dataset_id", pa.string()),
    ("prompt_id", pa.int32()),
    ("round_id", pa.int32()),
)

EDGE_ROUNDS = TableSpec(
    "edge_rounds",
    EDGES_VERSION,
    (
        *_KEYS,
        ("root_token", pa.int32()),
        ("start_position", pa.int32()),
        ("k", pa.int16()),
        ("m", pa.int16()),
        ("accepted", pa.int16()),
        ("cand_ids", pa.list_(pa.int32())),
        ("cand_logps", pa.list_(pa.float64())),
        ("greedy_ids", pa.list_(pa.int32())),
    ),
    Contract(
        key=tuple(n for n, _ in _KEYS),
        rules=(
            *non_negative("prompt_id", "round_id", "root_token", "start_position", "accepted"),
            *positive("k", "m"),
            Rule("accepted", "<= k", pl.col("accepted") <= pl.col("k")),
            Rule(
                "cand_ids",
                "k x m ids, each >= 0",
                (pl.col("cand_ids").list.len() == pl.col("k").cast(pl.Int64) * pl.col("m"))
                & (pl.col("cand_ids").list.min().fill_null(0) >= 0),
            ),
            Rule(
                "cand_logps",
                "k x m log-probs, each <= 0",
                (pl.col("cand_logps").list.len() == pl.col("k").cast(pl.Int64) * pl.col("m"))
                & (pl.col("cand_logps").list.max().fill_null(0) <= 0),
            ),
            Rule("greedy_ids", "ids >= 0", pl.col("greedy_ids").list.min().fill_null(0) >= 0),
        ),
    ),
)

EDGES = TableSpec(
    "edges",
    EDGES_VERSION,
    (
        *_KEYS,
        ("depth", pa.int16()),
        ("parent_node", pa.int16()),
        ("parent_token", pa.int32()),
        ("child_token", pa.int32()),
        ("child_rank", pa.int16()),
        ("logq", pa.float64()),
        ("is_in_tree", pa.bool_()),
        ("is_accepted_parent", pa.bool_()),
        ("is_target", pa.bool_()),
        ("target_logit", pa.float64()),
    ),
    Contract(
        key=(*(n for n, _ in _KEYS), "parent_node", "child_rank"),
        nullable=frozenset({"target_logit"}),
        rules=(
            *positive("depth"),
            *non_negative(
                "prompt_id", "round_id", "parent_node", "parent_token", "child_token", "child_rank"
            ),
            Rule("logq", "<= 0", pl.col("logq") <= 0),
            Rule(
                "target_logit",
                "present exactly for accepted parents",
                pl.col("target_logit").is_not_null() == pl.col("is_accepted_parent"),
            ),
            Rule(
                "is_target",
                "only under an accepted parent",
                ~pl.col("is_target") | pl.col("is_accepted_parent"),
            ),
        ),
        groups=constant_per(
            (*(n for n, _ in _KEYS), "parent_node"), ("depth", "parent_token", "is_accepted_parent")
        ),
    ),
)
