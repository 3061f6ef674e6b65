"""The one-command device check (`make gpu-check DEVICE=cuda`; `DEVICE=cpu` in CI at smoke sizes).

On the zoo pairs (artifacts/zoo after a full run, else the smoke zoo trained here in well under a
minute; no network), for every policy: AR, All-Small, All-Mid, a fixed schedule (10101), the
deployed scheduler (a deployment bundle: --deployment, else artifacts/deploy; "not available" with
the reason when there is none), DDTree (the pair's zoo block drafter) and GRAFT (that drafter with
the TDES edge scorer of artifacts/fit_edges; without one, DDTree's row again, noted):
- lossless in float32 (token-identical to the target's own greedy output) and in bfloat16 (every
  divergence classified by decoder.check_lossless: near-tie or real mismatch);
- a side-by-side table per pair: tok/s, speedup over AR, mean accepted length A, and priced over
  measured time where a latency profile of this device exists (the re-profile below, or
  artifacts/profile/<pair>.json taken on a device of the same name);
- a re-profile of the first pair on this device (collectors.pricing.profiling, CUDA events on a GPU) and
  the budget stage's tree-shape and budget choice for it from that profile
  (collectors.pricing.budget_entry.choose).
Writes ``gpu_check.json`` and ``gpu_check.md`` under --out (default $OUT, else artifacts/gpu_check).
Exit status 1 when any float32 row is not lossless, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate

from benchmarks.gpu_check_parts import (
    Method,
    check_prompts,
    deployed_method,
    priced_over_measured,
    zoo_params,
)
from collectors.collect.plan import tree_config
from collectors.pricing.budget_entry import choose
from collectors.pricing.budget_plan import shape_key, tree_shapes
from collectors.pricing.budget_sweep import sweep_pair
from collectors.pricing.profile_passes import save_profile
from collectors.pricing.profiling import device_name, measure_profile
from config.params import Params, resolve
from decoder.check_lossless import check_outputs, fp32_judge
from decoder.core.config import BlockConfig, DecodeConfig, TreeConfig
from decoder.core.outcome import GenerationResult
from decoder.deploy.latency import LatencyProfile, load_profile
from decoder.generate import generate
from decoder.graft.drafter import load_block_drafter
from decoder.graft.edge_scorer import EdgeScorerError, load_edge_scorer
from decoder.models.pair import ModelPair, load_pair

log = logging.getLogger("gpu_check")
DTYPES = ("float32", "bfloat16")
POLICIES = ("ar", "all-small", "all-mid", "10101", "deployed", "ddtree", "graft")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much the check decodes: the smoke sizes run in CI on a CPU."""

    prompts: int
    max_new_tokens: int
    prompt_tokens: int
    tree_budget: int | None  # None: params.yaml's tree.budget
    block_budget: int | None  # None: params.yaml's edges.budget
    profile_repeats: int
    profile_samples: int  # samples per repeat
    budget_prompts: int


FULL = Sizes(3, 48, 96, None, None, 4, 2, 2)
SMOKE = Sizes(2, 12, 48, 16, 16, 2, 1, 1)


def _methods(params: Params, pair_id: str, pair: ModelPair, deployment: Path | None) -> list[Method]:
    """Every policy row of a pair; the block drafter and edge scorer attached to this pair's target."""
    methods = [Method(p, p) for p in ("ar", "all-small", "all-mid", "10101")]
    methods.append(deployed_method(deployment, pair_id))
    drafters = dict(zip(params.edges.pairs, params.edges.drafters, strict=True))
    if pair_id not in drafters:
        why = f"no zoo block drafter for {pair_id} (edges.pairs: {list(params.edges.pairs)})"
        return [*methods, Method("ddtree", missing=why), Method("graft", missing=why)]
    drafter = load_block_drafter(resolve(params.zoo.out_dir) / drafters[pair_id], pair.target)
    methods.append(Method("ddtree", "ddtree", proposer=drafter, note=f"block drafter {drafters[pair_id]}"))
    folder = resolve(params.edges.fit_dir) / "scorers" / pair_id
    try:
        scorer, _ = load_edge_scorer(folder, vocab_size=pair.vocab_size, k=drafter.k)
        methods.append(Method("graft", "ddtree", proposer=drafter, edge_scorer=scorer, note="DDTree + TDES"))
    except EdgeScorerError as err:
        note = f"DDTree without the TDES edge scorer ({err})"
        methods.append(Method("graft", "ddtree", proposer=drafter, note=note))
    return methods


def _decode_all(
    pair: ModelPair, prompts: list[list[int]], methods: list[Method], config: DecodeConfig
) -> dict[str, list[GenerationResult]]:
    """One short warm-up per method, then prompt-major: every method on a prompt in turn, so a noisy
    machine's drift hits all alike. timing=False: no per-step syncs, wall times only."""
    runnable = [m for m in methods if not m.missing]

    def run(m: Method, prompt: list[int], cfg: DecodeConfig) -> GenerationResult:
        cfg = cfg if m.tree is None else dataclasses.replace(cfg, tree=m.tree)
        runtime = m.runtime_of(len(prompt)) if m.runtime_of is not None else None
        return generate(pair, prompt, m.policy, cfg, runtime, False, m.proposer, m.edge_scorer)

    warm = dataclasses.replace(config, max_new_tokens=min(8, config.max_new_tokens))
    for m in runnable:
        run(m, prompts[0], warm)
    out: dict[str, list[GenerationResult]] = {m.name: [] for m in runnable}
    for prompt in prompts:
        for m in runnable:
            out[m.name].append(run(m, prompt, config))
    return out


def _row(res: list[GenerationResult], ar_tps: float) -> dict[str, Any]:
    n = sum(len(r.new_tokens) for r in res)
    wall = sum(r.wall_s for r in res)
    rounds = [rd for r in res for rd in r.rounds]
    tps = n / wall if wall > 0 else 0.0
    return {
        "tokens": n,
        "tok_per_s": tps,
        "speedup_vs_ar": tps / ar_tps if ar_tps > 0 else float("nan"),
        # as decoder.measure: accepted drafted tokens per round (AR drafts none)
        "mean_accepted": sum(rd.accepted for rd in rounds) / len(rounds) if rounds else 0.0,
        "tokens_per_round": sum(rd.emitted for rd in rounds) / len(rounds) if rounds else 1.0,
    }


def _check_dtype(
    params: Params,
    pair_id: str,
    dtype: str,
    device: str,
    sizes: Sizes,
    config: DecodeConfig,
    deployment: Path | None,
    judge: torch.nn.Module | None,
) -> tuple[dict[str, Any], dict[str, list[GenerationResult]], torch.nn.Module]:
    """Decode every method in one dtype; rows with their lossless verdict; the fp32 judge."""
    target, mid = params.pair_paths(pair_id)
    pair = load_pair(target, mid, dtype, device, params.pairs[pair_id].linear)
    judge = judge if judge is not None else fp32_judge(pair.target)
    prompts = check_prompts(params, pair_id, pair.tokenizer, sizes.prompts, sizes.prompt_tokens)
    methods = _methods(params, pair_id, pair, deployment)
    t0 = time.perf_counter()
    results = _decode_all(pair, prompts, methods, config)
    refs = [r.new_tokens for r in results["ar"]]
    ar_tps = _row(results["ar"], 0.0)["tok_per_s"]
    rows: dict[str, Any] = {}
    for m in methods:
        if m.missing:
            rows[m.name] = {"available": False, "reason": m.missing}
            continue
        outs = [r.new_tokens for r in results[m.name]]
        report = check_outputs(judge, prompts, refs, outs, pair.target.dtype)
        lossless = outs == refs if dtype == "float32" else report.ok
        divergences = [dataclasses.asdict(d) for c in report.checks for d in c.divergences]
        rows[m.name] = {
            "available": True,
            "note": m.note,
            **_row(results[m.name], ar_tps),
            "lossless": lossless,
            "check": report.summary(),
            "divergences": divergences[:20],
        }
    log.info("%s %s: %d methods in %.1f s", pair_id, dtype, len(results), time.perf_counter() - t0)
    return {"prompts": len(prompts), "rows": rows}, results, judge


def _device_profile(pair_id: str, dev_name: str) -> LatencyProfile | None:
    """artifacts/profile/<pair>.json when it was taken on a device of this name."""
    path = resolve("artifacts/profile") / f"{pair_id}.json"
    if not path.is_file():
        return None
    try:
        profile = load_profile(path)
    except (OSError, ValueError) as err:  # a broken file prices nothing; the check goes on
        log.warning("%s: not a latency profile (%s)", path, err)
        return None
    return profile if profile.device_name == dev_name else None


def _reprofile(params: Params, pair_id: str, device: str, tree: TreeConfig, sizes: Sizes) -> LatencyProfile:
    """The pair's latency profile on this device at small sizes (one pass)."""
    target, mid = params.pair_paths(pair_id)
    pair = load_pair(target, mid, "float32", device, params.pairs[pair_id].linear)
    grid = sorted({1, 4, 16, 32, 64, tree.budget + 1})
    return measure_profile(
        pair,
        pair_id,
        context_len=64,
        sizes=grid,
        warmup=1,
        repeats=sizes.profile_repeats,
        tree_config=tree,
        mid_tokens=(1, 4, 16, 64),
        mid_fed=(0, 16),
        samples_per_repeat=sizes.profile_samples,
    )


def _budget_choice(
    params: Params, pair_id: str, device: str, profile: LatencyProfile, tree: TreeConfig, sizes: Sizes
) -> dict[str, Any]:
    """The budget stage's pick for the pair from this device's profile: per tree shape the sweep of
    every budget (collectors.pricing.budget_entry.choose), then the best-priced shape, as the budget
    stage does."""
    target, mid = params.pair_paths(pair_id)
    pair = load_pair(target, mid, "float32", device, params.pairs[pair_id].linear)
    prompts = check_prompts(params, pair_id, pair.tokenizer, sizes.budget_prompts, sizes.prompt_tokens)
    picks = {}
    for width, topk, min_n in tree_shapes(params):
        shaped = dataclasses.replace(tree, width=width, topk=topk, ngram_min_n=min_n)
        sweeps = sweep_pair(
            pair, profile, prompts, shaped, sizes.max_new_tokens, schedules=params.budget.schedules
        )
        pick = choose(
            sweeps, profile, len(prompts), params.budget.round_gain_scales, params.budget.round_min_gain
        )
        picks[shape_key(width, topk, min_n)] = {
            k: pick[k] for k in ("budget", "policy", "decode_policy", "speedup_at_budget", "saba_budget")
        }
    best = max(picks, key=lambda k: picks[k]["speedup_at_budget"])
    return {"shape": best, **picks[best], "shapes": picks}


def _price_rows(rows: dict[str, Any], profile: LatencyProfile | None, results: dict[str, Any]) -> None:
    """Each available fp32 row's priced / measured ratio under ``profile`` (None: no ratio)."""
    for name, row in rows.items():
        if not row["available"]:
            continue
        row["priced_over_measured"], row["priced_note"] = None, ""
        if profile is None:
            row["priced_note"] = "no latency profile of this device"
        elif name in ("ddtree", "graft"):
            row["priced_note"] = "block proposer not in a tree profile"
        else:
            row["priced_over_measured"] = priced_over_measured(profile, results[name], name == "ar")


def _profile_section(
    args: argparse.Namespace, params: Params, pair_id: str, tree: TreeConfig, sizes: Sizes
) -> tuple[dict[str, Any], dict[str, Any], LatencyProfile]:
    """The re-profile of ``pair_id`` on the device (saved beside the report) and the budget
    stage's choice from it."""
    t0 = time.perf_counter()
    profile = _reprofile(params, pair_id, args.device, tree, sizes)
    save_profile(profile, args.out / f"profile_{pair_id}.json")
    summary = {
        "pair": pair_id,
        "clock": profile.clock,
        "seconds": time.perf_counter() - t0,
        "ar_token_ms": profile.ar_token_ms,
        "verify_points": profile.verify_points,
    }
    return summary, _budget_choice(params, pair_id, args.device, profile, tree, sizes), profile


def run_check(args: argparse.Namespace, work: Path, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Everything the module docstring lists, as one JSON-ready report; ``save`` gets the report
    after every pair and section, so a crash on the device still leaves what was checked."""
    sizes = SMOKE if args.smoke else FULL
    params, full_zoo = zoo_params(work, args.zoo, args.pairs, args.train_zoo)
    pairs = args.pairs or list(params.edges.pairs)
    tree = tree_config(params.tree)
    if sizes.tree_budget is not None:
        tree = dataclasses.replace(tree, budget=min(tree.budget, sizes.tree_budget))
    block = BlockConfig(budget=sizes.block_budget or params.edges.budget, topk=params.edges.topk)
    config = DecodeConfig(max_new_tokens=sizes.max_new_tokens, tree=tree, block=block)
    dev = torch.device(args.device)
    dev_name = device_name(dev)
    report: dict[str, Any] = {
        "device": str(dev),
        "device_name": dev_name,
        "torch": torch.__version__,
        "zoo": "full" if full_zoo else "smoke",
        "sizes": dataclasses.asdict(sizes),
        "complete": False,
        "fp32_lossless": True,
        "pairs": {},
    }
    t0 = time.perf_counter()
    first_results: dict[str, Any] = {}
    for pair_id in pairs:  # the lossless checks first: they matter most if the slot runs out
        entry: dict[str, Any] = {}
        judge = None
        for dtype in DTYPES:
            entry[dtype], results, judge = _check_dtype(
                params, pair_id, dtype, args.device, sizes, config, args.deployment, judge
            )
            if dtype == "float32":
                _price_rows(entry[dtype]["rows"], _device_profile(pair_id, dev_name), results)
                first_results = first_results or results
        report["pairs"][pair_id] = entry
        rows = entry["float32"]["rows"].values()
        report["fp32_lossless"] &= all(r["lossless"] for r in rows if r["available"])
        save(report)
    report["profile"], report["budget_choice"], profile = _profile_section(
        args, params, pairs[0], tree, sizes
    )
    _price_rows(report["pairs"][pairs[0]]["float32"]["rows"], profile, first_results)
    report["total_s"], report["complete"] = time.perf_counter() - t0, True
    save(report)
    return report


TABLE_HEAD = ["policy", "tok/s", "speedup", "A", "priced/measured", "fp32 lossless", "bf16 identical",
              "bf16 near-ties", "bf16 real mismatches", "note"]  # fmt: skip


def _table_row(name: str, row: dict[str, Any], bf16: dict[str, Any]) -> list[str]:
    if not row["available"]:
        return [name, "-", "-", "-", "-", "not available", "-", "-", "-", row["reason"]]
    ratio, check = row.get("priced_over_measured"), bf16["check"]
    notes = "; ".join(n for n in (row["note"], row.get("priced_note", "")) if n)
    return [name, f"{row['tok_per_s']:.1f}", f"{row['speedup_vs_ar']:.2f}x", f"{row['mean_accepted']:.2f}",
            "-" if ratio is None else f"{ratio:.2f}", "yes" if row["lossless"] else "NO",
            f"{check['sequence_agreement']:.0%}", str(check["near_ties"]), str(check["real_mismatches"]),
            notes]  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    """The side-by-side tables, one per pair, with the device named; a partial report (a crash
    part-way) says so."""
    done = f"{report['total_s']:.0f} s" if report["complete"] else "INCOMPLETE (stopped part-way)"
    lines = [
        f"# Device check on {report['device_name']} ({report['device']}, torch {report['torch']})",
        "",
        f"Zoo: {report['zoo']}; fp32 lossless: {'yes' if report['fp32_lossless'] else 'NO'}; {done}.",
        "",
        "A: accepted drafted tokens per round (decoder.measure's); priced/measured: the latency "
        "profile's price of the decode over its wall time, prefill excluded.",
        "",
    ]
    for pair_id, entry in report["pairs"].items():
        rows = entry["float32"]["rows"]
        body = [_table_row(name, row, entry["bfloat16"]["rows"][name]) for name, row in rows.items()]
        lines += [
            f"## {pair_id}",
            "",
            tabulate(body, TABLE_HEAD, tablefmt="github", disable_numparse=True),
            "",
        ]
    if "profile" in report:
        p, b = report["profile"], report["budget_choice"]
        n, ms = p["verify_points"][-1]
        lines += [
            f"Re-profile of {p['pair']} ({p['clock']} clock, {p['seconds']:.0f} s): AR step "
            f"{p['ar_token_ms']:.3f} ms, verify of {n} nodes {ms:.3f} ms.",
            "",
            f"Budget stage's choice for {p['pair']}: shape {b['shape']}, B* = {b['budget']} ({b['policy']}, "
            f"priced {b['speedup_at_budget']:.2f}x; decodes with {b['decode_policy']}).",
            "",
        ]
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or resolve("artifacts/gpu_check")))
    p.add_argument("--deployment", type=Path, help="a deployment bundle (default artifacts/deploy)")
    p.add_argument(
        "--zoo", type=Path, help="a trained zoo folder (default artifacts/zoo, else train the smoke zoo)"
    )
    p.add_argument("--pairs", nargs="+", help="pairs to check (default edges.pairs)")
    p.add_argument("--smoke", action="store_true", help="smallest sizes (CI)")
    p.add_argument(
        "--train-zoo", action="store_true", help="train the smoke zoo even where artifacts/zoo exists"
    )
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this torch build ({torch.__version__}) sees no CUDA device")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        p.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = _parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    def save(report: dict[str, Any]) -> None:
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (args.out / "gpu_check.md").write_text(markdown(report))

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        report = run_check(args, Path(work), save)
    print(markdown(report))
    return 0 if report["fp32_lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
