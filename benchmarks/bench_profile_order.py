"""Profile order: how the profile's verify points move with the other components timed beside them.

Usage:
    .venv/bin/python benchmarks/bench_profile_order.py [--pairs zoo-s] [--repeats 6] [--samples 4]
        [--out artifacts/bench/profile_order.json]

The `profile` stage times every component in one random order per pass
(collectors.pricing.profiling.robust_medians), so each verify follows a random other job. Some of those
jobs run many units at once (the n-gram job runs every real small step of a frontier size, the
decision job every real pre-step state), far more work between two verifies than a real round
puts there (at most D small steps and D decisions). Here the profile's own jobs (same reference
state, grid and tree settings as the stage) are timed by the stage's robust_medians with the
verify jobs alone beside the AR job, beside each other component kind, and beside all of them
(the stage's mix); printed: the verify points (ms) of each mix. `tiny` stands in when the zoo is
not built yet.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from benchmarks.pair_sources import TINY, load_named
from collectors.pricing.profile_rounds import Reference, grown, real_rounds, reference_context
from collectors.pricing.profiling import grid_jobs, make_grid, profile_clock, robust_medians
from config.params import load_params, resolve
from decoder.core.config import TreeConfig

MIXES = {  # name -> the component kinds timed beside the verify jobs
    "ar": ("ar",),
    "tree": ("tree",),
    "ngram": ("ngram",),
    "decision": ("decision",),
    "mid": ("mid", "mid_end"),
    "all (the stage's)": ("ar", "tree", "ngram", "decision", "mid", "mid_end"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlay", default=None, help="params overlay (profiles/NAME.yaml)")
    parser.add_argument("--pairs", nargs="*", default=None, help=f"registered pairs or {TINY!r}")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--samples", type=int, default=4, help="samples per repeat")
    parser.add_argument("--out", default="artifacts/bench/profile_order.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)  # the stage's setting on a CPU: its clock is then this thread's CPU time
    params = load_params(profile=args.overlay)
    s = params.profile
    cfg = TreeConfig(**params.tree.model_dump())
    names = args.pairs or [n for n in s.pairs if params.pair_paths(n)[0].exists()] or [TINY]
    report = []
    for name in names:
        pair = load_named(params, name)
        grid = make_grid(s.sizes, s.mid_tokens if pair.mid is not None else (), s.mid_fed, cfg.budget)
        ref = Reference(pair, reference_context(pair, s.context_len + 1, 0), cfg)
        real = real_rounds(ref, cfg.depth)
        biggest = max(real.trees, key=len)
        rng = np.random.default_rng(0)
        big = grown(biggest, grid.max_nodes, pair.vocab_size, rng, max(*biggest.depths, cfg.depth))
        jobs = grid_jobs(ref, real, big, grid, cfg)
        clock, _ = profile_clock(pair.target.device)
        for mix, kinds in MIXES.items():
            keys = [k for k in jobs if k[0] == "verify" or k[0] in kinds]
            if not any(k[0] in kinds for k in keys):
                continue  # e.g. a pair without a mid drafter
            ms = robust_medians({k: jobs[k] for k in keys}, clock, 1, args.repeats, args.samples, 0, mix)
            points = [(k[1], ms[k]) for k in keys if k[0] == "verify"]
            print(f"{name:<12} beside {mix:<18} " + "  ".join(f"{n}:{v:.3f}" for n, v in points), flush=True)
            report.append({"pair": name, "beside": mix, "verify_ms": points})
    out = resolve(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
