"""The real pair on this machine: its profile-chosen shape against AR and the fixed policies, side by side.

Usage (after `python -m models.real_pair`, `python -m pipeline.profile --profile real-pair` and
`python -m pipeline.budget --profile real-pair`):
    .venv/bin/python benchmarks/bench_real_pair.py [--profile real-pair] [--pairs NAME ...]
        [--datasets alpaca gsm8k humaneval mt_bench] [--prompts-per-dataset 2]
        [--max-new-tokens 24] [--out artifacts/bench/real_pair]
        [--methods chosen all-small ...] [--compare all-small@2x2/n2:12 ...]

Prompts: the first --prompts-per-dataset questions of each dataset from evaluate.prompt_start on
(held back: the budget stage chose B* on the collect slice). Every method decodes every prompt
greedily in the pair's registered dtype, interleaved prompt-major after one shared warm-up
(decoder.measure.run_side_by_side, wall clock only: no per-step syncs), and is checked
compared with the target's own autoregressive output (fp32: identical or a real mismatch; bf16:
each divergence classified by the fp32 target as a near-tie or a real mismatch):
- ar: one-token target steps (the reference and the clock's unit);
- chosen: the budget stage's `decode_policy` at its B* and tree shape W x m (AR itself where
  nothing priced faster);
- all-small, all-mid, 10101: at B* and that shape;
- all-mid and 10101 again at All-Mid's own best shape and budget (when it is another one);
- student: the exported scheduler (trained on the zoo pairs only) at B* and the width its tree
  signals were trained for (W = m = 10), when artifacts/export has one;
- each --compare POLICY@WxM[/nN]:B: that policy at another shape and budget (say the one the
  budget stage chose before), in the same interleaved run.
--methods keeps only the listed ones of the above beside AR (a shorter run).
The cost breakdown comes from the pair's latency profile: AR step, verify(B* + 1), a mid call of
1..16 tokens, and the mid/target per-token cost ratio a mid call would need for All-Mid (with its
measured A here) to match AR. Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tabulate import tabulate

from collectors.collect.plan import pair_tree, profile_for
from collectors.collect.records import runtime_for
from collectors.data.prompts import encode_prompts, load_benchmarks
from collectors.pricing.budget_file import BUDGETS_FILE
from config.params import Params, load_params, resolve
from decoder.check_lossless import check_outputs, fp32_judge
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.outcome import GenerationResult
from decoder.core.policies import AR
from decoder.deploy.latency import LatencyProfile
from decoder.deploy.scheduler import load_scheduler
from decoder.measure import Method, run_side_by_side, summarise_results
from decoder.models.memory import configure_process
from decoder.models.pair import load_pair

log = logging.getLogger("bench_real_pair")
PAIRS = ("qwen2.5-coder-1.5b-0.5b", "qwen2.5-coder-1.5b-0.5b-fp32")  # bf16, fp32
FIXED = ("all-small", "all-mid", "10101")
MAX_PROMPT_TOKENS = 256
SHAPE_KEYS = (
    "budget",
    "width",
    "topk",
    "ngram_min_n",
    "round_budget",
    "speedup_fixed_budget",
    "policy",
    "decode_policy",
    "speedup_at_budget",
    "speedup_at_max",
    "shapes",
)
METHODS = ("chosen", *FIXED, "mid-shape", "student")  # mid-shape: All-Mid and 10101 at All-Mid's own best
MEASURED = ("tokens_per_s", "speedup_vs_ar", "mean_accepted_length", "mid_call_rate", "n_tokens", "wall_s")


COMPARE = re.compile(r"(?P<policy>[\w-]+)@(?P<shape>\d+x\d+(?:/n\d+)?):(?P<budget>\d+)")


def parse_shape(key: str) -> tuple[int, int, int]:
    """(width, topk, ngram_min_n) of a budget-stage shape key "WxM" or "WxM/nN" (the inverse of
    collectors.pricing.budget_plan.shape_key)."""
    dims, _, min_n = key.partition("/n")
    w, m = (int(x) for x in dims.split("x"))
    return w, m, int(min_n or 1)


def compare_method(spec: str) -> Method:
    """The Method of a --compare spec POLICY@WxM[/nN]:B, named by the spec (argparse type)."""
    match = COMPARE.fullmatch(spec)
    if match is None:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected POLICY@WxM[/nN]:B, e.g. all-small@2x2/n2:12")
    w, m, n = parse_shape(match["shape"])
    return Method(
        spec, match["policy"], TreeConfig(budget=int(match["budget"]), width=w, topk=m, ngram_min_n=n)
    )


def chosen_shape(params: Params, pair_id: str) -> dict:
    """The budget stage's entry for the pair (B*, its policy, decode_policy), or a clear error."""
    path = resolve(params.budget.out_dir) / BUDGETS_FILE
    if not path.is_file():
        raise SystemExit(f"error: {path}: run `python -m pipeline.budget --profile real-pair` first")
    entries = json.loads(path.read_text(encoding="utf-8"))
    if pair_id not in entries or "shapes" not in entries[pair_id]:
        raise SystemExit(f"error: {path}: no measured entry for {pair_id!r}")
    return entries[pair_id]


def break_even_ratio(profile: LatencyProfile, budget: int, accepted: float, depth: int) -> float:
    """Mid/target per-token cost ratio at which All-Mid's round ((1 + A) tokens for D one-token-ish
    mid calls, the tree work and verify(B + 1)) costs exactly AR's time for the same tokens."""
    ar = profile.ar_token_ms
    spare = (1.0 + accepted) * ar - profile.verify_ms(budget + 1) - profile.tree_ms(budget + 1)
    return max(spare, 0.0) / (depth * ar)


def cost_breakdown(profile: LatencyProfile, budget: int) -> dict:
    mid = {n: profile.mid_ms(n) for n in (1, 2, 4, 8, 16)} if profile.has_mid else {}
    return {
        "ar_token_ms": profile.ar_token_ms,
        "verify_ms": {n: profile.verify_ms(n) for n in sorted({1, 2, 4, budget + 1, 16, 32, 64})},
        "mid_ms": mid,
        "mid_over_target_per_token": (mid[1] / profile.ar_token_ms) if mid else None,
        "tree_ms_at_budget": profile.tree_ms(budget + 1),
        "ngram_step_ms": profile.ngram_step_ms,
    }


def per_dataset(results: dict[str, list[GenerationResult]], datasets: list[str]) -> dict[str, dict]:
    """Speedup of each method over AR per dataset (tokens/s ratio over that dataset's prompts)."""

    def tps(res: list[GenerationResult], idx: list[int]) -> float:
        return sum(len(res[i].new_tokens) for i in idx) / sum(res[i].wall_s for i in idx)

    groups = {ds: [i for i, d in enumerate(datasets) if d == ds] for ds in sorted(set(datasets))}
    return {
        name: {ds: tps(res, idx) / tps(results[AR], idx) for ds, idx in groups.items()}
        for name, res in results.items()
    }


def markdown(info: dict) -> str:
    b = info["budget"]
    shapes = ", ".join(
        f"{k} B={v['budget']} {v['policy']} {v['speedup_at_budget']:.2f}x"
        for k, v in info["shape"]["shapes"].items()
    )
    lines = [
        f"Real pair `{info['pair']}` ({info['dtype']}, {info['threads']} threads), {info['n_prompts']} "
        f"held-back prompts ({', '.join(info['datasets'])}), {info['max_new_tokens']} new tokens each; "
        f"B* = {b}, W x m = {info['shape']['width']} x {info['shape']['topk']}, n-gram matches of "
        f">= {info['shape'].get('ngram_min_n') or 1} tokens, per-round budget "
        f"{'on' if info['shape'].get('round_budget') else 'off'} (budget stage: "
        f"{info['shape']['policy']} {info['shape']['speedup_at_budget']:.2f}x priced, decodes with "
        f"{info['shape']['decode_policy']}; per shape: {shapes}).",
        "",
    ]
    head = ["method", "tok/s", "speedup vs AR", "worst dataset", "A", "mid calls / step", "identical to AR",
            "near-ties", "real mismatches"]  # fmt: skip
    body = []
    for name, m in info["methods"].items():
        worst = min(info["per_dataset"][name].items(), key=lambda kv: kv[1])
        body.append(
            [name, f"{m['tokens_per_s']:.2f}", f"{m['speedup_vs_ar']:.2f}x", f"{worst[0]} {worst[1]:.2f}x",
             f"{m['mean_accepted_length']:.2f}", f"{m['mid_call_rate']:.2f}",
             f"{m['identical']}/{info['n_prompts']}", str(m["near_ties"]), str(m["real_mismatches"])]
        )  # fmt: skip
    lines.append(tabulate(body, head, tablefmt="github", disable_numparse=True))
    c = info["costs"]
    verify = ", ".join(f"{n}: {ms:.0f}" for n, ms in c["verify_ms"].items())
    mid = ", ".join(f"{n}: {ms:.0f}" for n, ms in c["mid_ms"].items())
    be = info.get("break_even")
    lines += [
        "",
        f"Cost breakdown (profile, ms): AR step {c['ar_token_ms']:.0f}; verify by nodes {{{verify}}}; "
        f"mid call by new tokens {{{mid}}}; mid/target per token {c['mid_over_target_per_token']:.2f}"
        + (
            f"; {be['method']} (A = {be['accepted']:.2f}) would match AR at a mid/target cost ratio per "
            f"call of {be['mid_over_target']:.2f}."
            if be
            else "."
        ),
    ]
    return "\n".join(lines) + "\n"


def lossless(pair, prompts, results: dict[str, list[GenerationResult]]) -> dict[str, dict]:
    """Per method: outputs identical to AR's, and each divergence classified by the fp32 target
    (decoder.check_lossless, as collectors.evaluation.cell.lossless_gate does, without raising): a
    near-tie (bf16/fp16 only) or a real mismatch (fp32 is strict)."""
    ref = [r.new_tokens for r in results[AR]]
    differs = any([r.new_tokens for r in res] != ref for res in results.values())
    judge = fp32_judge(pair.target) if differs else pair.target  # an fp32 copy only when needed
    out = {}
    for name, res in results.items():
        report = check_outputs(judge, prompts, ref, [r.new_tokens for r in res], pair.target.dtype)
        identical = sum(c.identical for c in report.checks)
        out[name] = {
            "identical": identical,
            "near_ties": report.n_near_ties,
            "real_mismatches": report.n_real_mismatches,
        }
    return out


def held_back_prompts(
    params: Params, tokenizer: object, template: str, datasets: list[str], per_dataset: int
) -> tuple[list[str], list[list[int]]]:
    """(dataset ids, prompt token ids): the first ``per_dataset`` questions of each dataset
    from evaluate.prompt_start on (held back: the budget stage chose on the collect slice)."""
    benches = load_benchmarks(resolve(params.data.out_dir), datasets)
    start = params.evaluate.prompt_start
    questions, ids = [], []
    for ds in datasets:
        picked = benches[ds][start : start + per_dataset]
        questions += picked
        ids += [ds] * len(picked)
    return ids, encode_prompts(questions, tokenizer, template, MAX_PROMPT_TOKENS)


def measure_pair(params: Params, pair_id: str, args: argparse.Namespace) -> dict:
    shape = chosen_shape(params, pair_id)
    budget = int(shape["budget"])
    profile = profile_for(params, pair_id)
    spec = params.pairs[pair_id]
    target, mid = params.pair_paths(pair_id)
    pair = load_pair(target, mid, dtype=spec.dtype, device=spec.device, linear=spec.linear)

    datasets, prompts = held_back_prompts(
        params, pair.tokenizer, spec.template, args.datasets, args.prompts_per_dataset
    )

    tree = pair_tree(params, pair_id)  # B*, W x m, n-gram min n and any per-round rule
    wanted = set(args.methods)
    methods = [Method(name, name, tree) for name in FIXED if name in wanted]
    if shape["decode_policy"] != AR and "chosen" in wanted:
        methods.insert(0, Method("chosen", shape["decode_policy"], tree))
    mid_shape, (mid_b, _) = max(
        ((k, v["best"]["all-mid"]) for k, v in shape["shapes"].items()), key=lambda kv: kv[1][1]
    )
    w, m, n = parse_shape(mid_shape)
    elsewhere = (w, m, n, mid_b) != (tree.width, tree.topk, tree.ngram_min_n, tree.budget)
    if elsewhere and "mid-shape" in wanted:  # All-Mid's own best is another shape or budget
        mid_tree = TreeConfig(budget=int(mid_b), width=w, topk=m, ngram_min_n=n)
        methods += [Method(f"{name} @{mid_shape} B={mid_b}", name, mid_tree) for name in ("all-mid", "10101")]
    methods += args.compare  # other shapes side by side, e.g. a previous choice
    student = resolve(params.export.out_dir) / "scheduler.json"
    if student.is_file() and "student" in wanted:  # the zoo-trained student, on a pair it never saw
        sched = load_scheduler(student, tree.depth)  # its tree signals are those of its own width
        w = int(sched.manifest["width"])
        s_tree = dataclasses.replace(tree, width=w, topk=w)
        methods.append(Method(f"student @{w}x{w}", sched, s_tree))
    runtimes = [runtime_for(profile, len(p), TreeConfig(budget=tree.budget)) for p in prompts]
    config = DecodeConfig(max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    results = run_side_by_side(pair, prompts, methods, config, runtimes, warmup_tokens=4, timing=False)
    seconds = time.perf_counter() - t0
    rows = summarise_results(results, config.temperature)
    checks = lossless(pair, prompts, results)
    info = {
        "pair": pair_id,
        "dtype": spec.dtype,
        "threads": params.runtime.torch_threads,
        "datasets": args.datasets,
        "n_prompts": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "max_new_tokens": args.max_new_tokens,
        "budget": budget,
        "shape": {k: shape.get(k) for k in SHAPE_KEYS},
        "seconds": seconds,
        "methods": {n: {**{k: getattr(m, k) for k in MEASURED}, **checks[n]} for n, m in rows.items()},
        "per_dataset": per_dataset(results, datasets),
        "costs": cost_breakdown(profile, budget),
    }
    if shape["decode_policy"] == AR:
        info["methods"]["chosen"] = {**info["methods"][AR], "note": "falls back to AR"}
        info["per_dataset"]["chosen"] = info["per_dataset"][AR]
    mid_name, mid_budget = next(
        ((n, int(mid_b)) for n in info["methods"] if n.startswith("all-mid @")), ("all-mid", budget)
    )
    if mid_name in info["methods"]:
        a_mid = info["methods"][mid_name]["mean_accepted_length"]
        info["break_even"] = {
            "method": mid_name,
            "accepted": a_mid,
            "mid_over_target": break_even_ratio(profile, mid_budget, a_mid, tree.depth),
        }
    log.info("%s: %.0f s", pair_id, seconds)
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="real-pair")
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS))
    parser.add_argument("--datasets", nargs="+", default=["alpaca", "gsm8k", "humaneval", "mt_bench"])
    parser.add_argument("--prompts-per-dataset", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", default="artifacts/bench/real_pair")
    parser.add_argument(
        "--methods", nargs="+", choices=METHODS, default=list(METHODS),
        help="the methods decoded beside AR (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--compare", nargs="*", default=[], metavar="POLICY@WxM[/nN]:B", type=compare_method,
        help="also decode POLICY at another shape, e.g. all-small@2x2/n2:12 (a previous choice)",
    )  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    params = load_params(profile=args.profile)
    configure_process(params.runtime.torch_threads, params.runtime.keep_freed_memory)  # as the stages
    infos = [measure_pair(params, pair_id, args) for pair_id in args.pairs]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(infos, indent=2) + "\n", encoding="utf-8")
    text = "\n".join(markdown(info) for info in infos)
    out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
