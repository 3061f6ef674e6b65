"""The zoo's learning-rate schedule: linear warm-up, then a cosine down towards a tenth of the peak."""

from __future__ import annotations

import math

import pytest
import torch

from models.lm_training import MIN_LR_RATE, warmup_cosine

LR = 3e-3


def intended(step: int, steps: int, warmup: int) -> float:
    """Warm-up (step + 1) / warmup of the peak; then 0.1 + 0.9 of a half cosine over the rest."""
    if step < warmup:
        return LR * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return LR * (MIN_LR_RATE + (1 - MIN_LR_RATE) * 0.5 * (1 + math.cos(math.pi * progress)))


def lrs(steps: int, warmup: int) -> list[float]:
    """The learning rate each optimizer step of a ``steps``-step run uses."""
    weight = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([weight], lr=LR)
    schedule = warmup_cosine(opt, steps, warmup)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        weight.sum().backward()
        opt.step()
        schedule.step()
    return out


def test_the_schedule_warms_up_then_decays_by_the_cosine_to_a_tenth() -> None:
    steps, warmup = 120, 20
    got = lrs(steps, warmup)
    assert got == pytest.approx([intended(s, steps, warmup) for s in range(steps)], rel=1e-12)
    assert got[0] == pytest.approx(LR / warmup, rel=1e-12)
    assert got[warmup - 1 : warmup + 1] == pytest.approx([LR, LR], rel=1e-12)  # warm-up ends at the peak
    assert got[warmup + (steps - warmup) // 2] == pytest.approx(LR * (1 + MIN_LR_RATE) / 2, rel=1e-12)
    assert LR * MIN_LR_RATE < got[-1] < LR * (MIN_LR_RATE + 1e-3)  # the floor, reached one past the end
    assert all(a > b for a, b in zip(got[warmup:], got[warmup + 1 :], strict=False))


@pytest.mark.parametrize(("steps", "warmup"), [(10, 0), (10, 1), (5, 8), (6, 5)])
def test_edge_warmups_follow_the_same_formula(steps: int, warmup: int) -> None:
    got = lrs(steps, warmup)
    assert got == pytest.approx([intended(s, steps, warmup) for s in range(steps)], rel=1e-12)


def test_a_negative_warmup_is_refused() -> None:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        warmup_cosine(opt, 10, -1)
