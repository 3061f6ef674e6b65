"""Runtime configuration: the single home of the decoder's defaults (paper section 2)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class Grafting(StrEnum):
    """How new children meet existing ones."""

    NON_DESTRUCTIVE = "non_destructive"  # same token merges, nothing is removed
    OVERWRITE = "overwrite"  # ablation: a re-expanded node loses its old children


@dataclass(frozen=True)
class TreeConfig:
    """Tree construction and verification budget. Defaults are the paper's."""

    depth: int = 5  # D drafting steps per round
    width: int = 10  # W frontier nodes per step
    topk: int = 10  # m children per expanded node
    budget: int = 63  # B_ver verified nodes besides the root
    extended_grafting: bool = True
    grafting: Grafting = Grafting.NON_DESTRUCTIVE
    ngram_max_n: int = 5
    ngram_max_matches: int = 8  # most recent occurrences consulted per lookup
    ngram_chain_len: int = 4  # tokens per proposed continuation chain
    ngram_min_n: int = 1  # shortest suffix match drafted from (2: no unigram matches)
    sequential: bool = False  # ablation: CSD-style cascade, one chain extended at its tip by top-1
    # Per-round budget (decoder/core/budget.py `verify_budget`; off while verify_ms is empty): each round
    # verifies the B <= budget of the best (1 + round_gain_scale x expected accepted) /
    # (round_fixed_ms + verify_ms[B]), verify_ms[B] the measured ms to verify the root and B nodes.
    verify_ms: tuple[float, ...] = ()
    round_fixed_ms: float = 0.0
    round_gain_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("depth", "width", "topk", "budget", "ngram_max_n", "ngram_max_matches"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TreeConfig.{name} must be positive, got {getattr(self, name)}")
        if self.ngram_chain_len <= 0:
            raise ValueError(f"TreeConfig.ngram_chain_len must be positive, got {self.ngram_chain_len}")
        if not 1 <= self.ngram_min_n <= self.ngram_max_n:
            raise ValueError(
                f"TreeConfig.ngram_min_n must be in [1, ngram_max_n={self.ngram_max_n}], "
                f"got {self.ngram_min_n}"
            )
        object.__setattr__(self, "verify_ms", tuple(float(v) for v in self.verify_ms))
        if self.verify_ms:
            if len(self.verify_ms) < self.budget + 1:
                raise ValueError(
                    f"TreeConfig.verify_ms needs one cost per budget 0..{self.budget} "
                    f"({self.budget + 1} values), got {len(self.verify_ms)}"
                )
            if not all(math.isfinite(v) and v > 0 for v in self.verify_ms):
                raise ValueError(
                    f"TreeConfig.verify_ms must be finite and > 0 ms, got {list(self.verify_ms)}"
                )
        for name in ("round_fixed_ms", "round_gain_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"TreeConfig.{name} must be finite and >= 0, got {value}")
        object.__setattr__(self, "grafting", Grafting(self.grafting))


@dataclass(frozen=True)
class BlockBudgetRule:
    """GRAFT's learned per-round budget (decoder/graft/budget.py): the tree is built at
    cap = len(cost_ms) - 1 nodes; node i is accepted with probability
    sigmoid(weights . x_i + bias), x_i its features (block_budget.NODE_FEATURES); the round verifies
    the B in 0..cap of the most (1 + expected accepted of its first B nodes) - rate x cost_ms[B]."""

    weights: tuple[float, ...]
    bias: float
    cost_ms: tuple[float, ...]  # the whole round's ms when it verifies B = 0..cap drafted nodes
    rate: float  # tokens per ms the decoding sustains (the price of a ms in tokens)

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
        object.__setattr__(self, "cost_ms", tuple(float(c) for c in self.cost_ms))
        values = (*self.weights, float(self.bias), float(self.rate))
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"BlockBudgetRule: weights and bias must be finite, got {values}")
        if not self.rate > 0:
            raise ValueError(f"BlockBudgetRule.rate must be > 0 tokens per ms, got {self.rate}")
        if len(self.cost_ms) < 2:
            raise ValueError(f"BlockBudgetRule.cost_ms needs costs for B = 0..cap >= 1, got {self.cost_ms}")
        if not all(math.isfinite(c) and c > 0 for c in self.cost_ms):
            raise ValueError(f"BlockBudgetRule.cost_ms must be finite and > 0 ms, got {list(self.cost_ms)}")

    @property
    def cap(self) -> int:
        return len(self.cost_ms) - 1

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        """1 - rate x cost_ms[B] for B = 0..cap: the decision's objective before its gains."""
        offsets = 1.0 - self.rate * np.asarray(self.cost_ms)
        offsets.flags.writeable = False
        return offsets


@dataclass(frozen=True)
class BlockConfig:
    """The `ddtree` policy (GRAFT, design/GRAFT.md): a DDTree from a block proposer's marginals."""

    budget: int = 63  # B drafted nodes per tree (popped prefixes), as the TreeGraft budget
    topk: int = 8  # m candidates per future position
    k: int = 8  # positions per round of the stand-in proposer generate builds when given none
    rule: BlockBudgetRule | None = None  # per-round budget; the tree is then built at rule.cap

    def __post_init__(self) -> None:
        for name in ("budget", "topk", "k"):
            if getattr(self, name) <= 0:
                raise ValueError(f"BlockConfig.{name} must be positive, got {getattr(self, name)}")

    @property
    def build_budget(self) -> int:
        """The nodes each round's DDTree is built with: rule.cap under a rule, else budget."""
        return self.budget if self.rule is None else self.rule.cap


@dataclass(frozen=True)
class DecodeConfig:
    """One generation call: budget, sampling and the tree settings."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    tree: TreeConfig = TreeConfig()
    block: BlockConfig = BlockConfig()

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
