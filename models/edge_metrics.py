"""Out-of-fold metrics of the edge scorer: edge AUC, parent-child mismatch and A at equal budget.

- Folds are grouped by prompt: a pair's prompts, sorted by (prompt id, dataset), are dealt
  round-robin into k folds, so every fold holds prompts of every dataset and all rounds and edges
  of a prompt share its fold.
- Edge AUC: ROC AUC of a score against the ``is_target`` label over every recorded edge (the unary
  baseline scores an edge by log q_d(c) alone, so it ties a child under all its parents).
- Replay (:func:`replay_round`): one recorded round's DDTree is rebuilt at budget B from its
  marginals, either by marginals (the default heap) or with the scorer's edge scores; A is the
  number of its nodes along the target's greedy continuation (the accepted length), and a node is
  *mismatched* when it carries the target's token for its depth but hangs under a parent off the
  target's path. The mismatch rate is mismatched / nodes carrying the target's token (depth >= 2:
  at depth 1 the root is every node's parent).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.metrics import roc_auc_score

from collectors.graft.edges import tree_match
from decoder.graft.ddtree import build_ddtree
from decoder.graft.edge_scorer import EdgeScorer


def prompt_folds(keys: list[tuple[int, str]], n_folds: int) -> dict[tuple[int, str], int]:
    """(prompt id, dataset) -> fold in [0, min(n_folds, n_prompts)); see the module docstring."""
    prompts = sorted(set(keys))
    if len(prompts) < 2:
        raise ValueError(f"grouped folds need at least 2 prompts, got {len(prompts)}")
    k = min(n_folds, len(prompts))
    return {p: i % k for i, p in enumerate(prompts)}


def edge_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC; NaN when only one class is present."""
    labels = np.asarray(labels, dtype=bool)
    if labels.all() or not labels.any():
        return float("nan")
    return float(roc_auc_score(labels, scores))


@dataclass(frozen=True)
class Replay:
    accepted: int  # A: tree nodes along the greedy continuation
    target_nodes: int  # nodes at depth >= 2 carrying the target's token for their depth
    mismatched: int  # of those, under a parent off the target's path


def replay_round(
    root: int, ids: np.ndarray, logps: np.ndarray, greedy: list[int], budget: int, scorer: EdgeScorer | None
) -> Replay:
    """Rebuild one round's tree at ``budget`` (by marginals, or with ``scorer``) and score it."""
    edge_scores = None if scorer is None else scorer.for_round(root, ids, logps)
    match = tree_match(build_ddtree(root, ids, logps, budget, edge_scores=edge_scores), greedy)
    return Replay(match.accepted, match.target_nodes, match.mismatched)


@dataclass(frozen=True)
class ReplaySummary:
    mean_accepted: float
    mismatch_rate: float
    n_rounds: int


def summarize(replays: list[Replay]) -> ReplaySummary:
    carrying = sum(r.target_nodes for r in replays)
    return ReplaySummary(
        mean_accepted=float(np.mean([r.accepted for r in replays])) if replays else float("nan"),
        mismatch_rate=sum(r.mismatched for r in replays) / carrying if carrying else 0.0,
        n_rounds=len(replays),
    )
