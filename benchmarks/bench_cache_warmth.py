"""Cache warmth: what a component costs depending on what ran just before it.

Usage:
    .venv/bin/python benchmarks/bench_cache_warmth.py [--pairs zoo-s zoo-m zoo-chat-m]
        [--samples 60] [--skip 10] [--threads 1] [--out artifacts/bench/cache_warmth.json]

In a real round the components run in a fixed order: n-gram steps and mid calls, then the target's
verify, then the next round. The `profile` stage times each component after a random other one
(collectors.pricing.profiling.robust_medians), so a point's median mixes warm and cold caches. Here, in
the profile's reference state (same reference context, same real and grown trees, each pair's
budgets.json tree), each component is timed right after each possible predecessor, by this
thread's CPU time (the profile's clock on a CPU with one torch thread), as the median of
--samples samples after --skip discarded ones:
- a mid call (n new tokens on top of f fed nodes, RoundBuilder.mid_step) right after the target's
  verify of the pair's tree (the first mid call of a round) and right after another mid call (a
  later call of the same round);
- the target's verify of the pair's tree (budget + 1 nodes) and of 64 nodes right after a verify
  (an All-Small round: n-gram steps touch neither model) and right after a mid call of 16 tokens,
  of 1 token and of W x topk tokens (the sizes a round's last mid call spans: a late All-Mid call
  feeds the whole frontier's children).
Printed per pair: each pair of medians and their ratio. `tiny` (built on the spot) stands in
when the zoo is not built yet.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from benchmarks.pair_sources import TINY, load_named
from collectors.collect.plan import pair_tree
from collectors.pricing.profile_rounds import Reference, grown, prefix_tree, real_rounds, reference_context
from collectors.pricing.profiling import mid_job
from config.params import load_params, resolve
from decoder.core.config import TreeConfig


def timed(
    before: Callable[[], object],
    setup: Callable[[], object],
    run: Callable[[object], object],
    n: int,
    skip: int,
) -> float:
    """Median ms of ``run(setup())`` right after ``before()``, over n samples after skip discarded."""
    samples = []
    for _ in range(skip + n):
        before()
        arg = setup()
        t0 = time.thread_time()
        run(arg)
        samples.append(1e3 * (time.thread_time() - t0))
    return statistics.median(samples[skip:])


def measure_pair(
    ref: Reference, vocab_size: int, cfg: TreeConfig, n: int, skip: int
) -> list[dict[str, object]]:
    """Rows (component, sizes, predecessor, ms) for one pair in its reference state."""
    real = real_rounds(ref, cfg.depth)
    biggest = max(real.trees, key=len)
    big = grown(biggest, 320, vocab_size, np.random.default_rng(0), max(*biggest.depths, cfg.depth))
    rng = np.random.default_rng(0)
    pair_tree_nodes = prefix_tree(big, cfg.budget + 1)

    def verify_pair_tree() -> None:
        ref.rewind_target()
        ref.verifier.verify(pair_tree_nodes, 0.0, rng)

    rows: list[dict[str, object]] = []
    if ref.mid is not None:
        warm_mid = mid_job(ref, big, 16, 0)

        def mid_call() -> None:
            warm_mid.run(warm_mid.setup())

        for tokens, fed in ((1, 0), (16, 0), (1, 16)):
            job = mid_job(ref, big, tokens, fed)
            for name, before in (("verify", verify_pair_tree), ("mid", mid_call)):
                ms = timed(before, job.setup, job.run, n, skip)
                rows.append({"component": "mid", "tokens": tokens, "fed": fed, "after": name, "ms": ms})
    befores = [("verify", verify_pair_tree)]
    if ref.mid is not None:  # the last mid call of a round forwards 1 to W x topk tokens
        befores.append(("mid", mid_call))
        for tokens in (1, cfg.width * cfg.topk):
            call = mid_job(ref, big, tokens, 0)
            befores.append((f"mid {tokens} tok", lambda c=call: c.run(c.setup())))
    for nodes in sorted({cfg.budget + 1, 64}):
        tree = prefix_tree(big, nodes)
        for name, before in befores:
            ms = timed(before, ref.rewind_target, lambda _, t=tree: ref.verifier.verify(t, 0.0, rng), n, skip)
            rows.append({"component": "verify", "nodes": nodes, "after": name, "ms": ms})
    return rows


def format_rows(pair: str, rows: list[dict[str, object]]) -> str:
    """One line per component and size: the medians after each predecessor and their ratio."""
    lines, groups = [], {}
    for r in rows:
        sizes = f"{r['tokens']} tok, {r['fed']} fed" if r["component"] == "mid" else f"{r['nodes']} nodes"
        groups.setdefault((r["component"], sizes), {})[r["after"]] = float(r["ms"])  # type: ignore[arg-type]
    for (component, sizes), after in groups.items():
        cells = "  ".join(f"after {k} {v:7.3f} ms" for k, v in after.items())
        ratio = after["verify"] / after["mid"] if "mid" in after and after["mid"] > 0 else float("nan")
        lines.append(f"{pair:<12} {component:<7} {sizes:<16} {cells}  verify/mid {ratio:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlay", default=None, help="params overlay (profiles/NAME.yaml)")
    parser.add_argument("--pairs", nargs="*", default=None, help=f"registered pairs or {TINY!r}")
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the pipeline's)")
    parser.add_argument("--out", default="artifacts/bench/cache_warmth.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    params = load_params(profile=args.overlay)
    names = args.pairs or [n for n in params.profile.pairs if params.pair_paths(n)[0].exists()] or [TINY]
    report = []
    for name in names:
        pair = load_named(params, name)
        cfg = pair_tree(params, name) if name != TINY else TreeConfig()
        ref = Reference(pair, reference_context(pair, params.profile.context_len + 1, 0), cfg)
        rows = measure_pair(ref, pair.vocab_size, cfg, args.samples, args.skip)
        print(format_rows(name, rows), flush=True)
        report += [{"pair": name, **r} for r in rows]
    out = resolve(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
