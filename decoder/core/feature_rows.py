"""The target's hidden-state features of every cached position, kept aligned with its KV cache.

A block drafter (decoder/graft/block.py) reads, for each position the target has cached, the hidden
states at a few layers (indices into HF's ``hidden_states``: 0 = the embeddings, n = the last
layer), concatenated. The verifier appends the rows it keeps (prefill, then root + accepted path
each round). Storage grows by doubling, so a round costs O(rows appended), not O(context).
"""

from __future__ import annotations

import torch


def check_feature_layers(model: torch.nn.Module, layers: tuple[int, ...]) -> tuple[int, ...]:
    """The layers as ints, refused unless each is a valid hidden_states index of the model."""
    if not layers:
        return ()
    n = int(model.config.num_hidden_layers)
    bad = [i for i in layers if not 0 <= int(i) <= n]
    if bad:
        raise ValueError(f"feature layers {bad} outside [0, {n}] (hidden_states indices of the target)")
    return tuple(int(i) for i in layers)


class FeatureRows:
    """An append-only [n, width] tensor with amortised O(1) appends."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device, capacity: int = 256) -> None:
        self._data = torch.empty((capacity, width), dtype=dtype, device=device)
        self.n = 0

    def append(self, rows: torch.Tensor) -> None:
        """Add [r, width] rows after the existing ones."""
        r = rows.shape[0]
        if rows.shape[1:] != self._data.shape[1:]:
            raise ValueError(f"feature rows of width {tuple(rows.shape[1:])}, expected {self._data.shape[1]}")
        if self.n + r > self._data.shape[0]:
            grown = self._data.new_empty((max(2 * self._data.shape[0], self.n + r), self._data.shape[1]))
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n : self.n + r] = rows
        self.n += r

    def view(self) -> torch.Tensor:
        """The [n, width] rows so far (a view: valid until the next append)."""
        return self._data[: self.n]
