"""The budget stage's result file: each pair's verification budget, written atomically, read checked.

Contract: ``<budget.out_dir>/budgets.json`` maps pair id -> an entry whose ``budget`` is the pair's
`TreeConfig.budget` (verified nodes besides the root), an int in [1, tree.budget], and whose
``width`` and ``topk`` (when present) are its tree shape, whose ``round_budget`` (when not null)
is its per-round budget rule (``verify_ms``, ``fixed_ms``, ``gain_scale``: decoder/core/budget.py
`verify_budget`); the entry's other keys are the
measurements behind it (pipeline/budget.py). `write_budgets` replaces the file
atomically (temp file in the same folder, fsync, rename). `load_budgets` and `pair_budget` raise a
`BudgetFileError` naming the file (and the pair or field) when it is missing, is not JSON, lacks the
pair or holds a budget out of range, so no stage silently decodes with a budget nobody chose.
`read_pair_budget` reads the file once for all a pair decodes with (budget, shape, per-round
rule: collectors/collect/plan.py `pair_tree`). No torch: any stage can read it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from config.params import Params, resolve
from decoder.core.policies import AR
from decoder.io.files import replace_atomically

BUDGETS_FILE = "budgets.json"


class BudgetFileError(ValueError):
    """budgets.json is missing, corrupt, lacks a pair or holds a budget out of range."""


def budgets_path(params: Params) -> Path:
    return resolve(params.budget.out_dir) / BUDGETS_FILE


def write_budgets(path: Path, entries: Mapping[str, Mapping[str, object]]) -> Path:
    """Write {pair_id: entry} as JSON atomically; return the path."""
    return replace_atomically(path, (json.dumps(entries, indent=2, sort_keys=True) + "\n").encode())


def _read(path: Path) -> dict:
    """The file's mapping of pair id -> entry, or a BudgetFileError naming the file."""
    if not path.is_file():
        raise BudgetFileError(f"{path}: no budgets file; run the budget stage first")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BudgetFileError(f"{path}: not a JSON file ({err})") from err
    if not isinstance(data, dict):
        raise BudgetFileError(f"{path}: expected a mapping of pair id -> entry, got {type(data).__name__}")
    return data


def load_budgets(path: Path, max_budget: int) -> dict[str, int]:
    """pair id -> budget of every entry of ``path``, each checked to be an int in [1, max_budget]."""
    return _budgets(path, _read(path), max_budget)


def _budgets(path: Path, data: dict, max_budget: int) -> dict[str, int]:
    out = {}
    for pair_id, entry in data.items():
        budget = entry.get("budget") if isinstance(entry, dict) else None
        if not isinstance(budget, int) or isinstance(budget, bool) or not 1 <= budget <= max_budget:
            raise BudgetFileError(
                f"{path}: {pair_id}.budget must be an int in [1, {max_budget}] (tree.budget), got {budget!r}"
            )
        out[pair_id] = budget
    return out


@dataclass(frozen=True)
class PairBudget:
    """What budgets.json says one pair decodes with, checked (module docstring)."""

    budget: int
    shape: tuple[int, int, int]  # width, topk, ngram_min_n
    round_rule: dict[str, object]  # TreeConfig fields of the per-round rule, {} for none


def read_pair_budget(params: Params, pair_id: str) -> PairBudget:
    """The pair's budget, shape and per-round rule from one read of budgets.json (reads budget.mode,
    budget.out_dir and the tree section); with ``budget.mode: fixed`` the tree section's, no rule."""
    tree = params.tree
    default = (tree.width, tree.topk, tree.ngram_min_n)
    if params.budget.mode == "fixed":
        return PairBudget(tree.budget, default, {})
    path = budgets_path(params)
    data = _read(path)
    budgets = _budgets(path, data, tree.budget)
    if pair_id not in budgets:
        raise BudgetFileError(
            f"{path}: no budget for pair {pair_id!r} (it has {sorted(budgets)}); "
            "add the pair to collect.pairs or evaluate.pairs and rerun the budget stage"
        )
    entry = data[pair_id]
    return PairBudget(
        budgets[pair_id], _shape(path, pair_id, entry, default), _round_rule(path, pair_id, entry)
    )


def pair_schedule(params: Params, pair_id: str) -> str | None:
    """The fixed schedule the budget stage chose for ``pair_id`` (its entry's ``decode_policy``:
    all-small, all-mid or a bit string), or None: AR, or no budget measured (mode fixed)."""
    if params.budget.mode == "fixed":
        return None
    path = budgets_path(params)
    entry = _read(path).get(pair_id)
    if not isinstance(entry, dict):
        raise BudgetFileError(f"{path}: no entry for pair {pair_id!r}; rerun the budget stage")
    policy = entry.get("decode_policy")
    return None if policy in (None, AR) else str(policy)


def pair_budget(params: Params, pair_id: str) -> int:
    """The verification budget the budget stage chose for ``pair_id``; with ``budget.mode: fixed``
    every pair gets tree.budget."""
    return read_pair_budget(params, pair_id).budget


def pair_shape(params: Params, pair_id: str) -> tuple[int, int, int]:
    """The tree shape (width, topk, ngram_min_n) the budget stage chose for ``pair_id``: the
    entry's ``width``, ``topk`` and ``ngram_min_n`` (positive ints) where it has them, else the
    ``tree`` section's (mode fixed, or an entry measured with that one shape only)."""
    return read_pair_budget(params, pair_id).shape


def pair_round_budget(params: Params, pair_id: str) -> dict[str, object]:
    """The per-round budget rule the budget stage chose for ``pair_id`` as TreeConfig fields
    (``verify_ms``, ``round_fixed_ms``, ``round_gain_scale``), or {} where the pair verifies its
    fixed budget every round (no ``round_budget`` entry, or mode fixed). Checked: verify_ms holds
    budget + 1 positive costs, the others are finite and >= 0."""
    return read_pair_budget(params, pair_id).round_rule


def _shape(path: Path, pair_id: str, entry: dict, default: tuple[int, int, int]) -> tuple[int, int, int]:
    shape = tuple(entry.get(k, d) for k, d in zip(("width", "topk", "ngram_min_n"), default, strict=True))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape):
        raise BudgetFileError(
            f"{path}: {pair_id}.width, .topk and .ngram_min_n must be positive ints, got {shape}"
        )
    return shape[0], shape[1], shape[2]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _round_rule(path: Path, pair_id: str, entry: dict) -> dict[str, object]:
    rule = entry.get("round_budget")
    if rule is None:
        return {}
    where = f"{path}: {pair_id}.round_budget"
    if not isinstance(rule, dict):
        raise BudgetFileError(f"{where} must be a mapping or null, got {type(rule).__name__}")
    costs, fixed, scale = rule.get("verify_ms"), rule.get("fixed_ms"), rule.get("gain_scale")
    need = entry["budget"] + 1
    if not isinstance(costs, list) or len(costs) != need or not all(_number(c) and c > 0 for c in costs):
        raise BudgetFileError(f"{where}.verify_ms must be {need} positive ms (B = 0..budget), got {costs!r}")
    for name, value in (("fixed_ms", fixed), ("gain_scale", scale)):
        if not (_number(value) and value >= 0):
            raise BudgetFileError(f"{where}.{name} must be a finite number >= 0, got {value!r}")
    return {
        "verify_ms": tuple(float(c) for c in costs),
        "round_fixed_ms": float(fixed),
        "round_gain_scale": float(scale),
    }
