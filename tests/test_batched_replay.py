"""The batched replay (collectors/collect/forest.py, grow.py) against the per-start replay.

Every mid row the forest serves is the mid drafter's own row of that context; replayed both ways,
the (round start, schedule) rows are equal or differ at a classified near-tie of the mid's scores
(collectors/collect/replay_check.py), in fp32 and in bf16; the policy replay from a filled StepMemo
and the budget sweep give the per-start replay's trajectories.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import noisy_copy, repeated_prompts, tiny_model

from collectors.collect.forest import TEXT, MidForest
from collectors.collect.policy_replay import StepMemo, replay_policy
from collectors.collect.replay import Replayer
from collectors.collect.replay_check import Fp32Judge, ReplayCheck, check_prompt, classify, counts_of
from collectors.pricing.budget_sweep import SweepReplayer, sweep_prompt
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.policies import StepContext, schedule_bits
from decoder.core.state import step_signals
from decoder.core.tree import DraftTree
from decoder.models.pair import make_pair

SCHEDULES = [schedule_bits(s, 5) for s in range(32)]


def _pair(arch: str, dtype: torch.dtype = torch.float32):
    target = tiny_model(arch, seed=51)
    mid = noisy_copy(target, 0.3, seed=52)
    return make_pair(target.to(dtype), mid.to(dtype), eos_token_ids=(0,))


def _prompts(n: int = 2) -> list[list[int]]:
    return repeated_prompts(n, 53, base=(5, 20), cut=(10, 50))


def test_every_forest_row_is_the_mid_drafters_own_row_of_its_context() -> None:
    """Forwards of a few rows each (so one step's nodes go out in several forwards, not in the order
    they were created): every node's row equals a plain causal forward of its context."""
    pair = _pair("qwen3")
    rep = Replayer(pair, DecodeConfig(max_new_tokens=16), SCHEDULES, 0, batch_rows=7)
    inputs = rep.inputs(_prompts(1)[0])
    rep.grow_all(inputs)
    forest, judge = inputs.forest, Fp32Judge(pair.mid, pair.vocab_size)
    assert forest is not None and forest.forwards > 10 and len(forest.nodes) > 100
    text = inputs.text
    for node in range(0, len(forest.nodes), 3):
        tail, up = [], node
        while up != TEXT:
            tail.append(forest.nodes[up].token)
            up = forest.nodes[up].parent
        context = [*text[: forest.nodes[node].anchor + 1], *reversed(tail)]
        want = torch.log_softmax(judge.logits(context), dim=-1)
        assert torch.allclose(forest.logp[forest.node_row(node)], want, atol=1e-5), node
    for position in range(forest.first_row, forest.n_text):
        want = torch.log_softmax(judge.logits(text[: position + 1]), dim=-1)
        assert torch.allclose(forest.logp[forest.text_row(position)], want, atol=1e-5), position


def test_a_forest_shares_a_context_between_round_starts() -> None:
    """Start s's node after T[s] (the text's next token) is the text row of start s + 1's root, and
    two starts drafting the same off-text token after the same text position get one node."""
    pair = _pair("llama")
    text = _prompts(1)[0] + [7, 9, 11, 13]
    forest = MidForest(pair.mid, pair.vocab_size, text, 5)
    root = forest.root(8)
    on_text, new = forest.child_row(root, text[8])
    assert (on_text, new) == (forest.root(9), False)
    first, created = forest.child_row(root, 95 if text[8] != 95 else 94)
    again, created_again = forest.child_row(forest.root(8), 95 if text[8] != 95 else 94)
    assert created and not created_again and first == again
    with pytest.raises(ValueError, match="max_rows"):
        MidForest(pair.mid, pair.vocab_size, text, 5, max_rows=0)


CASES = [
    ("qwen3", torch.float32),
    ("llama", torch.float32),
    ("qwen3", torch.bfloat16),
    ("llama", torch.bfloat16),
]


@pytest.mark.parametrize(("arch", "dtype"), CASES)
def test_batched_rows_equal_the_per_start_rows_up_to_classified_near_ties(
    arch, dtype, record_property
) -> None:
    """Every (start, schedule) row of every start of two prompts, replayed both ways: equal, or a
    difference classified from the mid recomputed in fp32, with no real mismatch. In fp32 (sums in
    another order only) the trajectories are equal too."""
    pair = _pair(arch, dtype)
    config = DecodeConfig(max_new_tokens=24)
    one, batched = Replayer(pair, config, SCHEDULES, 1), Replayer(pair, config, SCHEDULES, 1, batch_rows=64)
    check, judge = ReplayCheck(), Fp32Judge(pair.mid, pair.vocab_size)
    for prompt in _prompts():
        check_prompt(one, batched, prompt, judge, check)
    record_property("share_differing", check.share_differing)
    assert check.rows == 2 * 32 * 23 and not check.real_mismatches, check.real_mismatches[:3]
    if dtype == torch.float32:
        assert check.equal_trajectories == check.trajectories


class _Judge:
    """A stand-in for Fp32Judge with a fixed row."""

    def __init__(self, row: list[float]) -> None:
        self.row = torch.tensor(row)

    def logits(self, context) -> torch.Tensor:
        return self.row


def _tree(children: list[tuple[int, int, float]]) -> DraftTree:
    tree = DraftTree(1)
    for parent, token, logp in children:
        tree.add_child(parent, token, logp, step=1)
    return tree


def test_the_classifier_tells_a_near_tie_from_a_real_mismatch() -> None:
    """Two trees whose root grew another first child: a near-tie when the two tokens' fp32 logits
    are within four bf16 ulps of the top, a real mismatch when they are far apart; the same tree
    verified in another order is a near-tie of its path scores only when they are that close."""
    config, bits, committed = TreeConfig(), (True, False, False, False, False), [3, 1]
    a, b = _tree([(0, 5, -0.7)]), _tree([(0, 6, -0.7)])
    near = classify(a, b, bits, config, committed, _Judge([0.0, 0, 0, 0, 0, 9.0, 8.99]), torch.bfloat16)
    far = classify(a, b, bits, config, committed, _Judge([0.0, 0, 0, 0, 0, 9.0, 2.0]), torch.bfloat16)
    assert near[0] == far[0] == "children"
    assert near[1] <= near[2] and far[1] > far[2]
    assert (
        classify(a, b, bits, config, committed, _Judge([0.0] * 5 + [9.0, 8.99]), torch.float32)[1]
        > 2.0**-14 * 9
    )
    x, y = _tree([(0, 5, -0.5), (0, 6, -0.5001)]), _tree([(0, 5, -0.5002), (0, 6, -0.5)])
    kind, gap, tol = classify(x, y, bits, TreeConfig(budget=1), committed, None, torch.bfloat16)
    assert kind == "prune" and gap <= tol
    same = classify(x, x, bits, TreeConfig(budget=1), committed, None, torch.bfloat16)
    assert same[0] == "scores" and math.isinf(same[1])


class _Thresholded:
    def __init__(self, width: int, threshold: float) -> None:
        self.width, self.threshold = width, threshold

    def __call__(self, ctx: StepContext) -> bool:
        sig = step_signals(ctx.state, self.width)
        return sig[2] < (self.threshold if sig[-1] < 2 else self.threshold - 2.0)


def test_policies_from_a_filled_step_memo_replay_as_the_per_start_replay() -> None:
    """A StepMemo filled by the batched grow serves every policy with no mid forward of its own:
    the same decisions and rounds as the per-start replay's policy replay (fp32)."""
    pair = _pair("qwen3")
    config = DecodeConfig(max_new_tokens=24)
    one = Replayer(pair, config, SCHEDULES, 0)
    batched = Replayer(pair, config, SCHEDULES, 0, batch_rows=64)
    for prompt in _prompts():
        inputs, b_inputs = one.inputs(prompt), batched.inputs(prompt)
        memo = StepMemo()
        grown = memo.fill(batched, b_inputs)
        forwards = b_inputs.forest.forwards
        for t in (-6.0, -3.7, -2.0):
            alone = replay_policy(one, inputs, _Thresholded(config.tree.width, t), None)
            filled = replay_policy(batched, b_inputs, _Thresholded(config.tree.width, t), None, memo)
            assert filled.bits == alone.bits
            assert [counts_of(r) for r in filled.rounds] == [counts_of(r) for r in alone.rounds]
            flat = [x for r in alone.rounds for step in r.signals for x in step]
            assert [x for r in filled.rounds for step in r.signals for x in step] == pytest.approx(
                flat, abs=1e-5
            )
        assert b_inputs.forest.forwards == forwards  # the policies ran no forward
        fixed = batched.replay_prompt(prompt, b_inputs, grown)
        assert [r.accepted for r in fixed.rounds[31]] == [
            r.accepted for r in one.replay_prompt(prompt, inputs).rounds[31]
        ]


def test_the_budget_sweep_walks_the_per_start_outcomes() -> None:
    """sweep_prompt batched and one start at a time: the same walk under every budget (fp32)."""
    pair = _pair("llama")
    config = DecodeConfig(max_new_tokens=20, tree=TreeConfig(budget=12))
    schedules = [schedule_bits(0, 5), schedule_bits(31, 5)]
    budgets = list(range(1, 13))
    prompt = _prompts(1)[0]
    a = sweep_prompt(SweepReplayer(pair, config, schedules, 0), prompt, budgets)
    b = sweep_prompt(SweepReplayer(pair, config, schedules, 0, batch_rows=64), prompt, budgets)
    assert a[2] == b[2] and a[0].keys() == b[0].keys()
    for key in a[0]:
        assert [r.accepted for r in a[0][key].rounds] == [r.accepted for r in b[0][key].rounds], key
