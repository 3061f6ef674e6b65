"""collect_edges and fit_edges: labels against the target's own greedy output, and both stages end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from collect_workspace import collect_overrides, write_questions
from conftest import noisy_copy, save_pair, tiny_model, train_tokenizer
from dvc_outputs import declared_paths
from markdown_rows import md_rows
from test_lossless import EOS, prompts, reference
from transformers import AutoModelForCausalLM

from collectors.graft.edges import PromptKey, collect_prompt, new_columns
from config.params import Params, load_params
from decoder.core.config import BlockConfig
from decoder.graft.drafter import BlockDrafterConfig, BlockDrafterNet, save_block_drafter
from decoder.graft.edge_scorer import load_edge_scorer
from decoder.graft.proposers import CausalLMProposer
from decoder.models.pair import make_pair
from features.edge_schemas import EDGE_ROUNDS, EDGES
from features.tables import read_table
from pipeline import collect_edges, fit_edges
from pipeline.cli import stage_params

BUDGET, M, K = 12, 4, 4


@pytest.fixture(scope="module")
def collected():
    target = tiny_model("llama", seed=31)
    pair = make_pair(target, noisy_copy(target, noise=0.3, seed=32), eos_token_ids=(EOS,))
    rounds, edges = new_columns()
    refs = {}
    for i, prompt in enumerate(prompts(pair.vocab_size, 3, seed=4)):
        proposer = CausalLMProposer(pair.mid, pair.vocab_size, K)
        key = PromptKey("tiny", "causal", "syn", i)
        collect_prompt(pair, proposer, prompt, key, BlockConfig(BUDGET, M, K), 30, rounds, edges)
        refs[i] = prompt + reference(pair.target, prompt, 30)
    return pl.from_arrow(rounds.table()), pl.from_arrow(edges.table()), refs


def test_rounds_hold_the_targets_greedy_continuation(collected) -> None:
    rounds, _, refs = collected
    assert rounds.height > 10 and rounds["accepted"].max() >= 2
    for r in rounds.iter_rows(named=True):
        full = refs[r["prompt_id"]]
        assert r["greedy_ids"] == full[r["start_position"] : r["start_position"] + K]
        assert r["root_token"] == full[r["start_position"] - 1]


def test_labels_are_the_targets_greedy_tokens_under_its_accepted_path(collected) -> None:
    rounds, edges, refs = collected
    by_round = edges.group_by(["prompt_id", "round_id"], maintain_order=True)
    starts = {(r["prompt_id"], r["round_id"]): r for r in rounds.iter_rows(named=True)}
    for (prompt_id, round_id), group in by_round:
        r = starts[(prompt_id, round_id)]
        full = refs[prompt_id]
        assert group["is_in_tree"].sum() == BUDGET  # every tree node is one candidate edge
        for depth in range(1, K + 1):
            at = group.filter(pl.col("depth") == depth)
            want = full[r["start_position"] + depth - 1]
            pos = at.filter(pl.col("is_target"))
            accepted = at.filter(pl.col("is_accepted_parent"))
            if depth > r["accepted"] + 1:
                assert accepted.height == 0 and pos.height == 0
                continue
            assert accepted["parent_node"].n_unique() == 1 and accepted.height == M
            assert pos["child_token"].to_list() == (
                [want] if want in accepted["child_token"].to_list() else []
            )
            assert accepted["target_logit"].null_count() == 0
            if pos.height:  # the target's greedy token has the largest target logit among its siblings
                assert pos["target_logit"][0] == accepted["target_logit"].max()
        assert (
            group.filter(~pl.col("is_accepted_parent"))["target_logit"].null_count()
            == group.filter(~pl.col("is_accepted_parent")).height
        )


def tiny_edges_params(root: Path, extra: dict | None = None, **edges) -> Params:
    """The tiny workspace's params; ``edges`` override the edges section, ``extra`` whole sections."""
    overrides = collect_overrides(root)
    overrides["zoo"] = {"out_dir": str(root / "zoo")}
    overrides["edges"] = {"collect_dir": str(root / "edges"), "fit_dir": str(root / "fit"), "pairs": ["tiny"],
                          "drafters": ["block-tiny"], "datasets": ["code", "chat"], "prompts_per_dataset": 2,
                          "max_new_tokens": 12, "budget": 16, "topk": 32, "eval_budgets": [4, 16],
                          "n_folds": 2, "epochs": 20, **edges}  # fmt: skip
    return load_params(profile="smoke", overrides={**overrides, **(extra or {})})


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("edges")
    texts = write_questions(root)
    save_pair(root / "pair", train_tokenizer(texts, vocab=300), seed=61)
    target = AutoModelForCausalLM.from_pretrained(root / "pair" / "target")
    shape = target.config
    cfg = BlockDrafterConfig(k=4, target_layers=(1, 2), context=8, layers=1, d_model=32, heads=2, ffn=64,
                             target_hidden=shape.hidden_size, vocab_size=shape.vocab_size)  # fmt: skip
    save_block_drafter(BlockDrafterNet(cfg), root / "zoo" / "block-tiny", extra={"target": "tiny"})
    return root


def test_both_stages_run_on_a_tiny_workspace_and_export_a_loadable_scorer(workspace) -> None:
    params = tiny_edges_params(workspace)
    got = collect_edges.main(stage_params("collect_edges", params))
    for path in declared_paths(params, ["collect_edges"])["collect_edges"]:
        assert path.is_file(), path
    rounds = read_table(workspace / "edges" / "edge_rounds.parquet", EDGE_ROUNDS)
    edges = read_table(workspace / "edges" / "edges.parquet", EDGES)
    assert got["n_rounds"] == rounds.num_rows > 0 and got["n_edges"] == edges.num_rows
    assert set(rounds.column("prompt_id").to_pylist()) == {0, 1}
    metrics = fit_edges.main(stage_params("fit_edges", params))
    tiny = metrics["pairs"]["tiny"]
    assert tiny["n_folds"] == 2 and set(tiny["budgets"]) == {"4", "16"}
    assert set(tiny["cells"]) == {"code", "chat"}
    # replay by marginals at the collect budget rebuilds the decoded trees: same accepted length
    replayed = tiny["budgets"]["16"]["marginal"]["mean_accepted"]
    assert replayed == pytest.approx(got["pairs"]["tiny"]["mean_accepted"])
    assert (
        json.loads((workspace / "fit" / "metrics.json").read_text())["pairs"]["tiny"]["n_edges"]
        == edges.num_rows
    )
    vocab = json.loads((workspace / "pair" / "target" / "config.json").read_text())["vocab_size"]
    scorer, manifest = load_edge_scorer(workspace / "fit" / "scorers" / "tiny", vocab_size=vocab, k=4)
    assert manifest["drafter_id"] == "block-tiny" and np.all(np.isfinite(scorer.parent_table))
    assert ["tiny", "16"] in [r[:2] for r in md_rows((workspace / "fit" / "edges.md").read_text())]


def test_pairs_and_drafters_of_different_lengths_are_refused(workspace) -> None:
    params = tiny_edges_params(workspace, drafters=["block-tiny", "block-m"])
    with pytest.raises(ValueError, match=r"edges\.pairs"):
        collect_edges.main(stage_params("collect_edges", params))


def test_prompts_reaching_the_evaluate_slice_are_refused(workspace) -> None:
    params = tiny_edges_params(workspace, prompts_per_dataset=9)
    with pytest.raises(ValueError, match="evaluate prompts are held back"):
        collect_edges.main(stage_params("collect_edges", params))
