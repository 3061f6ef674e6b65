"""The stages' markdown tables: GitHub tables whose cells are printed exactly as each module formats
them (a number-looking cell such as "1.50" or "00101" is never reparsed), one row per item."""

from __future__ import annotations

from markdown_rows import md_tables

from collectors.graft.table import ROWS, markdown, markdown_wall
from collectors.pricing.budget_report import markdown as budget_markdown
from models.distill_markdown import offline_markdown
from models.distill_metrics import LABELS
from models.gate import backoff_key
from models.offline import PolicyResult


def _graft_row(speedup: float, budget: int) -> dict:
    return {
        "speedup": speedup,
        "mean_accepted": 2.5,
        "mismatch_rate": 0.125,
        "tree_size": 7.25,
        "budget": budget,
    }


def _graft_cells() -> list[dict]:
    return [
        {
            "pair_id": pair,
            "dataset_id": "code",
            "group": "held-out",
            "rows": {key: _graft_row(1.5 + i / 10, 4 + i) for i, (key, _) in enumerate(ROWS)},
            "wall": {key: 1.25 for key, _ in ROWS if key != "hindsight"},
        }
        for pair in ("tiny", "a-much-longer-pair-id")
    ]


def test_graft_table_has_one_row_per_cell_with_every_rows_speedup_and_stats() -> None:
    [table] = md_tables(markdown(_graft_cells()))
    assert table[0] == ["pair", "dataset", "group", *(label for _, label in ROWS)]
    assert [r[0] for r in table[1:]] == ["tiny", "a-much-longer-pair-id"]
    assert table[1][3] == "1.50x (A 2.50, mm 0.12, n 7.2 @ B=4)"
    assert table[1][-1] == f"{1.5 + (len(ROWS) - 1) / 10:.2f}x (A 2.50, mm 0.12, n 7.2 @ B={3 + len(ROWS)})"


def test_graft_wall_table_keeps_two_decimals_and_ends_with_priced_over_wall() -> None:
    cells = _graft_cells()
    [table] = md_tables(markdown_wall(cells))
    decoded = [label for key, label in ROWS if key != "hindsight"]
    assert table[0] == [
        "pair",
        "dataset",
        *(f"{label}, wall" for label in decoded),
        "full GRAFT priced / wall",
    ]
    full = cells[0]["rows"]["full"]["speedup"]
    assert table[1] == ["tiny", "code", *["1.25x"] * len(decoded), f"{full / 1.25:.2f}"]
    cells[0]["wall"]["full"] = full  # priced = wall: "1.00", not "1"
    assert md_tables(markdown_wall(cells))[0][1][-1] == "1.00"


def test_budget_table_prints_a_fixed_pair_as_dashes_and_a_measured_pair_in_full() -> None:
    measured = {
        "mode": "measure",
        "budget": 12,
        "width": 4,
        "topk": 3,
        "ngram_min_n": 2,
        "policy": "all-small",
        "speedup_at_budget": 1.5,
        "speedup_at_max": 1.5,
        "saba_budget": 9,
        "saba_policy": "all-mid",
        "speedup_at_saba": 1.25,
        "policies": {
            "all-small": {"best_budget": 12, "best_speedup": 1.5},
            "all-mid": {"best_budget": 8, "best_speedup": 1.2},
        },
        "round_budget": None,
        "decode_policy": "all-small",
    }
    text = budget_markdown({"zoo-l": {"mode": "fixed", "budget": 63}, "zoo-m": measured}, 63)
    [table] = md_tables(text)
    assert table[0][:6] == ["pair", "B*", "W x m", "policy", "speedup @ B*", "speedup @ B=63"]
    assert table[1] == ["zoo-l", "63", "-", "fixed", *["-"] * 8]
    assert table[2] == [
        "zoo-m", "12", "4 x 3, n-gram n >= 2", "all-small", "1.50x", "1.50x", "1.00", "9 (all-mid)",
        "1.25x", "all-small 12 (1.50x), all-mid 8 (1.20x)", "-", "all-small",
    ]  # fmt: skip


def _results() -> dict[str, dict[str, PolicyResult]]:
    tps = {"r1": (20.0, 16.0, 12.5, 10.0), "r22": (30.0, 24.5, 30.0, 28.0)}
    names = ("best", "student_oof", "all_small", "all_mid")
    return {
        r: {
            n: PolicyResult("00101" if n == "student_oof" else "11111", t)
            for n, t in zip(names, v, strict=True)
        }
        for r, v in tps.items()
    }


def test_offline_tables_keep_every_cell_as_formatted() -> None:
    train_set = {
        "selected_by": "round",
        "winner": "rounds",
        "exported_loss": "weighted_mse",
        "margin_over_runner_up_pct": None,
        "oof_pct_of_best": {"canonical": 90.0, "rounds": 95.25},
        "oof_invoke_share": {"canonical": 0.5, "rounds": 0.25},
        "fold_thresholds": {"canonical": [0.5, 0.25], "rounds": [1.0]},
        "round_walk_pct_of_oracle": {"rounds": 97.0, "all_small": 80.0},
    }
    metrics = {
        "decision_priced_walk_pct": {"rounds": 97.0, backoff_key(0, 0.0): 96.5, backoff_key(2, 0.05): 98.0},
        "skip_rest_below": None,
        "skip_rounds_max": 2,
        "skip_rounds_margin": 0.05,
        "round_walk_by_report": [
            {
                "report_id": "r22",
                "student": 97.04,
                "all_small": 90.0,
                "all_mid": 95.0,
                "best_fixed": 98.0,
                "best_schedule": "00101",
                "vs_better_endpoint_pct": 2.16,
                "vs_best_fixed_pct": -0.98,
            }
        ],
        "round_walk_vs_fixed": {
            "vs_better_endpoint_mean_pct": 2.15,
            "vs_better_endpoint_worst_pct": 2.15,
            "within_1pct_of_better_endpoint": 1,
            "reports": 1,
            "vs_best_fixed_mean_pct": -0.98,
            "vs_best_fixed_worst_pct": -0.98,
            "within_1pct_of_best_fixed": 1,
        },
    }
    summary, training, rules, grid, walks, per_report = md_tables(
        offline_markdown(_results(), train_set, metrics)
    )
    assert summary[0] == [
        "policy",
        "mean tok/s",
        "% of best (mean of ratios)",
        "worst report vs better endpoint",
    ]
    assert [r[0] for r in summary[1:]] == [LABELS[p] for p in ("best", "student_oof", "all_small", "all_mid")]
    # student: (16 + 24.5) / 2 tok/s, (80% + 81.67%) / 2 of best, worst vs max(All-Small, All-Mid) -18.3%
    assert summary[2][1:] == ["20.25", "80.8%", "-18.3%"] and summary[1][1:] == ["25.00", "100.0%", ""]
    assert training[1:] == [
        ["canonical", "90.0%", "", "50.0%", "0.50, 0.25"],
        ["rounds", "95.2%", "97.0%", "25.0%", "1.00"],
        ["All-Small (reference)", "", "80.0%", "0.0%", ""],
    ]
    assert rules == [["rule", "% of the round oracle"], ["rounds", "97.00%"]]
    assert grid == [["c", "h = 0", "h = 0.05"], ["0", "96.50%", ""], ["2", "", "98.00%"]]
    assert walks[1] == ["r22", "97.0%", "90.0%", "95.0%", "98.0% (00101)", "+2.2%", "-1.0%"]
    assert per_report[0] == ["report", *(LABELS[p] for p in ("best", "student_oof", "all_small", "all_mid"))]
    assert per_report[2] == ["r22", "30.00 (11111)", "24.50 (00101)", "30.00 (11111)", "28.00 (11111)"]
