"""GRAFT's evaluation rows: the budget walk reproduces decoding, the lossless gate, the mismatch
count, the measured costs, and the evaluate_graft stage end to end on a tiny workspace."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import noisy_copy, tiny_model
from dvc_outputs import declared_paths
from markdown_rows import md_tables
from test_edges import tiny_edges_params, workspace  # noqa: F401  (the module fixture)
from test_lossless import EOS, prompts, reference

from collectors.collect.batch_greedy import greedy_batch
from collectors.collect.plan import load_registered_pair, report_questions
from collectors.collect.report import prompt_digest
from collectors.evaluation.priced_eval import PricedCell, prompts_digest
from collectors.graft import outputs as graft_outputs
from collectors.graft.budget import (
    ChoiceWalks,
    arm_totals,
    best_arm,
    choice_arms,
    choice_specs,
    learned_budget,
)
from collectors.graft.costs import GraftCosts, measure_costs
from collectors.graft.edges import RecordingProposer, tree_match
from collectors.graft.outputs import collected_outputs, stored_outputs
from collectors.graft.walk import BudgetWalker, Round, decode_arm, lossless_gate
from collectors.pricing.profile_passes import save_profile
from config.params import Params
from decoder.core.config import BlockConfig, DecodeConfig
from decoder.core.tree import DraftTree
from decoder.deploy.latency import LatencyProfile, load_profile
from decoder.generate import generate
from decoder.graft.drafter import BlockDrafter, BlockDrafterConfig, BlockDrafterNet, load_block_drafter
from decoder.graft.edge_scorer import EdgeScorer, load_edge_scorer
from decoder.graft.proposers import CausalLMProposer
from decoder.models.pair import make_pair
from models.budget_choice import choose_budgets
from pipeline import collect_edges, evaluate_graft, fit_edges
from pipeline.cli import stage_params

M, K = 4, 4


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=41)
    return make_pair(target, noisy_copy(target, noise=0.3, seed=42), eos_token_ids=(EOS,))


def scorer_for(vocab: int, k: int, seed: int = 0) -> EdgeScorer:
    rng = np.random.default_rng(seed)
    h = 8
    return EdgeScorer(rng.normal(size=(vocab, h)), rng.normal(size=(vocab, h)), rng.normal(size=(k, h)),
                      rng.normal(size=h), 0.1, 2.0)  # fmt: skip


def test_the_budget_walk_is_the_round_sequence_of_decoding_at_every_budget(pair) -> None:
    """One check of the largest tree per start position gives, for each B, exactly the rounds that
    decoding at B goes through (accepted, emitted, size, mismatch counts)."""
    deepest = mismatched = 0
    for prompt in prompts(pair.vocab_size, 2, seed=7):
        proposer = CausalLMProposer(pair.mid, pair.vocab_size, K)
        ref = decode_arm(pair, proposer, None, prompt, 20, M, 30)
        assert ref.tokens == reference(pair.target, prompt, 30)
        feats = lossless_gate(pair, prompt, ref.tokens, ())
        proposer = CausalLMProposer(pair.mid, pair.vocab_size, K)
        walk = BudgetWalker(proposer, prompt, ref.tokens, feats, 20, M, pair.vocab_size).every_budget()
        for b in (1, 2, 5, 11, 20):
            run = decode_arm(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), None, prompt, b, M, 30)
            assert walk.at(b) == run.rounds, f"B={b}"
            assert sum(r.emitted for r in run.rounds) == len(run.tokens) - 1 == 29  # prefill: token 1
        deepest = max(deepest, max(r.accepted for r in walk.at(20)))
        mismatched += sum(r.mismatched for r in walk.at(20))
    assert deepest >= 2
    assert mismatched > 0, "no mismatched node: the count would go untested"


def test_the_budget_walk_with_tdes_is_the_round_sequence_of_tdes_decoding(pair) -> None:
    """The same exactness with the edge scorer ranking the tree, sharing the drafter's proposals."""
    scorer = scorer_for(pair.vocab_size, K, seed=5)
    prompt = prompts(pair.vocab_size, 1, seed=13)[0]
    ref = decode_arm(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), None, prompt, 20, M, 30)
    feats = lossless_gate(pair, prompt, ref.tokens, ())
    proposals: dict = {}
    proposer = CausalLMProposer(pair.mid, pair.vocab_size, K)
    plain = BudgetWalker(
        proposer, prompt, ref.tokens, feats, 20, M, pair.vocab_size, None, proposals
    ).every_budget()
    tdes = BudgetWalker(
        proposer, prompt, ref.tokens, feats, 20, M, pair.vocab_size, scorer, proposals
    ).every_budget()
    differs = False
    for b in (1, 3, 8, 20):
        run = decode_arm(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), scorer, prompt, b, M, 30)
        assert run.tokens == ref.tokens
        assert tdes.at(b) == run.rounds, f"B={b}"
        differs |= tdes.at(b) != plain.at(b)
    assert differs, "TDES ranked every tree as the marginals did: the scorer would go untested"


def priced_costs(verify_points: tuple, ar_ms: float = 10.0) -> GraftCosts:
    return GraftCosts(pair_id="tiny", clock="wall", context_len=8, drafter_ms=0.0, build_points=((1, 0.0),),
                      tdes_build_points=((1, 0.0),), saba_ms=0.0, rule_ms=0.0, verify_points=verify_points,
                      ar_token_ms=ar_ms)  # fmt: skip


def test_a_round_of_no_drafted_node_is_priced_as_the_ar_step() -> None:
    """A budget of 0 runs as the autoregressive step (decoder/graft/decode.py), so its verify is the
    AR step, which a budget rule's B = 0 entry prices too; a drafted node is verified as a tree."""
    costs = priced_costs(((1, 4.0), (17, 20.0)), ar_ms=3.0)
    assert costs.verify_ms(0) == 3.0 and costs.verify_ms(1) == pytest.approx(5.0)
    assert costs.rule_costs(2, False)[:2] == (pytest.approx(3.0), pytest.approx(5.0))


def test_the_learned_budget_follows_the_price_of_a_node(pair) -> None:
    """Free nodes: the smallest B reaching the most tokens per round; costly nodes: B = 1; and the
    chosen B has the best pooled speedup of the grid."""
    walks = []
    for prompt in prompts(pair.vocab_size, 2, seed=17):
        ref = decode_arm(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), None, prompt, 16, M, 30)
        feats = lossless_gate(pair, prompt, ref.tokens, ())
        walks.append(BudgetWalker(CausalLMProposer(pair.mid, pair.vocab_size, K), prompt, ref.tokens, feats,
                                  16, M, pair.vocab_size))  # fmt: skip
    for verify in (((1, 1.0), (17, 1.0)), ((1, 1.0), (17, 1000.0))):
        costs = priced_costs(verify)

        def price(r: Round, costs: GraftCosts = costs) -> float:
            return costs.round_ms(r.nodes, False, False)

        budget, curve = learned_budget(walks, price, costs.ar_token_ms, 16)
        assert len(curve) == 16 and curve[budget - 1] == max(curve)
        # the per-task choice over the same walks, TDES arms the same walker at no extra cost: it
        # ties each plain arm and loses the tie, so it picks the plain arm at the learned B
        arms = choice_arms(16)
        totals = np.stack([arm_totals(ChoiceWalks(w, w, None), costs, arms) for w in walks])  # type: ignore[arg-type]
        assert arms[best_arm(totals)] == (budget, False, None)
        per_round = [sum(len(w.fixed(b)) for w in walks) for b in range(1, 17)]
        if verify[1][1] == 1.0:  # every round costs the same: fewest rounds wins, smallest such B
            assert budget == 1 + per_round.index(min(per_round)) and budget > 1
        else:
            assert budget == 1
    with pytest.raises(ValueError, match="at least one"):
        learned_budget([], price, 1.0, 4)


def test_the_gates_features_are_the_verifiers_for_a_block_drafter(pair) -> None:
    """The walk's drafter reads the teacher-forced features: they give the marginals decoding saw."""
    target = pair.target
    cfg = BlockDrafterConfig(k=K, target_layers=(1, 2), context=6, layers=1, d_model=32, heads=2, ffn=64,
                             target_hidden=target.config.hidden_size, vocab_size=pair.vocab_size)  # fmt: skip
    torch.manual_seed(3)
    net = BlockDrafterNet(cfg)
    net.attach(target)
    drafter = RecordingProposer(BlockDrafter(net))
    prompt = prompts(pair.vocab_size, 1, seed=9)[0]
    config = DecodeConfig(max_new_tokens=20, block=BlockConfig(budget=8, topk=M, k=K))
    res = generate(pair, prompt, "ddtree", config, timing=False, proposer=drafter)
    feats = lossless_gate(pair, prompt, res.new_tokens, cfg.target_layers)
    seq = prompt + res.new_tokens
    assert len(drafter.calls) > 3
    for n, marg in drafter.calls:
        again = drafter.inner.propose(feats[: n - 1], seq[:n], M)
        assert np.array_equal(again.ids, marg.ids)
        np.testing.assert_allclose(again.logps, marg.logps, atol=1e-4)


def test_the_lossless_gate_names_the_first_wrong_token(pair) -> None:
    prompt = prompts(pair.vocab_size, 1, seed=3)[0]
    out = reference(pair.target, prompt, 12)
    lossless_gate(pair, prompt, out, ())
    bad = list(out)
    bad[5] = (bad[5] + 1) % pair.vocab_size
    with pytest.raises(
        RuntimeError, match=rf"output token 5 \({bad[5]}\) of 12 .* after its prefix \({out[5]}\)"
    ):
        lossless_gate(pair, prompt, bad, ())


def test_tree_match_counts_a_target_token_under_the_wrong_parent() -> None:
    tree = DraftTree(0)
    a, _ = tree.add_child(0, 5, -0.1)  # on the path (greedy[0] = 5)
    b, _ = tree.add_child(0, 6, -0.2)  # off it
    tree.add_child(a, 8, -0.3)  # greedy[1] = 7, not carried here
    tree.add_child(b, 7, -0.3)  # the target's depth-2 token under the wrong parent
    got = tree_match(tree, [5, 7, 9])
    assert (got.accepted, got.target_nodes, got.mismatched) == (1, 1, 1)
    tree.add_child(a, 7, -0.4)  # now also under the right one
    got = tree_match(tree, [5, 7, 9])
    assert (got.accepted, got.target_nodes, got.mismatched) == (2, 2, 1)
    assert tree_match(tree, [5]).target_nodes == 0  # depth 2 lies past the continuation's end


def test_decoding_with_a_scorer_rebuilds_its_own_trees(pair) -> None:
    prompt = prompts(pair.vocab_size, 1, seed=11)[0]
    scorer = scorer_for(pair.vocab_size, K)
    proposer = CausalLMProposer(pair.mid, pair.vocab_size, K)
    run = decode_arm(pair, proposer, scorer, prompt, 9, M, 24)  # raises if a rebuilt round differs
    assert run.tokens == reference(pair.target, prompt, 24)
    assert {r.nodes for r in run.rounds} == {9}


def tiny_profile(path, ar_ms: float = 2.0) -> None:
    save_profile(
        LatencyProfile(
            pair="tiny", device="cpu", device_name="test", torch_threads=1, clock="thread_cpu",
            torch_version=torch.__version__, dtype="float32", context_len=32, warmup=0, repeats=1,
            samples_per_repeat=1, verify_points=((1, 1.0), (16, 1.6), (64, 4.0)), mid_tokens=(),
            mid_fed=(), mid_grid_ms=(), mid_end_ms=0.0, ngram_step_ms=0.0, ngram_node_ms=0.0,
            ngram_mean_frontier=0.0, decision_ms=0.0, ar_token_ms=ar_ms, tree_points=((1, 0.0),),
        ),
        path,
    )  # fmt: skip


def test_measured_costs_cover_every_size_and_price_bigger_trees_higher(pair, tmp_path) -> None:
    tiny_profile(tmp_path / "tiny.json")
    profile = load_profile(tmp_path / "tiny.json")
    prompt = prompts(pair.vocab_size, 1, seed=2)[0]
    proposer = CausalLMProposer(pair.mid, pair.vocab_size, K)
    costs = measure_costs(pair, "tiny", proposer, scorer_for(pair.vocab_size, K), profile, prompt, M,
                          [1, 4, 16], 0, 1, 1)  # fmt: skip
    assert [n for n, _ in costs.build_points] == [1, 4, 16] == [n for n, _ in costs.tdes_build_points]
    assert costs.drafter_ms > 0 and costs.saba_ms >= 0
    assert costs.round_ms(16, True, True) > costs.round_ms(1, True, True)  # verification grows
    c_verify, c_fixed = costs.saba_line(16, False)
    assert 1 <= costs.saba(16, False) <= 16 and c_verify > 0 and c_fixed > 0


def test_the_stage_runs_on_a_tiny_workspace(workspace) -> None:  # noqa: F811
    params = tiny_edges_params(workspace)
    collect_edges.main(stage_params("collect_edges", params))
    fit_edges.main(stage_params("fit_edges", params))
    tiny_profile(workspace / "profile" / "tiny.json")
    graft = {"out_dir": str(workspace / "graft"), "prompts_per_cell": 2, "wall_prompts_per_cell": 1,
             "max_new_tokens": 10,
             "budget_max": 20, "rule_caps": [4, 20],
             "cost_sizes": [1, 8, 20], "warmup": 0, "repeats": 1, "passes": 1}  # fmt: skip
    # two held-back prompts of the workspace's three questions: the learned budget chooses on the
    # first question only (a collect slice of 1)
    held_back = {"datasets": ["code", "chat"], "held_out_datasets": ["chat"], "prompt_start": 1}
    overrides = {"graft_eval": graft, "evaluate": held_back}
    params = tiny_edges_params(workspace, extra=overrides, prompts_per_dataset=1)
    metrics = evaluate_graft.main(stage_params("evaluate_graft", params))
    for path in declared_paths(params, ["evaluate_graft"])["evaluate_graft"]:
        assert path.is_file(), path
    cells = json.loads((workspace / "graft" / "cells.json").read_text())
    assert {c["dataset_id"] for c in cells} == set(params.evaluate.datasets)
    for c in cells:
        rows = c["rows"]
        assert rows["ddtree"]["budget"] == params.edges.budget
        # the hindsight row is the best of a grid that holds the fixed budget
        assert rows["hindsight"]["speedup"] >= rows["ddtree"]["speedup"] - 1e-12
        assert 1 <= rows["hindsight"]["budget"] <= 20
    # every row priced over both prompts (walked); each of the 9 rows decoded on the first, its
    # rounds checked against its walk (a mismatch fails the stage)
    assert metrics["n_cells"] == len(cells)
    assert metrics["pairs"]["tiny"]["walk_checked_runs"] == 9 * len(cells)
    # the rounds emit all but the prefill's first token, of both prompts
    assert all(c["wall_prompts"] == 1 and c["rows"]["ddtree"]["tokens"] == 2 * (10 - 1) for c in cells)
    priced, wall = md_tables((workspace / "graft" / "graft.md").read_text())
    assert [r[0] for r in priced[1:]] == [r[0] for r in wall[1:]] == ["tiny"] * len(cells)
    choice = metrics["pairs"]["tiny"]["learned_budget"]
    # chosen on the collect slice of the fitting edges datasets only: "chat" is held out
    assert choice["questions"] == {"code": [0, 1]} and choice["prompts"] == 1
    # one fitting task of one prompt: nothing to leave out, so full GRAFT's budget is chosen once
    assert choice["per_task"]["use"] is False and set(choice["per_task"]["arms"]) == {"code"}
    assert not any(v["per_task"] for v in metrics["pairs"]["tiny"]["full_by_dataset"].values())
    for c in cells:
        rows = c["rows"]
        assert rows["learned"]["budget"] == choice["plain"]["budget"]
        assert rows["graft_learned"]["budget"] == choice["tdes"]["budget"]
        # the per-round rows verify at most their rule's cap, chosen among rule_caps
        for key, name in (("rule", "plain"), ("graft_rule", "tdes")):
            cap = choice[name]["rule"]["cap"]
            assert cap in (4, 20) and rows[key]["budget"] == cap and rows[key]["tree_size"] <= cap
            by_cap = choice[name]["rule"]["collect_speedup_by_cap"]
            assert choice[name]["rule"]["collect_speedup"] == max(by_cap.values())
        # full GRAFT is the TDES row of whichever learned budget priced faster on the collect prompts
        chosen = "graft_rule" if choice["tdes"]["use_rule"] else "graft_learned"
        assert rows["full"] == rows[chosen]
        # DDTree's A at TDES's learned B comes from the walk at that budget
        assert c["ddtree_at_tdes_learned_budget"]["budget"] == rows["graft_learned"]["budget"]
        if rows["learned"]["budget"] == rows["graft_learned"]["budget"]:
            assert c["ddtree_at_tdes_learned_budget"]["mean_accepted"] == rows["learned"]["mean_accepted"]
        assert choice["tdes"]["use_rule"] == (
            choice["tdes"]["oof_speedup_rule"] > choice["tdes"]["oof_speedup_fixed"]
        )
    # the done-when share is about the full GRAFT row, not another TDES row
    at_least = [c["rows"]["full"]["speedup"] >= c["rows"]["hindsight"]["speedup"] for c in cells]
    assert metrics["full_graft_at_least_hindsight"] == sum(at_least) / len(cells)
    assert "DDTree + learned B" in priced[0]
    assert "full GRAFT: the learned budget, TDES on or off, chosen on collect prompts, wall" in wall[0]
    # every decoded row (not the walked hindsight row) has a wall-clock speedup against AR
    for c in cells:
        assert set(c["wall"]) == {k for k in c["rows"] if k != "hindsight"}
        assert all(v > 0 for v in c["wall"].values())
    assert set(metrics["priced_over_wall"]) == set(cells[0]["wall"])


def choose_on_workspace(root: Path, params: Params, collected: dict | None = None) -> tuple[dict, dict, dict]:
    """models.budget_choice.choose_budgets on the tiny workspace (TDES fitted first where it is not yet),
    priced by a verification cost that grows with the tree, so neither the largest nor the smallest
    B wins by default; ``collected``: the collect stage's continuations, as it reads them."""
    if not (root / "fit" / "scorers" / "tiny").exists():
        collect_edges.main(stage_params("collect_edges", params))
        fit_edges.main(stage_params("fit_edges", params))
    pair = load_registered_pair(params, "tiny")
    drafter = load_block_drafter(root / "zoo" / "block-tiny", pair.target)
    scorer, _ = load_edge_scorer(root / "fit" / "scorers" / "tiny", vocab_size=pair.vocab_size,
                                 k=drafter.k)  # fmt: skip
    costs = priced_costs(((1, 1.0), (8, 1.5), (21, 4.0)))
    return choose_budgets(params, pair, "tiny", drafter, scorer, costs, collected)


def test_the_learned_budget_never_reads_the_held_back_prompts(workspace) -> None:  # noqa: F811
    """Other held-back prompts (another prompt_start, another dataset list) leave B_learned and its
    collect-prompt curve unchanged; a collect slice reaching the held-back prompts is refused."""
    graft = {"out_dir": str(workspace / "graft"), "prompts_per_cell": 2, "wall_prompts_per_cell": 1,
             "max_new_tokens": 10,
             "budget_max": 20, "rule_caps": [4, 20]}  # fmt: skip
    got = []
    for start, datasets in ((2, ["code", "chat"]), (3, ["chat"])):
        held_back = {"datasets": datasets, "held_out_datasets": ["chat"], "prompt_start": start}
        params = tiny_edges_params(workspace, extra={"graft_eval": graft, "evaluate": held_back})
        choice, rules, arms = choose_on_workspace(workspace, params)
        got.append(({k: v for k, v in choice.items() if k != "seconds"}, rules, arms))
    assert got[0] == got[1]
    held_back = {"datasets": ["code"], "held_out_datasets": ["chat"], "prompt_start": 1}
    params = tiny_edges_params(workspace, extra={"graft_eval": graft, "evaluate": held_back})
    with pytest.raises(ValueError, match="held-back prompts must stay unseen"):
        choice_specs(params, "tiny")


def test_full_graft_chooses_per_task_by_leaving_collect_prompts_out(workspace) -> None:  # noqa: F811
    """Two fitting tasks of two collect prompts each: every task gets its arm, and the per-task
    choice is used exactly when it prices the left-out prompts faster than the pooled choice."""
    graft = {"out_dir": str(workspace / "graft"), "budget_max": 20, "rule_caps": [4, 20]}
    held_back = {"datasets": ["code", "chat"], "held_out_datasets": [], "prompt_start": 2}
    params = tiny_edges_params(workspace, extra={"graft_eval": graft, "evaluate": held_back})
    choice, rules, arms = choose_on_workspace(workspace, params)
    task = choice["per_task"]
    assert choice["questions"] == {"code": [0, 2], "chat": [0, 2]} and set(task["arms"]) == {"code", "chat"}
    assert task["use"] == (task["left_out_speedup"] > task["left_out_speedup_pooled"])
    assert set(arms) == set(task["arms"])
    for name, arm in task["arms"].items():
        budget, tdes, rule = arms[name]  # the arm full GRAFT decodes the task with, as summarised
        assert (budget, tdes, rule is not None) == (arm["budget"], arm["tdes"], arm["rule"])
        if arm["rule"]:
            assert rule is rules["tdes" if arm["tdes"] else "plain"] and budget == rule.cap
        else:
            assert 1 <= arm["budget"] <= 20


def test_stored_continuations_give_the_outputs_cut_at_the_first_eos(workspace) -> None:  # noqa: F811
    params = tiny_edges_params(workspace, extra={"graft_eval": {"max_new_tokens": 4}})
    prompts = [[5, 6, 7], [8, 9]]
    part = PricedCell(np.zeros(2), np.zeros(2), {}, "", (((1, 2, 3, 4, 5, 6), 4), ((1, 0, 3, 0, 9), 2)),
                      prompts_digest(prompts))  # fmt: skip
    parts = {("tiny", "code"): part}
    # 4 tokens, or up to and with the first EOS (0); nothing for another cell or other prompts
    assert stored_outputs(params, parts, ("tiny", "code"), prompts, [0]) == [
        [1, 2, 3, 4],
        [1, 0],
    ]
    assert stored_outputs(params, parts, ("tiny", "chat"), prompts, [0]) is None
    assert stored_outputs(params, parts, ("tiny", "code"), prompts[:1], [0]) is None
    short = {("tiny", "code"): replace(part, continuations=(((1, 2), 2), ((3, 4), 2)))}
    assert stored_outputs(params, short, ("tiny", "code"), prompts, [0]) is None


def test_collected_continuations_give_the_outputs_cut_at_the_first_eos(workspace) -> None:  # noqa: F811
    params = tiny_edges_params(workspace, extra={"graft_eval": {"max_new_tokens": 4}})
    prompts = [[5, 6, 7], [8, 9]]
    collected = {
        ("tiny", prompt_digest(p)): g
        for p, g in zip(prompts, ([1, 2, 3, 4, 5, 6], [1, 0, 3, 0, 9]), strict=True)
    }
    outputs = collected_outputs
    assert outputs(params, collected, "tiny", prompts, [0]) == [[1, 2, 3, 4], [1, 0]]
    # another pair's, a prompt it lacks, or one too short: nothing (the stage then decodes them)
    assert outputs(params, collected, "other", prompts, [0]) is None
    assert outputs(params, collected, "tiny", [prompts[0], [8]], [0]) is None
    assert outputs(params, {k: g[:3] for k, g in collected.items()}, "tiny", prompts, [0]) is None


def test_the_budget_choice_reads_collected_continuations_and_gates_them(workspace, monkeypatch) -> None:  # noqa: F811
    """With the collect stage's continuations of every choice prompt, the budget choice decodes
    nothing in a batch and chooses what it chose from the batch; a wrong stored continuation is
    caught by the lossless gate (that prompt decoded alone), so the choice stays the same."""
    graft = {
        "out_dir": str(workspace / "graft"),
        "max_new_tokens": 10,
        "budget_max": 20,
        "rule_caps": [4, 20],
    }
    held_back = {"datasets": ["code", "chat"], "held_out_datasets": [], "prompt_start": 2}
    params = tiny_edges_params(workspace, extra={"graft_eval": graft, "evaluate": held_back})
    want = choose_on_workspace(workspace, params)
    pair = load_registered_pair(params, "tiny")
    collected = {}
    for spec in choice_specs(params, "tiny"):
        prompts = report_questions(params, spec, pair.tokenizer)[1]
        for prompt, g in zip(prompts, greedy_batch(pair.target, prompts, 16, pair.vocab_size), strict=True):
            collected["tiny", prompt_digest(prompt)] = g  # past EOS and past max_new_tokens, as collect's
    assert len(collected) == 4

    def no_batch(*args, **kwargs):
        raise AssertionError("the budget choice decoded a batch it had stored")

    monkeypatch.setattr(graft_outputs, "greedy_batch", no_batch)
    got = choose_on_workspace(workspace, params, collected)
    assert got[0]["datasets_from_collected_continuations"] == 2

    def same(a, b) -> bool:
        drop = ("seconds", "datasets_from_collected_continuations")
        return ({k: v for k, v in a[0].items() if k not in drop}, a[1], a[2]) == (
            {k: v for k, v in b[0].items() if k not in drop}, b[1], b[2]
        )  # fmt: skip

    assert same(got, want)
    key = next(iter(collected))
    wrong = {**collected, key: [t + 1 for t in collected[key]]}
    assert same(choose_on_workspace(workspace, params, wrong), want)
