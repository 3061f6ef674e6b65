"""GRAFT's per-task budget choice (collectors/graft/budget.py): best_arm and left_out_speedups on
hand-built arm totals, where the right answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from collectors.graft.budget import best_arm, choice_arms, left_out_speedups
from decoder.core.config import BlockBudgetRule

B_MAX = 4
ARMS = choice_arms(B_MAX)  # fixed B only: (B, TDES, None)


def prompt(rates: dict[tuple[int, bool], float], tokens: float = 10.0, base: float = 1.0) -> np.ndarray:
    """One prompt's (arms, 2) totals: every arm emits ``tokens`` in ``tokens / rate`` ms, where
    ``rate`` is ``base`` unless ``rates`` names the arm (B, TDES)."""
    return np.array([(tokens, tokens / rates.get((b, t), base)) for b, t, _ in ARMS])


def best(totals: np.ndarray) -> tuple[int, bool]:
    b, tdes, _ = ARMS[best_arm(totals)]
    return b, tdes


def test_best_arm_pools_tokens_over_ms_not_the_mean_of_ratios() -> None:
    # (1, plain) is 4x on a short prompt and 1x on a long one; (2, TDES) is 1.5x on both. The mean of
    # per-prompt ratios favours (1, plain) (2.5 > 1.5); summed tokens over summed ms favour (2, TDES)
    short = prompt({(1, False): 4.0, (2, True): 1.5}, tokens=2.0)
    long = prompt({(1, False): 1.0, (2, True): 1.5}, tokens=100.0)
    assert best(np.stack([short, long])) == (2, True)
    assert best(short[None]) == (1, False)


def test_best_arm_breaks_ties_by_the_smaller_budget_then_without_tdes() -> None:
    tie = prompt({(3, True): 2.0, (2, True): 2.0, (4, False): 2.0})
    assert best(tie[None]) == (2, True)
    tie = prompt({(2, True): 2.0, (2, False): 2.0})
    assert best(tie[None]) == (2, False)
    with pytest.raises(ValueError, match=">= 1 prompt"):
        best_arm(np.zeros((0, len(ARMS), 2)))
    with pytest.raises(ValueError, match="no priced rounds"):
        best_arm(np.zeros((1, len(ARMS), 2)))


def test_tasks_with_different_best_arms_price_faster_chosen_per_task() -> None:
    # code is fastest at (1, plain) (2x), chat at (4, TDES) (2.5x): out of fold, each task's own
    # prompts point to its arm
    code = np.stack([prompt({(1, False): 2.0, (4, True): 1.2}) for _ in range(3)])
    chat = np.stack([prompt({(4, True): 2.5}) for _ in range(3)])
    by_task, pooled = left_out_speedups({"code": code, "chat": chat}, ar_token_ms=1.0)
    assert by_task == pytest.approx(60 / (30 / 2.0 + 30 / 2.5))
    # pooled: (4, TDES) wins every fold (leaving out code: 50 tokens in 28.7 ms against 40 ms at
    # (1, plain); leaving out chat: 33 ms against 35 ms), so code's prompts are priced at 1.2x
    assert pooled == pytest.approx(60 / (30 / 1.2 + 30 / 2.5))
    assert by_task > pooled


def test_a_left_out_prompt_never_votes_for_its_own_arm() -> None:
    # each prompt is fast only at an arm no other prompt of its task likes: chosen without it, it is
    # priced at another prompt's arm (1x); a choice that saw it would price it at 3x
    one = np.stack([prompt({(1, False): 3.0}), prompt({(2, False): 3.0})])
    two = np.stack([prompt({(3, False): 3.0}), prompt({(4, False): 3.0})])
    by_task, pooled = left_out_speedups({"one": one, "two": two}, ar_token_ms=1.0)
    assert by_task == pytest.approx(1.0) and pooled == pytest.approx(1.0)
    # a choice that saw the prompt would price it at 3x
    assert [best(p[None]) for p in (*one, *two)] == [(1, False), (2, False), (3, False), (4, False)]


def test_leaving_a_prompt_out_needs_two_prompts_per_task() -> None:
    with pytest.raises(ValueError, match=">= 2 prompts per task"):
        left_out_speedups({"code": np.stack([prompt({}), prompt({})]), "chat": prompt({})[None]}, 1.0)
    with pytest.raises(ValueError, match=">= 2 prompts per task"):
        left_out_speedups({}, 1.0)


def test_the_arms_are_every_fixed_budget_with_and_without_tdes_then_the_rules() -> None:
    rule = BlockBudgetRule((0.0,) * 4, 0.0, (1.0, 2.0, 3.0), 1.0)  # cap 2
    assert choice_arms(2, (None, rule)) == [
        (1, False, None), (1, True, None), (2, False, None), (2, True, None), (2, True, rule)
    ]  # fmt: skip
    assert len(choice_arms(3, (rule, rule))) == 8 and choice_arms(3, (rule, None))[-1] == (2, False, rule)
