"""The runtime costs a learned scheduler's context features read, and the context built from them.

Contract: a scheduler sees a `RuntimeContext` (prompt length, the time to verify its tree, the time
of a mid call over one step's frontier). The two times depend only on the pair's latency curves
and the tree shape, not on the prompt: :func:`runtime_costs` reads them from anything with
``verify_ms(n)``, ``mid_ms(n)`` and ``has_mid`` (decoder.deploy.latency.LatencyProfile), and
:meth:`RuntimeCosts.context` adds one prompt's length. A deployment bundle stores the two numbers,
so the decoder builds the same contexts as the pipeline without the profile or its code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from decoder.core.config import TreeConfig
from decoder.core.policies import RuntimeContext


class CostCurves(Protocol):
    """What :func:`runtime_costs` reads of a latency profile."""

    @property
    def has_mid(self) -> bool: ...

    def verify_ms(self, n_nodes: int) -> float: ...

    def mid_ms(self, n_tokens: int, n_fed: int = 0) -> float: ...


@dataclass(frozen=True)
class RuntimeCosts:
    """Typical ms to verify the tree (root + budget nodes) and of a mid call over W x m tokens."""

    target_ms: float
    mid_ms: float

    def context(self, prompt_tokens: float) -> RuntimeContext:
        """The context a scheduler sees on a prompt of ``prompt_tokens`` tokens."""
        return RuntimeContext(round(prompt_tokens), self.target_ms, self.mid_ms)


def runtime_costs(curves: CostCurves, tree: TreeConfig) -> RuntimeCosts:
    """The costs at the tree's shape: verify of budget + 1 nodes, a mid call over width x topk
    tokens (0 for a pair without a mid drafter)."""
    mid_ms = curves.mid_ms(tree.width * tree.topk) if curves.has_mid else 0.0
    return RuntimeCosts(curves.verify_ms(tree.budget + 1), mid_ms)
