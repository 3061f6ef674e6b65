"""Profile stability: measure one pair's latency profile twice, back to back, and compare.

Usage:
    .venv/bin/python benchmarks/bench_profile_stability.py [--pairs zoo-m] [--runs 2]
        [--repeats N] [--samples N] [--threads 2] [--out artifacts/bench/profile_stability.json]

Each run is a full `measure_profile` with the `profile` stage's settings (params.yaml, overridable
here). Printed per component (verify curve, mid table, small step, decision, AR step, tree work):
the geometric-mean ratio run k / run 1 over its measured points and the point furthest from 1;
each run's profile is saved next to --out.
The goal is agreement within 5% per component. The pair `tiny` (built on the spot) stands in when
the zoo is not built yet. Numbers from a machine other jobs are using are noise-bound: say so.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.pair_sources import TINY, load_named
from collectors.pricing.profile_passes import Agreement, compare_profiles, save_profile
from collectors.pricing.profiling import measure_profile
from config.params import load_params, resolve


def format_agreement(pair: str, run: int, rows: list[Agreement], tolerance: float) -> str:
    lines = []
    for g in rows:
        ok = "ok" if g.worst_deviation <= tolerance else "OFF"
        lines.append(
            f"{pair:<12} run {run} {g.component:<9} {g.n_points:>3} points  geomean {g.geomean_ratio:.3f}  "
            f"worst {g.worst_ratio:.3f}  {ok}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlay", default=None, help="params overlay (profiles/NAME.yaml)")
    parser.add_argument("--pairs", nargs="*", default=None, help=f"registered pairs or {TINY!r}")
    parser.add_argument("--zoo-dir", default=None, help="models from here instead of params' zoo.out_dir")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None, help="samples per repeat")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the pipeline's)")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--out", default="artifacts/bench/profile_stability.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    params = load_params(
        profile=args.overlay, overrides={"zoo": {"out_dir": args.zoo_dir}} if args.zoo_dir else None
    )
    s = params.profile
    names = args.pairs or [n for n in ("zoo-m",) if params.pair_paths(n)[0].exists()] or [TINY]
    report = []
    out = resolve(args.out)
    for name in names:
        pair = load_named(params, name)
        profiles, seconds = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            profiles.append(
                measure_profile(
                    pair, name, context_len=s.context_len, sizes=s.sizes, warmup=s.warmup,
                    repeats=args.repeats or s.repeats, mid_tokens=s.mid_tokens, mid_fed=s.mid_fed,
                    samples_per_repeat=args.samples or s.samples_per_repeat, long_job_ms=s.long_job_ms,
                )
            )  # fmt: skip
            seconds.append(time.perf_counter() - t0)
            save_profile(profiles[-1], out.parent / f"{out.stem}-{name}-run{len(profiles)}.json")
        print(f"{name}: {args.runs} profiles, {', '.join(f'{x:.0f}' for x in seconds)} s each")
        for k, other in enumerate(profiles[1:], start=2):
            rows = compare_profiles(profiles[0], other)
            print(format_agreement(name, k, rows, args.tolerance))
            report.append({"pair": name, "run": k, "seconds": seconds, "components": [vars(g) for g in rows]})
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
