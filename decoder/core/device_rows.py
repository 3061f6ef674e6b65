"""Probability rows that stay on the model's device (the torch side of decoder/core/sampling.py).

Only the candidates' probabilities and the row's mass come to the host; a residual draw is an
inverse-CDF lookup on the device, so one token id comes back per draw, never the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from decoder.core.sampling import sample_token


class TorchRow:
    """A decoder.core.sampling.ProbRow over a 1-D tensor on any device."""

    def __init__(self, probs: torch.Tensor) -> None:
        if probs.dim() != 1:
            raise ValueError(f"a probability row is 1-D, got shape {tuple(probs.shape)}")
        # float64 where the device has it, so cumulative sums over a large vocabulary stay exact
        self.p = probs.double() if probs.device.type != "mps" else probs.float()

    def probs_of(self, tokens: Sequence[int]) -> np.ndarray:
        idx = torch.tensor(list(tokens), dtype=torch.long, device=self.p.device)
        return self.p[idx].cpu().numpy()

    def mass(self) -> float:
        return float(self.p.sum())

    def inverse_cdf(self, removed: Sequence[int], u: float) -> int:
        p = self.p
        if removed:
            p = p.clone()
            p[torch.tensor(list(removed), dtype=torch.long, device=p.device)] = 0.0
        cdf = torch.cumsum(p, dim=0)
        total = float(cdf[-1])
        if total <= 0:
            raise ValueError("target distribution has no mass outside the rejected candidates")
        x = torch.tensor([u * total], dtype=cdf.dtype, device=cdf.device)
        return min(int(torch.searchsorted(cdf, x, right=True)[0]), len(p) - 1)


def next_token(logits: torch.Tensor, temperature: float, rng: np.random.Generator) -> int:
    """The target's next token from its logits row [V]: the argmax at temperature 0, else one draw
    from softmax(logits / temperature) on the device (the autoregressive baseline's own rule)."""
    if temperature == 0:
        return int(logits.argmax())
    return sample_token(TorchRow(torch.softmax(logits / temperature, dim=-1)), rng)
