"""Matplotlib figures for the stages' plots (Agg backend: files only, no display)."""

from __future__ import annotations

from typing import Any


def new_figure(width: float = 6.0, height: float = 4.0) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))
