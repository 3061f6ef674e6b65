"""GRAFT's learned budget: one DDTree budget per pair, chosen offline on the collect prompts.

Contract:
- :func:`choice_specs` names the prompts the choice may read: the first
  ``graft_eval.choice_prompts_per_dataset`` (at most ``edges.prompts_per_dataset``) questions from
  ``collect.prompt_start`` of each ``edges.datasets`` entry that is not in
  ``evaluate.held_out_datasets``, i.e. the prompts collect_edges decoded and fit_edges fitted TDES
  on. A slice reaching ``evaluate.prompt_start`` is refused: the held-back prompts stay unseen.
- :func:`walk_choice_prompt` takes its greedy continuation (from a batch, or decoded with DDTree at
  the collect budget), checks it with the lossless gate, and readies its exact walks at every B <= b_max
  (collectors/graft/walk.py, BudgetWalker) with plain marginals and with the TDES scorer
  (evaluate_graft walks its held-back prompts the same way).
- :func:`learned_budget` is the argmax over B of the summed tokens over the summed priced ms of
  every walked prompt at B (ties: the smaller B); with a fixed AR price that is the argmax of the
  pooled priced speedup.
- :func:`rule_speedup` is the same pooled priced speedup for a per-round budget rule
  (decoder/graft/budget.py), each prompt walked under the rule; the pipeline fits the rule's node
  model on these walkers' node rows (models/gain_fit.py) and picks its cap by it.
- Per task: :func:`arm_totals` prices one prompt's walks under every arm of :func:`choice_arms`
  (each fixed B with and without TDES, and the pair's per-round rules); :func:`best_arm` is the arm
  with the most summed tokens per summed priced ms over a set of prompts;
  :func:`left_out_speedups` prices every collect prompt at the arm chosen without it, on the other
  prompts of its own task and on all other prompts: the out-of-fold comparison that decides whether
  a pair's budget is chosen per task or once for all tasks.
- :func:`walk_choice_groups` walks every prompt of :func:`choice_specs`, its output taken from the
  collect stage's continuations where they hold every prompt of a dataset
  (collectors/graft/outputs.py), else decoded in a batch; :func:`per_task_choice` gives each
  fitting task its best arm and says, by :func:`left_out_speedups`, whether per task is used.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from collectors.collect.batch_greedy import NOT_GREEDY
from collectors.collect.plan import report_questions
from collectors.collect.report import ReportSpec
from collectors.graft.costs import GraftCosts
from collectors.graft.outputs import collected_outputs, greedy_outputs
from collectors.graft.walk import ArmRun, BudgetWalker, Round, decode_arm, gate_check, lossless_gate
from config.params import Params
from decoder.core.config import BlockBudgetRule
from decoder.graft.block import BlockProposer, Marginals
from decoder.graft.edge_scorer import EdgeScorer
from decoder.models.pair import ModelPair

log = logging.getLogger(__name__)


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
    """One prompt's exact walks, by marginals and by TDES, and its decode."""

    plain: BudgetWalker
    tdes: BudgetWalker
    run: ArmRun | None  # DDTree at the collect budget, by marginals (None: the output came checked)

    @property
    def output(self) -> list[int]:
        """The target's greedy continuation: the text every walk follows."""
        return self.plain.tokens


def walk_choice_prompt(
    pair: ModelPair,
    proposer: BlockProposer,
    scorer: EdgeScorer,
    prompt: list[int],
    collect_budget: int,
    b_max: int,
    topk: int,
    max_new_tokens: int,
    output: list[int] | None = None,
) -> ChoiceWalks:
    """Ready ``prompt``'s walks at every B <= b_max along its greedy continuation. ``output``: that
    continuation if already known (collectors/collect/batch_greedy.py greedy_batch), used where the lossless
    gate's forward agrees with every token; otherwise (and where it is not given) the prompt is
    decoded at the collect budget and that output is gated (a batch can break a near-tie the other
    way: the unbatched target decides)."""
    layers = tuple(proposer.target_layers)
    run, features = None, None
    if output is not None:
        check, features = gate_check(pair, prompt, output, layers)
        if check.wrong is not None:
            log.warning(NOT_GREEDY, check.wrong)
            features = None
    if features is None:
        run = decode_arm(pair, proposer, None, prompt, collect_budget, topk, max_new_tokens)
        output, features = run.tokens, lossless_gate(pair, prompt, run.tokens, layers)
    proposals: dict[int, Marginals] = {}
    walkers = [
        BudgetWalker(proposer, prompt, output, features, b_max, topk, pair.vocab_size, s, proposals)
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


Arm = tuple[int, bool, BlockBudgetRule | None]  # (B, or the rule's cap; TDES; per-round rule or None)


def choice_arms(b_max: int, rules: Sequence[BlockBudgetRule | None] = (None, None)) -> list[Arm]:
    """What a task's budget is chosen among: every fixed B in 1..b_max without and with TDES (B
    ascending, plain first), then the per-round rules by marginals and by TDES (None: left out)."""
    arms: list[Arm] = [(b, tdes, None) for b in range(1, b_max + 1) for tdes in (False, True)]
    return arms + [(r.cap, tdes, r) for tdes, r in zip((False, True), rules, strict=True) if r is not None]


def arm_totals(walks: ChoiceWalks, costs: GraftCosts, arms: Sequence[Arm]) -> np.ndarray:
    """(len(arms), 2): (emitted tokens, priced ms) of one prompt walked under each arm."""
    out = np.zeros((len(arms), 2))
    for i, (budget, tdes, rule) in enumerate(arms):
        walker = walks.tdes if tdes else walks.plain
        if rule is None:
            out[i] = priced_totals(walker.fixed(budget), functools.partial(round_price, costs, tdes, False))
        else:
            out[i] = priced_totals(walker.ruled(rule), functools.partial(rule_price, costs, tdes, rule.cap))
    return out


def best_arm(totals: np.ndarray) -> int:
    """The arm (index) with the most summed tokens per summed priced ms over the prompts of
    ``totals`` (:func:`arm_totals` stacked on a first axis); ties: the first in :func:`choice_arms`
    order (the smaller B, then without TDES)."""
    if totals.ndim != 3 or not len(totals):
        raise ValueError(f"best_arm needs the arm totals of >= 1 prompt, got shape {totals.shape}")
    summed = totals.sum(axis=0)
    if not (summed[:, 1] > 0).all():
        raise ValueError("an arm has no priced rounds on these prompts")
    return int(np.argmax(summed[:, 0] / summed[:, 1]))


def left_out_speedups(tasks: dict[str, np.ndarray], ar_token_ms: float) -> tuple[float, float]:
    """(per task, pooled): the priced speedup over every collect prompt, each priced at the arm
    :func:`best_arm` chooses without it, on its task's other prompts (per task) or on every other
    prompt (pooled). ``tasks``: task -> its prompts' stacked :func:`arm_totals`, >= 2 prompts each."""
    if not tasks or min(len(t) for t in tasks.values()) < 2:
        sizes = {k: len(v) for k, v in tasks.items()}
        raise ValueError(f"leaving a prompt out needs >= 2 prompts per task, got {sizes}")
    everything = np.concatenate(list(tasks.values()))
    got = {"task": np.zeros(2), "pooled": np.zeros(2)}
    offset = 0
    for prompts in tasks.values():
        for i in range(len(prompts)):
            for key, pool, at in (("task", prompts, i), ("pooled", everything, offset + i)):
                got[key] += pool[at, best_arm(np.delete(pool, at, axis=0))]
        offset += len(prompts)
    return tuple(float(t * ar_token_ms / ms) for t, ms in (got["task"], got["pooled"]))  # type: ignore[return-value]


@dataclass(frozen=True)
class ChoicePrompts:
    """The budget choice's walked collect prompts: one group per fitting dataset, in spec order."""

    specs: list[ReportSpec]
    groups: list[list[ChoiceWalks]]
    reused: int  # datasets whose outputs came from the collect stage's continuations, not a batch

    @property
    def by_task(self) -> dict[str, list[ChoiceWalks]]:
        return {s.dataset_id: g for s, g in zip(self.specs, self.groups, strict=True)}


def walk_choice_groups(
    params: Params,
    pair: ModelPair,
    pair_id: str,
    proposer: BlockProposer,
    scorer: EdgeScorer,
    collected: Mapping[tuple[str, str], Sequence[int]] | None = None,
) -> ChoicePrompts:
    """Every choice prompt of the pair walked (:func:`walk_choice_prompt`), by fitting dataset.
    ``collected``: the collect stage's continuations (collectors.collect.report.read_continuations)."""
    cfg, edges = params.graft_eval, params.edges
    groups, reused = [], 0
    specs = choice_specs(params, pair_id)
    for spec in tqdm(specs, desc=f"evaluate_graft {pair_id} (budget choice)", unit="dataset"):
        prompts = report_questions(params, spec, pair.tokenizer)[1]
        known = collected_outputs(params, collected or {}, pair_id, prompts, pair.eos_token_ids)
        reused += known is not None
        outputs = greedy_outputs(pair, prompts, cfg.max_new_tokens, known)
        groups.append([walk_choice_prompt(pair, proposer, scorer, prompt, edges.budget, cfg.budget_max,
                                          edges.topk, cfg.max_new_tokens, output)
                       for prompt, output in zip(prompts, outputs, strict=True)])  # fmt: skip
    return ChoicePrompts(specs, groups, reused)


def per_task_choice(
    tasks: Mapping[str, Sequence[ChoiceWalks]],
    costs: GraftCosts,
    rules: Sequence[BlockBudgetRule | None],
    b_max: int,
) -> tuple[dict, dict[str, Arm]]:
    """(summary, each task's best arm of :func:`choice_arms`). The summary holds each task's arm and
    ``use``: whether, leaving each prompt out in turn, the per-task arms price faster than the pooled
    ones (:func:`left_out_speedups`; needs >= 2 tasks of >= 2 prompts, else False)."""
    arms = choice_arms(b_max, rules)
    totals = {task: np.stack([arm_totals(w, costs, arms) for w in g]) for task, g in tasks.items()}
    task_arms = {task: arms[best_arm(t)] for task, t in totals.items()}
    summary = {
        t: {"budget": b, "tdes": tdes, "rule": rule is not None} for t, (b, tdes, rule) in task_arms.items()
    }
    out: dict = {"arms": summary, "use": False}
    if len(totals) >= 2 and min(len(t) for t in totals.values()) >= 2:
        by_task, pooled = left_out_speedups(totals, costs.ar_token_ms)
        out.update(left_out_speedup=by_task, left_out_speedup_pooled=pooled, use=by_task > pooled)
    return out, task_arms
