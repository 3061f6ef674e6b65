"""The budget stage end to end on a tiny pair, checked against plain replay, and its result file."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from collect_workspace import build_workspace, collect_overrides
from dvc_outputs import declared_paths

from collectors.collect.plan import (
    load_registered_pair,
    pair_tree,
    profile_for,
    report_questions,
    tree_config,
)
from collectors.collect.replay import Replayer
from collectors.pricing.budget_entry import choose
from collectors.pricing.budget_file import BudgetFileError, load_budgets, pair_budget, pair_round_budget
from collectors.pricing.budget_plan import budget_specs
from collectors.pricing.budget_sweep import fixed_policies, sweep_pair
from config.params import Params, load_params
from decoder.core.config import DecodeConfig
from decoder.deploy.latency import price_ar, price_round
from pipeline import budget
from pipeline.cli import stage_params


def budget_params(root: Path, name: str = "budget", **section) -> Params:
    overrides = collect_overrides(root)
    overrides["evaluate"] = {"pairs": ["tiny"]}
    overrides["budget"] = {"out_dir": str(root / name), "datasets": ["code", "chat"], "prompts_per_pair": 1,
                           "max_new_tokens": 12, **section}  # fmt: skip
    return load_params(profile="smoke", overrides=overrides)


def run_budget(params: Params) -> dict:
    """The stage as DVC runs it: only the params its dvc.yaml entry lists are readable."""
    return budget.main(stage_params("budget", params))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("budget"))


@pytest.fixture(scope="module")
def measured(workspace) -> tuple[Params, dict]:
    params = budget_params(workspace)
    return params, run_budget(params)


def plain_speedup(params: Params, prompt: list[int], b: int, rule: dict | None = None) -> float:
    """Priced speedup over AR of the better fixed policy, by plain replay at TreeConfig.budget = b
    (with the per-round rule's TreeConfig fields ``rule``, if given)."""
    pair = load_registered_pair(params, "tiny")
    profile = profile_for(params, "tiny")
    tree = replace(tree_config(params.tree), budget=b, **(rule or {}))
    schedules = list(fixed_policies(pair, tree.depth, params.budget.schedules).values())
    got = Replayer(pair, DecodeConfig(max_new_tokens=params.budget.max_new_tokens, tree=tree), schedules)
    rep = got.replay_prompt(prompt)
    speeds = []
    for s in range(len(schedules)):
        ms = sum(price_round(profile, replace(r.counts(), decisions=0)) for r in rep.rounds[s])
        speeds.append(price_ar(profile, rep.n_tokens[s]) / ms)
    return max(speeds)


def test_stage_writes_a_budget_per_pair_and_every_declared_output(measured) -> None:
    params, entries = measured
    b_max = params.tree.budget
    out = Path(params.budget.out_dir)
    assert load_budgets(out / "budgets.json", b_max) == {"tiny": entries["tiny"]["budget"]}
    assert 1 <= pair_budget(params, "tiny") <= b_max
    for path in declared_paths(params, ["budget"])["budget"]:
        assert path.is_file(), path
    with (out / "plots" / "speedup_by_budget.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * b_max  # All-Small and All-Mid at every budget
    entry = entries["tiny"]
    assert set(entry["policies"]) == {"all-small", "all-mid"}
    assert entry["n_prompts"] == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pairs"]["tiny"]["budget"] == entry["budget"]


def test_the_chosen_budget_prices_at_least_as_fast_as_plain_replay_at_other_budgets(measured) -> None:
    params, entries = measured
    entry, b_max = entries["tiny"], params.tree.budget
    pair = load_registered_pair(params, "tiny")
    (spec,) = budget_specs(params, "tiny")
    (prompt,) = report_questions(params, spec, pair.tokenizer)[1]
    at_chosen = plain_speedup(params, prompt, entry["budget"], pair_round_budget(params, "tiny"))
    at_max = plain_speedup(params, prompt, b_max)
    assert at_chosen == pytest.approx(entry["speedup_at_budget"], rel=1e-9)
    assert at_max == pytest.approx(entry["speedup_at_max"], rel=1e-9)
    others = {1, b_max, entry["saba_budget"], *(p["best_budget"] for p in entry["policies"].values())}
    for b in sorted(others - {entry["budget"]}):
        assert plain_speedup(params, prompt, b) <= at_chosen * (1 + 1e-9), b


def test_a_pair_that_no_budget_speeds_up_decodes_with_ar(measured) -> None:
    """The same sweep priced twice: with AR's one-token step 100x cheaper than measured (a machine
    where any round costs more than the tokens it saves) every budget prices slower than AR and the
    pair's default is AR itself; with it 100x dearer the best policy prices faster and is kept."""
    params, entries = measured
    entry = entries["tiny"]
    assert entry["decode_policy"] == (entry["policy"] if entry["speedup_at_budget"] >= 1.0 else "ar")
    pair = load_registered_pair(params, "tiny")
    profile = profile_for(params, "tiny")
    (spec,) = budget_specs(params, "tiny")
    prompts = report_questions(params, spec, pair.tokenizer)[1]
    picks = {}
    for name, factor in (("dear", 0.01), ("cheap", 100.0)):
        priced = replace(profile, ar_token_ms=profile.ar_token_ms * factor)
        sweeps = sweep_pair(pair, priced, prompts, tree_config(params.tree), params.budget.max_new_tokens)
        picks[name] = choose(sweeps, priced, len(prompts))
    assert picks["dear"]["speedup_at_budget"] < 1.0 and picks["dear"]["decode_policy"] == "ar"
    assert picks["cheap"]["speedup_at_budget"] > 1.0
    assert picks["cheap"]["decode_policy"] == picks["cheap"]["policy"] in {"all-small", "all-mid"}


def test_tree_shapes_are_swept_and_the_best_priced_one_is_decoded_with(workspace, measured) -> None:
    """budget.shapes: one sweep per (width, topk); the entry is the best-priced shape's pick, each
    shape's pick is recorded, and pair_tree hands that shape to collect and evaluate. A narrow
    shape's sweep prices exactly as plain replay at that shape (the same check as the default's)."""
    params = budget_params(workspace, name="shapes", shapes=[[1, 1], [3, 2], [3, 2, 2]], schedules=["10101"])
    entry = run_budget(params)["tiny"]
    assert set(entry["shapes"]) == {"1x1", "3x2", "3x2/n2"}  # the third: n-gram matches of >= 2 tokens
    assert set(entry["policies"]) == {"all-small", "all-mid", "10101"}  # a mixed schedule swept too
    assert all(set(e["best"]) == set(entry["policies"]) for e in entry["shapes"].values())
    best = max(entry["shapes"].values(), key=lambda e: e["speedup_at_budget"])
    assert entry["speedup_at_budget"] == best["speedup_at_budget"] and entry["budget"] == best["budget"]
    assert f"{entry['width']}x{entry['topk']}" in entry["shapes"]
    tree = pair_tree(params, "tiny")
    assert (tree.budget, tree.width, tree.topk, tree.ngram_min_n) == (
        entry["budget"], entry["width"], entry["topk"], entry["ngram_min_n"]
    )  # fmt: skip
    pair = load_registered_pair(params, "tiny")
    (spec,) = budget_specs(params, "tiny")
    (prompt,) = report_questions(params, spec, pair.tokenizer)[1]
    shape = {"width": entry["width"], "topk": entry["topk"], "ngram_min_n": entry["ngram_min_n"]}
    narrow = params.model_copy(update={"tree": params.tree.model_copy(update=shape)})
    rule = pair_round_budget(params, "tiny")
    assert plain_speedup(narrow, prompt, entry["budget"], rule) == pytest.approx(
        entry["speedup_at_budget"], rel=1e-9
    )
    # without shapes, the tree section's own shape: the default stage's entry keeps it
    default = measured[1]["tiny"]
    assert (default["width"], default["topk"]) == (params.tree.width, params.tree.topk)
    assert set(default["shapes"]) == {f"{params.tree.width}x{params.tree.topk}"}


@pytest.mark.parametrize("shapes", [[[2]], [[0, 2]], [[2, 2, 6]], [[2, 2, 0]], [[2, 2, 2, 2]]])
def test_a_malformed_tree_shape_is_refused(workspace, shapes) -> None:
    # a zero is refused when params load (ranges), a wrong length by the stage: both name the key
    refused = r"budget\.shapes(: each entry is \[width, topk\]|\[0\]\[\d\]: Input should be greater than 0)"
    with pytest.raises(ValueError, match=refused):
        run_budget(budget_params(workspace, name="bad-shape", shapes=shapes))


@pytest.mark.parametrize("schedule", ["1010", "10102", "101010"])
def test_a_malformed_mixed_schedule_is_refused(workspace, schedule) -> None:
    # a non-bit is refused when params load, a wrong length by the stage: both name the key
    refused = r"budget\.schedules(: each entry is a string of 5 bits|\[0\]: String should match pattern)"
    with pytest.raises(ValueError, match=refused):
        run_budget(budget_params(workspace, name="bad-schedule", schedules=[schedule]))


def test_mode_fixed_gives_every_pair_the_tree_budget(workspace) -> None:
    params = budget_params(workspace, name="fixed", mode="fixed")
    entries = run_budget(params)
    assert {p: e["budget"] for p, e in entries.items()} == {"tiny": params.tree.budget}
    assert pair_budget(params, "tiny") == params.tree.budget
    lines = (Path(params.budget.out_dir) / "plots" / "speedup_by_budget.csv").read_text().splitlines()
    assert lines == ["pair_id,policy,budget,priced_speedup"]


def test_the_reader_names_the_file_on_a_missing_pair_or_a_bad_file(workspace, tmp_path) -> None:
    params = budget_params(workspace, name=str(tmp_path / "budget"))
    path = tmp_path / "budget" / "budgets.json"
    with pytest.raises(BudgetFileError, match=re.escape(f"{path}: no budgets file")):
        pair_budget(params, "tiny")
    path.parent.mkdir()
    path.write_text(json.dumps({"other": {"budget": 8}}))
    with pytest.raises(BudgetFileError, match=re.escape(f"{path}: no budget for pair 'tiny'")):
        pair_budget(params, "tiny")
    path.write_text('{"tiny": {"budget": 8')
    with pytest.raises(BudgetFileError, match=re.escape(f"{path}: not a JSON file")):
        pair_budget(params, "tiny")
    path.write_text(json.dumps({"tiny": {"budget": params.tree.budget + 1}}))
    with pytest.raises(BudgetFileError, match=rf"tiny\.budget must be an int in \[1, {params.tree.budget}\]"):
        pair_budget(params, "tiny")


def test_a_per_round_rule_is_chosen_only_where_it_prices_faster_and_reaches_the_decoder(workspace) -> None:
    """With a cost curve where any tree costs two target steps, the stage tries per-round rules;
    the entry carries one only when it prices round_min_gain faster than the best fixed budget,
    and then pair_tree decodes with it and plain replay with that TreeConfig prices the same."""
    params = budget_params(workspace, name="rule", round_gain_scales=[0.5, 1.0, 2.0], round_min_gain=0.0)
    pair = load_registered_pair(params, "tiny")
    profile = profile_for(params, "tiny")
    stepped = replace(profile, verify_points=((1, profile.ar_token_ms), (2, 2 * profile.ar_token_ms),
                                              (64, 2 * profile.ar_token_ms)))  # fmt: skip
    (spec,) = budget_specs(params, "tiny")
    prompts = report_questions(params, spec, pair.tokenizer)[1]
    sweeps = sweep_pair(pair, stepped, prompts, tree_config(params.tree), params.budget.max_new_tokens)
    entry = choose(sweeps, stepped, len(prompts), (0.5, 1.0, 2.0), 0.0)
    tried = entry["round_rule_tried"]
    assert tried["speedup"] > 0 and tried["cap"] in {sweeps[tried["policy"]].best(), params.tree.budget}
    if entry["round_budget"] is None:
        assert tried["speedup"] < entry["speedup_fixed_budget"]
    else:
        assert entry["speedup_at_budget"] == tried["speedup"] >= entry["speedup_fixed_budget"]
    strict = choose(sweeps, stepped, len(prompts), (0.5, 1.0, 2.0), 10.0)  # never 11x faster
    assert strict["round_budget"] is None and strict["budget"] == max(
        sweeps[strict["policy"]].budgets, key=lambda b: (sweeps[strict["policy"]].speedup(b), -b)
    )
    # the stage's own entry (profile as measured) reaches the decoder's TreeConfig when it has a rule
    entry = run_budget(params)["tiny"]
    tree = pair_tree(params, "tiny")
    if entry["round_budget"] is None:
        assert tree.verify_ms == ()
    else:
        assert tree.verify_ms == tuple(entry["round_budget"]["verify_ms"]) and tree.budget == entry["budget"]


def test_a_malformed_round_rule_is_refused_naming_the_field(workspace, tmp_path) -> None:
    params = budget_params(workspace, name=str(tmp_path / "budget"))
    path = tmp_path / "budget" / "budgets.json"
    path.parent.mkdir()
    good = {"verify_ms": [1.0, 2.0, 2.0], "fixed_ms": 0.1, "gain_scale": 1.0}
    path.write_text(json.dumps({"tiny": {"budget": 2, "round_budget": good}}))
    assert pair_round_budget(params, "tiny") == {"verify_ms": (1.0, 2.0, 2.0), "round_fixed_ms": 0.1,
                                                 "round_gain_scale": 1.0}  # fmt: skip
    for field, bad, says in (("verify_ms", [1.0, 2.0], "verify_ms must be 3 positive ms"),
                             ("verify_ms", [1.0, 0.0, 2.0], "verify_ms must be 3 positive ms"),
                             ("fixed_ms", float("nan"), "fixed_ms must be a finite number"),
                             ("gain_scale", -1, "gain_scale must be a finite number")):  # fmt: skip
        path.write_text(json.dumps({"tiny": {"budget": 2, "round_budget": {**good, field: bad}}}))
        with pytest.raises(BudgetFileError, match=re.escape(f"{path}: tiny.round_budget.{says}")):
            pair_round_budget(params, "tiny")


def test_prompts_reaching_the_evaluate_slice_are_refused(workspace) -> None:
    params = budget_params(workspace, name="refused", prompts_per_pair=9)  # reaches question 4
    with pytest.raises(ValueError, match=re.escape("evaluate.prompt_start=4")):
        run_budget(params)
    assert not Path(params.budget.out_dir).exists()


def test_unknown_mode_is_refused(workspace) -> None:
    with pytest.raises(
        ValueError, match=r"budget\.mode(: Input should be 'measured' or 'fixed'| must be one of)"
    ):
        run_budget(budget_params(workspace, name="bad", mode="learned"))
