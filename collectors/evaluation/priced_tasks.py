"""The evaluate stage's priced part as pool tasks: one task per (target, dataset), costliest first.

Cells whose pairs share a target checkpoint (zoo-l and zoo-lw: target-l) on the same dataset get
the same prompts' target work (g, its stop, the target's rows), so they form one task with one
``TargetMemo``; every other cell is a task of its own. Tasks run in ``collectors.collect.pool`` with
``evaluate.workers`` processes; the cells come back in the order they were asked for, equal field by
field to computing them one by one in this process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from collectors.collect.plan import (
    load_registered_pair,
    pair_tree,
    pass_profiles,
    profile_for,
    report_questions,
)
from collectors.collect.pool import Task, pool_device, run_tasks
from collectors.collect.records import runtime_for
from collectors.collect.report import ReportSpec
from collectors.evaluation.priced_eval import (
    Cell,
    PricedCell,
    TargetMemo,
    merge_parts,
    priced_cell,
    prompts_digest,
)
from collectors.pricing.budget_file import pair_schedule
from config.params import Params
from decoder.core.config import DecodeConfig


def cell_inputs(
    params: Params, pair_id: str, dataset: str, pair, n_prompts: int, start: int | None = None
) -> tuple:
    """(questions, prompts, profile, runtimes) of an evaluate cell's first ``n_prompts`` prompts
    (questions from ``start``, by default ``evaluate.prompt_start``: the held-back ones).

    One runtime context per prompt, with that prompt's own length, as a decoder serving it sees.
    """
    first = params.evaluate.prompt_start if start is None else start
    spec = ReportSpec(pair_id, dataset, first, first + n_prompts)
    questions, prompts = report_questions(params, spec, pair.tokenizer)
    profile = profile_for(params, pair_id)
    tree = pair_tree(params, pair_id)
    runtimes = [runtime_for(profile, len(p), tree) for p in prompts]
    return questions, prompts, profile, runtimes


def decode_config(params: Params, pair_id: str) -> DecodeConfig:
    """Evaluate's greedy decoding settings with the pair's tree (its measured budget)."""
    return DecodeConfig(params.evaluate.max_new_tokens, 0.0, params.collect.seed, pair_tree(params, pair_id))


# (first question, number of prompts) of a cell; None: the held-back evaluate prompts
PromptRange = tuple[int, int] | None


def calibration_range(collect_start: int, per_report: int, held_back_start: int) -> tuple[int, int]:
    """(first question, count) of the pair check's calibration prompts: the ``per_report`` questions
    right after the collect slice [collect_start, collect_start + per_report), so no training state
    came from them, and ending at or before the held-back prompts (``held_back_start``), so those
    stay unseen. A ValueError names the overlap otherwise."""
    start = collect_start + per_report
    if start + per_report > held_back_start:
        raise ValueError(
            f"pair check: calibration questions [{start}, {start + per_report}) after the collect slice "
            f"reach the held-back prompts from evaluate.prompt_start={held_back_start}"
        )
    return start, per_report


def priced_group(
    params: Params,
    cells: Sequence[Cell],
    policies: Mapping[str, Callable],
    fixed: Mapping[str, str],
    prompts_range: PromptRange = None,
    hindsight: bool = True,
    fixed_parts: Mapping[Cell, PricedCell] | None = None,
) -> list[PricedCell]:
    """The priced cells of pairs sharing one target on one dataset, with one TargetMemo
    (``hindsight``: as in collectors.evaluation.priced_eval.priced_cell). With ``fixed_parts`` (each
    cell's fixed schedules priced earlier, as the evaluate_fixed stage stores them), only the
    policies are replayed, from the stored continuations and target rows, and each cell is merged
    with its part."""
    start, n = (None, params.evaluate.prompts_per_cell) if prompts_range is None else prompts_range
    memo, out = TargetMemo(), []
    for pair_id, dataset in cells:
        pair = load_registered_pair(params, pair_id)
        _, prompts, profile, runtime = cell_inputs(params, pair_id, dataset, pair, n, start)
        config = decode_config(params, pair_id)
        args = (pair, prompts, config, profile, runtime, dict(policies), fixed_for(params, pair_id, fixed))
        rows, passes = params.runtime.replay_batch_rows, pass_profiles(params, pair_id)
        if fixed_parts is None:
            out.append(priced_cell(*args, memo=memo, hindsight=hindsight, batch_rows=rows, passes=passes))
            continue
        part = fixed_parts[pair_id, dataset]
        if part.prompts_sha256 != prompts_digest(prompts):
            raise ValueError(
                f"{pair_id}/{dataset}: the stored fixed part was priced on other prompts; "
                "rerun the evaluate_fixed stage"
            )
        stored = part.rows or None
        learned = priced_cell(*args, memo=memo, hindsight=False, continuations=part.continuations,
                              rows=stored, batch_rows=rows, passes=passes)  # fmt: skip
        out.append(merge_parts(part, learned))
    return out


BUDGET = "budget"  # a fixed method named for each pair's own budget-stage schedule (fixed_for)


def fixed_for(params: Params, pair_id: str, fixed: Mapping[str, str]) -> dict[str, str]:
    """``fixed`` for one pair: a method whose schedule is ``BUDGET`` gets the fixed schedule the budget
    stage chose for the pair (collectors.pricing.budget_file.pair_schedule), and is left out where
    there is none (AR, or budgets not measured)."""
    out = {}
    for name, schedule in fixed.items():
        if schedule == BUDGET:
            chosen = pair_schedule(params, pair_id)
            if chosen is None:
                continue
            schedule = chosen
        out[name] = schedule
    return out


def policy_name_of(schedule: str) -> str:
    """A fixed schedule's policy name, as a bundle deploys it: all-small, all-mid, or its bits (a
    name passes through)."""
    return {"0" * len(schedule): "all-small", "1" * len(schedule): "all-mid"}.get(schedule, schedule)


def budget_policy(params: Params, pair_id: str) -> str | None:
    """The policy name of the budget stage's fixed schedule for ``pair_id`` (None: it has none)."""
    chosen = pair_schedule(params, pair_id)
    return None if chosen is None else policy_name_of(chosen)


def target_groups(params: Params, cells: Sequence[Cell]) -> list[list[Cell]]:
    """Cells grouped by (target checkpoint, dtype, device, dataset), groups in first-cell order."""
    groups: dict[tuple, list[Cell]] = {}
    for pair_id, dataset in cells:
        target, _ = params.pair_paths(pair_id)
        spec = params.pairs[pair_id]
        groups.setdefault((str(target), spec.dtype, spec.device, dataset), []).append((pair_id, dataset))
    return list(groups.values())


def checkpoint_bytes(folder: Path) -> int:
    """Bytes of a checkpoint folder's files (0 if it is missing): a model's size, for ordering."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def longest_first(params: Params, groups: Sequence[Sequence[Cell]]) -> list[int]:
    """Group indices, the costliest first (checkpoint bytes of each cell's target and mid drafter,
    summed over its cells; plan order among equals): a pool then ends on short tasks instead of
    leaving one worker alone with a long one."""
    size: dict[str, int] = {}

    def cost(group: Sequence[Cell]) -> int:
        total = 0
        for pair_id, _ in group:
            if pair_id not in size:
                target, mid = params.pair_paths(pair_id)
                size[pair_id] = checkpoint_bytes(target) + (
                    checkpoint_bytes(mid) if params.pairs[pair_id].mid else 0
                )
            total += size[pair_id]
        return total

    costs = [cost(g) for g in groups]
    return sorted(range(len(groups)), key=lambda i: (-costs[i], i))


def priced_cells(
    params: Params,
    cells: Sequence[Cell],
    policies: Mapping[str, Callable],
    fixed: Mapping[str, str],
    progress: Callable[[int], object] | None = None,
    prompts_range: PromptRange = None,
    hindsight: bool = True,
    fixed_parts: Mapping[Cell, PricedCell] | None = None,
) -> dict[Cell, PricedCell]:
    """Every cell's PricedCell, computed in ``evaluate.workers`` processes (the costliest groups
    first), in the order of ``cells``; ``progress(n_prompts)`` as each group finishes.
    ``prompts_range``: (first question, count) of every cell, by default the held-back prompts;
    ``hindsight``: replay all 2^D schedules for the best fixed one (else only ``fixed``'s);
    ``fixed_parts``: each cell's stored fixed part, to which only the policies are added
    (:func:`priced_group`)."""
    groups = target_groups(params, cells)
    groups = [groups[i] for i in longest_first(params, groups)]

    def task(group: list[Cell]) -> Task:
        parts = None if fixed_parts is None else {c: fixed_parts[c] for c in group}
        args = (params, group, policies, fixed, prompts_range, hindsight, parts)
        return Task("+".join(f"{p}/{d}" for p, d in group), args)

    tasks = [task(g) for g in groups]

    def done(task: Task, result: list[PricedCell]) -> None:
        if progress is not None:
            progress(sum(len(c.tokens) for c in result))

    results = run_tasks(
        priced_group, tasks, params.evaluate.workers, params.runtime.torch_threads, done,
        params.runtime.keep_freed_memory, pool_device(params.pairs[p].device for p, _ in cells),
    )  # fmt: skip
    by_cell = {c: r for g, rs in zip(groups, results, strict=True) for c, r in zip(g, rs, strict=True)}
    return {c: by_cell[c] for c in cells}
