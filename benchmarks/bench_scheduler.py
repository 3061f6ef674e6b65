"""Scheduler decision latency in microseconds (NumPy inference of decoder/deploy/scheduler.py).

Prints per decision: the student's MLP alone (feature extraction excluded), the full policy call
on a realistic draft tree (tree signals + context + history + MLP), the tree signals alone, and the
value planner (exhaustive suffix search) for the ablation. The paper's student decision: 318 us.

Uses artifacts/export/scheduler.json and value_planner.json when they exist (`dvc repro`),
otherwise random-weight artifacts of the same shapes in a temporary folder.
Run: `.venv/bin/python benchmarks/bench_scheduler.py [--export-dir DIR]`.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from decoder.core.ngram import NgramDrafter
from decoder.core.policies import BuildState, RuntimeContext, StepContext
from decoder.core.state import state_feature_names, step_signals, tree_signals
from decoder.core.tree import DraftTree
from decoder.deploy.planning import HEADS, suffix_feature_names
from decoder.deploy.scheduler import build_manifest, load_scheduler, load_value_planner, write_artifact

SIGNALS = ("frontier_mean_depth", "frontier_leaf_ratio", "preview_collapse_debt", "preview_history_share",
           "preview_overlap_ratio", "preview_mean_score")  # fmt: skip


def random_artifacts(folder: Path, depth: int = 5, width: int = 10) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    names = state_feature_names(depth, SIGNALS)

    def arrays(head: str, sizes: list[int]) -> dict[str, np.ndarray]:
        out = {}
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            out[f"{head}.{i}.weight"] = rng.normal(size=(b, a)) / np.sqrt(a)
            out[f"{head}.{i}.bias"] = np.zeros(b)
        return out

    n, v_in = len(names), len(names) + depth + 1
    common = dict(depth=depth, width=width, feature_names=names, signals=list(SIGNALS))
    student = build_manifest(
        kind="student", input_names=names, x_mean=np.zeros(n), x_std=np.ones(n),
        heads={"margin": [n, 64, 32, 1]}, y_mean={"margin": 0.0}, y_std={"margin": 1.0}, **common,
    )  # fmt: skip
    value = build_manifest(
        kind="value", input_names=[*names, *suffix_feature_names(depth)], x_mean=np.zeros(v_in),
        x_std=np.ones(v_in), heads={h: [v_in, 128, 64, 1] for h in HEADS},
        y_mean={h: 3.0 for h in HEADS}, y_std={h: 1.0 for h in HEADS}, **common,
    )  # fmt: skip
    s = write_artifact(folder / "scheduler", student, arrays("margin", [n, 64, 32, 1]))
    v_arrays = {k: a for h in HEADS for k, a in arrays(h, [v_in, 128, 64, 1]).items()}
    return s, write_artifact(folder / "value_planner", value, v_arrays)


def realistic_state(seed: int = 0, nodes: int = 90) -> BuildState:
    """A draft tree of ~90 live nodes after two steps, as the decoder has before step 3."""
    rng = np.random.default_rng(seed)
    tree = DraftTree(1)
    for _ in range(nodes):
        parent = int(rng.integers(0, len(tree)))
        tree.add_child(parent, int(rng.integers(2, 5000)), float(-rng.exponential(1.0)), step=2)
    live = tree.live_nodes()
    # a context of 400 tokens over a small vocabulary, so the n-gram lookahead finds matches
    text = [int(t) for t in rng.integers(2, 60, size=400)]
    ngram = NgramDrafter()
    ngram.commit(text)
    return BuildState(
        tree, visited=set(live[: len(live) // 3]), newest=live[-30:], ngram=ngram, tail=tuple(text[-5:])
    )


def per_call_us(fn: Callable[[], object], repeats: int = 7, number: int = 2000) -> float:
    """Median over repeats of the mean time per call, in microseconds."""
    for _ in range(200):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return 1e6 * statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--export-dir", type=Path, default=Path(__file__).resolve().parents[1] / "artifacts/export"
    )
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    if (args.export_dir / "scheduler.json").is_file():
        s_path, v_path, source = (
            args.export_dir / "scheduler.json",
            args.export_dir / "value_planner.json",
            "exported",
        )
    else:
        s_path, v_path = random_artifacts(Path(tmp.name))
        source = "random-weight (no export found)"
    sched, planner = load_scheduler(s_path), load_value_planner(v_path)
    ctx = StepContext(3, sched.depth, (True, False), realistic_state(), RuntimeContext(180, 45.0, 6.0))
    z = sched.features(ctx)
    rows = [
        ("student MLP only (features excluded)", per_call_us(lambda: sched.decide(z))),
        ("student policy call (features included)", per_call_us(lambda: sched(ctx))),
        (
            "tree signals alone (10 candidates)",
            per_call_us(lambda: tree_signals(ctx.state, sched.features.width)),
        ),
        (
            "tree signals + n-gram lookahead",
            per_call_us(lambda: step_signals(ctx.state, sched.features.width)),
        ),
        ("value planner at step 3 (8 suffixes x 2)", per_call_us(lambda: planner.margin(z, 3), number=500)),
    ]
    print(f"scheduler decision latency, {source} artifacts, tree of {ctx.state.tree.n_alive - 1} nodes")
    for name, us in rows:
        print(f"  {name:<44s} {us:8.2f} us   ({318 / us:6.1f}x under the paper's 318 us)")
    tmp.cleanup()


if __name__ == "__main__":
    main()
