"""GRAFT's learned budget: one DDTree budget per pair, chosen offline on the collect prompts.

Contract:
- :func:`choice_specs` names the prompts the choice may read: the first
  ``graft_eval.choice_prompts_per_dataset`` (at most ``edges.prompts_per_dataset``) questions from
  ``collect.prompt_start`` of each ``edges.datasets`` entry that is not in
  ``evaluate.held_out_datasets``, i.e. the prompts collect_edges decoded and fit_edges fitted TDES
  on. A slice reaching ``evaluate.prompt_start`` is refused: the held-back prompts stay unseen.
- :func:`walk_choice_prompt` decodes one of them greedily with DDTree at the collect budget, checks
  the output with the lossless gate, and readies its exact walks at every B <= b_max
  (collectors/graft_eval.py, BudgetWalker) with plain marginals and with the TDES scorer
  (evaluate_graft walks its held-back prompts the same way).
- :func:`learned_budget` is the argmax over B of the summed tokens over the summed priced ms of
  every walked prompt at B (ties: the smaller B); with a fixed AR price that is the argmax of the
  pooled priced speedup.
- :func:`rule_speedup` is the same pooled priced speedup for a per-round budget rule
  (decoder/block_budget.py), each prompt walked under the rule; the pipeline fits the rule's node
  model on these walkers' node rows (models/gain_fit.py) and picks its cap by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from collectors.graft_costs import GraftCosts
from collectors.graft_eval import ArmRun, BudgetWalker, Round, decode_arm, lossless_gate
from collectors.report import ReportSpec
from config.params import Params
from decoder.block import BlockProposer, Marginals
from decoder.config import BlockBudgetRule
from decoder.edge_scorer import EdgeScorer
from decoder.models import ModelPair


def choice_specs(params: Params, pair_id: str) -> list[ReportSpec]:
    """The collect-prompt slices of the fitting datasets the budget choice reads (module docstring)."""
    held_out = set(params.evaluate.held_out_datasets)
    datasets = [d for d in params.edges.datasets if d not in held_out]
    if not datasets:
        raise ValueError(
            f"edges.datasets {list(params.edges.datasets)}: none is a fitting dataset "
            f"(all are in evaluate.held_out_datasets), nothing to choose the learned budget on"
        )
    n = min(params.graft_eval.choice_prompts_per_dataset, params.edges.prompts_per_dataset)
    start = params.collect.prompt_start
    if start + n > params.evaluate.prompt_start:
        raise ValueError(
            f"graft_eval.choice_prompts_per_dataset: {n} questions from collect.prompt_start={start} reach "
            f"evaluate.prompt_start={params.evaluate.prompt_start}: the held-back prompts must stay unseen"
        )
    return [ReportSpec(pair_id, d, start, start + n) for d in datasets]


@dataclass(frozen=True)
class ChoiceWalks:
    """One prompt's exact walks, by marginals and by TDES, and the decode they walk."""

    plain: BudgetWalker
    tdes: BudgetWalker
    run: ArmRun  # DDTree at the collect budget, by marginals: the output every walk follows


def walk_choice_prompt(
    pair: ModelPair,
    proposer: BlockProposer,
    scorer: EdgeScorer,
    prompt: list[int],
    collect_budget: int,
    b_max: int,
    topk: int,
    max_new_tokens: int,
) -> ChoiceWalks:
    """Decode ``prompt`` at the collect budget (lossless-gated) and ready its walks at every B <= b_max."""
    run = decode_arm(pair, proposer, None, prompt, collect_budget, topk, max_new_tokens)
    features = lossless_gate(pair, prompt, run.tokens, tuple(proposer.target_layers))
    proposals: dict[int, Marginals] = {}
    walkers = [
        BudgetWalker(proposer, prompt, run.tokens, features, b_max, topk, pair.vocab_size, s, proposals)
        for s in (None, scorer)
    ]
    return ChoiceWalks(walkers[0], walkers[1], run)


def round_price(costs: GraftCosts, tdes: bool, saba: bool, r: Round) -> float:
    """A fixed-budget round's priced ms (TDES and SABA as given)."""
    return costs.round_ms(r.nodes, tdes, saba)


def rule_price(costs: GraftCosts, tdes: bool, cap: int, r: Round) -> float:
    """A round's priced ms under a per-round rule built at ``cap``."""
    return costs.rule_round_ms(r.nodes, cap, tdes)


def priced_totals(rounds: Sequence[Round], price: Callable[[Round], float]) -> tuple[int, float]:
    """(emitted tokens, priced ms) summed over ``rounds``."""
    return sum(r.emitted for r in rounds), sum(price(r) for r in rounds)


def totals_speedup(totals: Sequence[tuple[int, float]], ar_token_ms: float) -> float:
    """Summed tokens x AR's ms per token over the summed priced ms of several :func:`priced_totals`."""
    tokens, ms = sum(t for t, _ in totals), sum(m for _, m in totals)
    if not tokens or ms <= 0:
        raise ValueError("no priced rounds on the collect prompts")
    return tokens * ar_token_ms / ms


def pooled_speedup(
    prompts: Sequence[Sequence[Round]], price: Callable[[Round], float], ar_token_ms: float
) -> float:
    """Summed tokens x AR's ms per token over the summed priced ms of every prompt's rounds."""
    return totals_speedup([priced_totals(p, price) for p in prompts], ar_token_ms)


def learned_budget(
    walkers: Sequence[BudgetWalker], price: Callable[[Round], float], ar_token_ms: float, b_max: int
) -> tuple[int, list[float]]:
    """(the B in 1..b_max with the most summed tokens per summed priced ms over ``walkers``, the
    pooled priced speedup at every B in 1..b_max)."""
    if not walkers:
        raise ValueError("the learned budget needs at least one walked collect prompt")
    curve = [pooled_speedup([w.fixed(b) for w in walkers], price, ar_token_ms) for b in range(1, b_max + 1)]
    best = max(range(b_max), key=lambda i: (curve[i], -i))
    return best + 1, curve


def rule_speedup(
    walkers: Sequence[BudgetWalker],
    rule: BlockBudgetRule,
    price: Callable[[Round], float],
    ar_token_ms: float,
) -> float:
    """The pooled priced speedup of walking every prompt under ``rule``."""
    if not walkers:
        raise ValueError("the budget rule needs at least one walked collect prompt")
    return pooled_speedup([w.ruled(rule) for w in walkers], price, ar_token_ms)
