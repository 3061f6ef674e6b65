"""The target's top-m rows of a prompt's text, as a replay's n-gram drafter holds them: what a stored
fixed part keeps (collectors/evaluation/fixed_cells.py) so that a later replay of the same prompts
runs no target forward (collectors/evaluation/priced_eval.py MemoReplayer.seed).
"""

from __future__ import annotations

from collections.abc import Sequence

from collectors.collect.branch import ReadLog
from decoder.core.config import TreeConfig
from decoder.core.ngram import NgramDrafter

# The target's top-m rows of a prompt's text (prompt + g), position 0 on: per position its tokens
# and their log-probs, best first, as the replay's n-gram drafter holds them (rows_and_check)
TargetRows = tuple[tuple[tuple[int, ...], ...], tuple[tuple[float, ...], ...]]


def drafter_from_rows(
    tree: TreeConfig, prompt: Sequence[int], text: Sequence[int], rows: TargetRows
) -> NgramDrafter:
    """The n-gram drafter :meth:`Replayer.rows_and_check` builds for ``text``, from its stored rows
    (:func:`drafter_rows`)."""
    tokens, logps = rows
    if len(tokens) != len(text) - 1 or len(logps) != len(tokens):
        raise ValueError(f"stored rows cover {len(tokens)} positions, the text needs {len(text) - 1}")
    ngram = NgramDrafter.for_tree(tree)
    ngram.cache = ReadLog(len(prompt))
    ngram.cache.set_rows(0, [list(t) for t in tokens], [list(lp) for lp in logps])
    return ngram


def drafter_rows(ngram: NgramDrafter, text: Sequence[int]) -> TargetRows:
    """The rows a replay's n-gram drafter holds for ``text``: one per position but the last."""
    entries = ngram.cache.entries
    if len(entries) != len(text) - 1 or any(e is None for e in entries):
        raise RuntimeError("the replay's n-gram drafter lacks a row of the text")
    return tuple(tuple(e) for e in entries), tuple(tuple(e.values()) for e in entries)  # type: ignore[union-attr]
