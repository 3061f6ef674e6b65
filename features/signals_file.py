"""The select_signals stage's choice, read back: the signal subset every later learning stage uses.

``<select_signals.out_dir>/signals.json`` holds ``signals`` (the ordered subset chosen on all folds)
and ``by_fold`` (per split, per outer fold, the subset chosen without that fold).
"""

from __future__ import annotations

import json

from config.params import Params, resolve


def _signals_file(params: Params) -> dict:
    path = resolve(params.select_signals.out_dir) / "signals.json"
    return json.loads(path.read_text(encoding="utf-8"))


def read_signals(params: Params) -> tuple[str, ...]:
    """The chosen ordered subset (read by every stage after select_signals)."""
    return tuple(_signals_file(params)["signals"])


def read_fold_signals(params: Params, split: str) -> list[tuple[str, ...]]:
    """Per outer fold of ``split`` (index = fold id), the subset chosen without that fold."""
    return [tuple(s) for s in _signals_file(params)["by_fold"][split]]
