"""The contract between a block drafter and the DDTree builder (GRAFT, design/GRAFT.md).

A block drafter predicts K future positions in one forward, conditioned on the target's hidden
states of the committed context. The runtime keeps those states as *features*: for every position
the target's cache holds (all committed tokens but the last, the next tree's root), the
concatenation of the hidden states at `target_layers` (indices into HF's ``hidden_states`` tuple,
0 = the embeddings), shape (n_cached, len(target_layers) * hidden_size). Given the features and the
root token, the drafter returns per-position marginals: the top-m tokens and their log-probs for
positions root+1 .. root+K. DDTree (decoder/graft/ddtree.py) builds the tree from these alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class Marginals:
    """Top-m candidates per future position, best first: ids (K, m) int64, logps (K, m) float64."""

    ids: np.ndarray
    logps: np.ndarray

    def __post_init__(self) -> None:
        if self.ids.shape != self.logps.shape or self.ids.ndim != 2:
            raise ValueError(
                f"Marginals: ids {self.ids.shape} and logps {self.logps.shape} must both be (K, m)"
            )

    @property
    def k(self) -> int:
        return int(self.ids.shape[0])

    @property
    def first_logp(self) -> float:
        """The best candidate's log-prob at position 1 (0.0 for an empty block): the confidence
        the budget rules read."""
        return float(self.logps[0, 0]) if self.k else 0.0


class BlockProposer(Protocol):
    """A drafter of K positions per call (a block drafter, or any stand-in with the same contract)."""

    k: int  # future positions predicted per call
    target_layers: tuple[int, ...]  # hidden_states indices it reads; () = it needs no features

    def propose(self, features: torch.Tensor | None, committed: list[int], topk: int) -> Marginals:
        """Marginals for the K positions after committed[-1] (the root).

        features: (len(committed) - 1, len(target_layers) * hidden) from the target, or None when
        target_layers is empty.
        """
        ...
