"""Regime table: All-Small vs All-Mid speedup over autoregressive decoding for every zoo pair.

Usage (after `make repro`):
    .venv/bin/python benchmarks/bench_regimes.py [--profile NAME] [--pairs zoo-l zoo-s]
        [--prompts 3] [--max-new-tokens 64] [--out artifacts/bench/regimes]

Each pair decodes the first ``--prompts`` questions of every embedded dataset (formatted with the
pair's template) with AR, All-Small and All-Mid through decoder.measure.measure_policies (same
warm-up and clock for every method). A pair's regime: "all-mid" when All-Mid's speedup is >= 1.10x
All-Small's, "all-small" when All-Small's is >= 1.10x All-Mid's, "close" within 5%, else "-".
It is given per pair (all datasets pooled) and per (pair, dataset) report, the unit the scheduler
is trained on. Writes <out>.md (the README table) and <out>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tabulate import tabulate

from collectors.data.prompts import encode_prompts, load_benchmarks
from config.params import Params, load_params, resolve
from decoder.core.config import DecodeConfig
from decoder.measure import measure_policies
from decoder.models.pair import load_pair

log = logging.getLogger("bench_regimes")
POLICIES = ("ar", "all-small", "all-mid")


def regime(small: float, mid: float) -> str:
    """Name the regime from the two endpoint speedups."""
    if mid >= 1.10 * small:
        return "all-mid"
    if small >= 1.10 * mid:
        return "all-small"
    if abs(mid - small) <= 0.05 * max(mid, small):
        return "close"
    return "-"


def _speedups(rows: dict[str, dict]) -> dict[str, dict]:
    """Pooled tokens/s of each policy and its ratio to AR's."""
    tps = {p: r["n_tokens"] / r["wall_s"] for p, r in rows.items()}
    return {p: {"speedup_vs_ar": tps[p] / tps["ar"], "mean_accepted_length": r["mean_accepted_length"],
                "tokens_per_s": tps[p], "n_tokens": r["n_tokens"], "wall_s": r["wall_s"],
                "lossless": r.get("lossless", True)}
            for p, r in rows.items()}  # fmt: skip


def _pool(per_dataset: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """All datasets together: summed tokens and seconds, round-weighted accepted length."""
    pooled: dict[str, dict] = {}
    for policy in POLICIES:
        runs = [d[policy] for d in per_dataset.values()]
        rounds = [r["n_tokens"] / (r["mean_accepted_length"] + 1) for r in runs]
        acc = sum(r["mean_accepted_length"] * n for r, n in zip(runs, rounds, strict=True))
        pooled[policy] = {"n_tokens": sum(r["n_tokens"] for r in runs),
                          "wall_s": sum(r["wall_s"] for r in runs),
                          "lossless": all(r["lossless"] for r in runs),
                          "mean_accepted_length": acc / sum(rounds) if policy != "ar" else 0.0}  # fmt: skip
    return _speedups(pooled)


def measure_pair(params: Params, name: str, n_prompts: int, max_new: int, max_prompt: int) -> dict:
    """Per dataset and pooled AR / All-Small / All-Mid measurements of one registered pair."""
    spec = params.pairs[name]
    target, mid = params.pair_paths(name)
    pair = load_pair(target, mid, dtype=spec.dtype, device=spec.device, linear=spec.linear)
    benches = load_benchmarks(resolve(params.data.out_dir), list(params.data.datasets))
    t0 = time.perf_counter()
    per_dataset = {}
    for dataset, questions in benches.items():
        prompts = encode_prompts(questions[:n_prompts], pair.tokenizer, spec.template, max_prompt)
        rows = measure_policies(pair, prompts, POLICIES, DecodeConfig(max_new_tokens=max_new))
        per_dataset[dataset] = _speedups({p: asdict(m) for p, m in rows.items()})
    pooled = _pool(per_dataset)
    if not all(r["lossless"] for r in pooled.values()):
        log.warning("%s: some speculative output differed from autoregressive decoding", name)
    small, mid_ = pooled["all-small"]["speedup_vs_ar"], pooled["all-mid"]["speedup_vs_ar"]
    info = {
        "pair": name,
        "target_params_m": sum(p.numel() for p in pair.target.parameters()) / 1e6,
        "mid_params_m": sum(p.numel() for p in pair.mid.parameters()) / 1e6,
        "ar_tokens_per_s": pooled["ar"]["tokens_per_s"],
        "regime": regime(small, mid_),
        "mid_over_small": mid_ / small,
        "seconds": time.perf_counter() - t0,
        "pooled": pooled,
        "per_dataset": per_dataset,
    }
    log.info("%s: small %.2fx (A %.2f), mid %.2fx (A %.2f) -> %s", name, small,
             pooled["all-small"]["mean_accepted_length"], mid_,
             pooled["all-mid"]["mean_accepted_length"], info["regime"])  # fmt: skip
    return info


def _row(label: str, rows: dict[str, dict], extra: str) -> list[str]:
    s, m = rows["all-small"], rows["all-mid"]
    ratio = m["speedup_vs_ar"] / s["speedup_vs_ar"]
    return [
        label,
        extra,
        f"{s['speedup_vs_ar']:.2f}x ({s['mean_accepted_length']:.2f})",
        f"{m['speedup_vs_ar']:.2f}x ({m['mean_accepted_length']:.2f})",
        f"{ratio:.2f}",
        regime(s["speedup_vs_ar"], m["speedup_vs_ar"]),
    ]


def markdown(results: list[dict]) -> str:
    """Pooled row per pair, then one row per (pair, dataset) report."""
    head = ["pair / report", "target / mid params, AR tok/s", "All-Small speedup (A)", "All-Mid speedup (A)",
            "Mid/Small", "regime"]  # fmt: skip
    body = []
    for r in results:
        extra = f"{r['target_params_m']:.1f}M / {r['mid_params_m']:.2f}M, {r['ar_tokens_per_s']:.0f}"
        body.append(_row(f"**{r['pair']}** (all)", r["pooled"], extra))
    for r in results:
        for dataset, rows in r["per_dataset"].items():
            body.append(_row(f"{r['pair']} / {dataset}", rows, f"{rows['ar']['tokens_per_s']:.0f}"))
    return tabulate(body, head, tablefmt="github", disable_numparse=True) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None)
    parser.add_argument("--pairs", nargs="*", default=None)
    parser.add_argument("--prompts", type=int, default=3, help="questions per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="artifacts/bench/regimes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    params = load_params(profile=args.profile)
    names = args.pairs or [n for n in params.pairs if params.pair_paths(n)[0].exists()]
    results = [measure_pair(params, n, args.prompts, args.max_new_tokens, args.max_prompt_tokens)
               for n in names]  # fmt: skip
    out = resolve(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = markdown(results)
    out.with_suffix(".md").write_text(table)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    print(table)


if __name__ == "__main__":
    main()
