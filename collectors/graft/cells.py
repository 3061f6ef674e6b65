"""One cell of GRAFT's evaluation (a pair x dataset): every row walked on every prompt, decoded and
checked on the wall-clock prompts, and priced.

Contract (temperature 0):
- A row is an :data:`~collectors.graft.budget.Arm`, (B or the rule's cap, TDES, per-round rule or
  None). :func:`row_arms` gives a pair's rows from its measured costs and its budget choice
  (models/budget_choice.py); :func:`full_graft` the full GRAFT row of one dataset: the task's own
  arm where the choice uses per-task arms and has one for it, else TDES at the learned fixed B or
  the learned rule, whichever priced faster out of fold.
- :func:`walk_cell` walks every prompt along the target's greedy output under every row
  (collectors/graft/budget.py, walk_choice_prompt; the first ``n_wall`` prompts have no known output
  and are decoded at the fixed B). On those first ``n_wall`` prompts it also decodes every row for
  real (identical rows once) and autoregressive decoding, back to back, and raises RuntimeError
  where an output differs from the target's greedy continuation or a decode's rounds from its walk.
- :func:`evaluate_cell` prices the walked rounds (collectors/graft/table.py, row_stats; SABA rows
  pay the decision, rule rows pay theirs at the rule's cap), adds the best fixed B in hindsight
  over 1..b_max from the plain walks, DDTree at TDES's learned B, and the wall-clock speedups.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from collectors.graft.budget import Arm, ChoiceWalks, round_price, rule_price, walk_choice_prompt
from collectors.graft.costs import GraftCosts
from collectors.graft.table import ROWS, RowStats, row_stats
from collectors.graft.walk import ArmRun, Round, Walk, decode_ar, decode_arm
from decoder.core.config import BlockBudgetRule
from decoder.graft.block import BlockProposer
from decoder.graft.edge_scorer import EdgeScorer
from decoder.models.pair import ModelPair


@dataclass(frozen=True)
class GraftSetup:
    """What every cell of one pair is evaluated with."""

    pair: ModelPair
    drafter: BlockProposer
    scorer: EdgeScorer
    costs: GraftCosts
    budget: int  # DDTree's fixed B (edges.budget): its decode gives a wall-clock prompt's output
    b_max: int  # the largest B walked (graft_eval.budget_max)
    topk: int
    max_new_tokens: int


def row_arms(setup: GraftSetup, choice: Mapping, rules: Mapping[str, BlockBudgetRule]) -> dict[str, Arm]:
    """Each row's arm but full GRAFT's, keyed as collectors/graft/table.py's ROWS (the hindsight
    row is a grid, not an arm). ``choice``, ``rules``: models/budget_choice.py's choose_budgets."""
    b, b_max, costs = setup.budget, setup.b_max, setup.costs
    return {
        "ddtree": (b, False, None), "tdes": (b, True, None), "saba": (costs.saba(b_max, False), False, None),
        "graft": (costs.saba(b_max, True), True, None), "learned": (choice["plain"]["budget"], False, None),
        "graft_learned": (choice["tdes"]["budget"], True, None),
        "rule": (rules["plain"].cap, False, rules["plain"]),
        "graft_rule": (rules["tdes"].cap, True, rules["tdes"]),
    }  # fmt: skip


def full_graft(
    arms: Mapping[str, Arm], choice: Mapping, task_arms: Mapping[str, Arm], dataset: str
) -> tuple[Arm, dict]:
    """(full GRAFT's arm on ``dataset``, its JSON summary: budget, TDES, rule, per task)."""
    once = arms["graft_rule" if choice["tdes"]["use_rule"] else "graft_learned"]
    task = task_arms.get(dataset) if choice["per_task"]["use"] else None
    arm = once if task is None else task
    return arm, {"budget": arm[0], "tdes": arm[1], "rule": arm[2] is not None, "per_task": task is not None}


@dataclass(frozen=True)
class CellRuns:
    """A cell's rounds per row: walked on every prompt, decoded for real on the wall-clock prompts."""

    runs: dict[str, list[list[Round]]]  # row -> each prompt's walked rounds
    walks: list[Walk]  # each prompt's plain walk at every B (the hindsight grid)
    decoded: dict[str, list[ArmRun]]  # row -> its decode of each wall-clock prompt
    ar_runs: list[ArmRun]  # autoregressive decoding of each wall-clock prompt
    decodes: int  # real decodes, the walks' own included
    checked: int  # (prompt, row) decodes whose rounds the walk reproduced


def walked_rounds(walked: ChoiceWalks, walk: Walk, arm: Arm) -> list[Round]:
    """One prompt's rounds under ``arm``, from its walks (``walk``: its plain walk at every B)."""
    budget, tdes, rule = arm
    if rule is not None:
        return (walked.tdes if tdes else walked.plain).ruled(rule)
    return walked.tdes.fixed(budget) if tdes else walk.at(budget)


def decode_rows(
    setup: GraftSetup, label: str, index: int, prompt: list[int], walked: ChoiceWalks,
    arms: Mapping[str, Arm], rounds: Mapping[str, list[Round]],
) -> tuple[dict[str, ArmRun], int]:  # fmt: skip
    """(each row's real decode of the cell's prompt ``index``, how many decodes that took):
    identical arms decoded once, DDTree at the fixed B being the walk's own decode. Raises
    RuntimeError where a row's output is not the walk's or its rounds are not ``rounds[row]`` (its
    walked rounds); ``label`` names the cell in the message."""
    done: dict[Arm, ArmRun] = {(setup.budget, False, None): walked.run}  # type: ignore[dict-item]
    out, decodes = {}, 0
    for key, arm in arms.items():
        if arm not in done:
            budget, tdes, rule = arm
            done[arm] = decode_arm(setup.pair, setup.drafter, setup.scorer if tdes else None, prompt,
                                   budget, setup.topk, setup.max_new_tokens, rule)  # fmt: skip
            decodes += 1
        run = done[arm]
        if run.tokens != walked.output:
            raise RuntimeError(f"{label}: row {key!r} emitted another output than DDTree")
        if run.rounds != rounds[key]:
            raise RuntimeError(f"{label} prompt {index}: row {key!r}'s exact walk differs from its decoding")
        out[key] = run
    return out, decodes


def walk_cell(
    setup: GraftSetup, label: str, prompts: Sequence[list[int]], outputs: Sequence[list[int]],
    arms: Mapping[str, Arm], n_wall: int, progress: Callable[[], object] = lambda: None,
) -> CellRuns:  # fmt: skip
    """Every row's rounds on every prompt (module docstring). ``outputs``: the greedy outputs of the
    prompts after the first ``n_wall``; ``progress``: called once per prompt done."""
    runs: dict[str, list] = {key: [] for key in arms}
    decoded: dict[str, list] = {key: [] for key in arms}
    walks, ar_runs, decodes, checked = [], [], 0, 0
    for i, prompt in enumerate(prompts):
        output = outputs[i - n_wall] if i >= n_wall else None
        walked = walk_choice_prompt(setup.pair, setup.drafter, setup.scorer, prompt, setup.budget,
                                    setup.b_max, setup.topk, setup.max_new_tokens, output)  # fmt: skip
        decodes += walked.run is not None
        walks.append(walked.plain.every_budget())
        for key, arm in arms.items():
            runs[key].append(walked_rounds(walked, walks[-1], arm))
        if i < n_wall:
            rows, n = decode_rows(setup, label, i, prompt, walked, arms, {k: r[-1] for k, r in runs.items()})
            decodes, checked = decodes + n, checked + len(rows)
            for key, run in rows.items():
                decoded[key].append(run)
            ar_runs.append(decode_ar(setup.pair, prompt, setup.max_new_tokens))
            if ar_runs[-1].tokens != walked.output:
                raise RuntimeError(f"{label}: autoregressive decoding emitted another output")
        progress()
    return CellRuns(runs, walks, decoded, ar_runs, decodes, checked)


def wall_speedups(ar_runs: list, runs: dict[str, list]) -> dict[str, float]:
    """Per decoded row: AR's decoding seconds over the row's, summed over the cell's prompts (each
    prompt's rows and AR decoded back to back; prefill excluded on both sides, as in pricing)."""
    ar_s = sum(r.decode_s for r in ar_runs)
    return {key: ar_s / sum(r.decode_s for r in row) for key, row in runs.items()}


def cell_rows(
    costs: GraftCosts, arms: Mapping[str, Arm], cell: CellRuns, b_max: int
) -> tuple[dict[str, RowStats], list[RowStats]]:
    """(each row's stats, the hindsight row among them; plain DDTree's stats at every B in 1..b_max)."""
    rows = {}
    for key, (budget, tdes, rule) in arms.items():
        if rule is None:
            price = functools.partial(round_price, costs, tdes, key in ("saba", "graft"))
        else:
            price = functools.partial(rule_price, costs, tdes, rule.cap)
        rows[key] = row_stats(budget, cell.runs[key], price, costs.ar_token_ms)
    plain = functools.partial(round_price, costs, False, False)
    grid = [
        row_stats(bb, [w.at(bb) for w in cell.walks], plain, costs.ar_token_ms) for bb in range(1, b_max + 1)
    ]
    rows["hindsight"] = max(grid, key=lambda r: (r.speedup, -r.budget))
    return rows, grid


def evaluate_cell(
    setup: GraftSetup, cell: tuple[str, str], held_out: bool, prompts: Sequence[list[int]],
    outputs: Sequence[list[int]], arms: Mapping[str, Arm], n_wall: int,
    progress: Callable[[], object] = lambda: None,
) -> tuple[dict, CellRuns]:  # fmt: skip
    """(the cell's JSON record, its runs). ``cell``: (pair_id, dataset_id); ``held_out``: the
    dataset is a held-out task; ``arms``: every row's, full GRAFT's included; the rest as
    :func:`walk_cell`."""
    pair_id, dataset = cell
    walked = walk_cell(setup, f"{pair_id}/{dataset}", prompts, outputs, arms, n_wall, progress)
    rows, grid = cell_rows(setup.costs, arms, walked, setup.b_max)
    equal = grid[arms["graft_learned"][0] - 1]  # plain DDTree at TDES's learned B: A at equal budget
    record = {"pair_id": pair_id, "dataset_id": dataset, "group": "held-out task" if held_out else "fitting",
              "prompts": len(prompts), "rows": {k: rows[k].to_json() for k, _ in ROWS},
              "wall": wall_speedups(walked.ar_runs, walked.decoded), "wall_prompts": n_wall,
              "ddtree_at_tdes_learned_budget": equal.to_json(),
              "hindsight_grid": [list(r.prompt_ms) for r in grid]}  # fmt: skip
    return record, walked
