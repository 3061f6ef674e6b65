"""Never slower than AR? Per prompt, AR and the chosen policy decoded alternately, fp32 and bf16.

Usage:
    .venv/bin/python benchmarks/bench_never_loses.py --pair zoo-m            # a registered (zoo) pair
    .venv/bin/python benchmarks/bench_never_loses.py --target PATH --mid PATH --template chatml \\
        [--latency-profile PROFILE.json]                                     # a pair by local path
    [--questions question.jsonl] [--limit N] [--per-dataset 2] [--datasets alpaca sum ...]
    [--dtypes float32 bfloat16] [--policy all-small] [--budget 6 --width 2 --topk 2 --ngram-min-n 2]
    [--switch-off] [--repeats 3] [--most-repeats 3] [--order lockstep] [--max-new-tokens 32]
    [--linear stock]
    [--out artifacts/bench/never_loses]

Prompts: a Spec-Bench-format question.jsonl (--questions; category per question), or by default the
project's own held-back prompts: the first --per-dataset questions of each dataset of
evaluate.datasets from evaluate.prompt_start on (artifacts/data, written by the data stage).
Policy: a registered pair decodes with the budget stage's decode_policy at its chosen shape when
budgets.json has it; otherwise, and for a pair by path, --policy at the shape given here (the
defaults are issue 51's B = 6, W x m = 2 x 2, n-gram matches >= 2). --switch-off wraps the policy
in decoder.deploy.switch_off.SwitchOff, priced with the pair's latency profile (the profile stage's for a
registered pair, --latency-profile for one by path).
Per dtype the pair is loaded afresh and every prompt is decoded by AR and by the policy --repeats
times, each keeping its median-time run (one shared warm-up first, wall clock only). By default
(--order lockstep) the two decode a prompt together, one round of each in turn, every round timed on
its own (decoder.measure.run_lockstep), so a slow spell of this shared machine falls on both alike;
--order sequential decodes AR, then the policy.
Per prompt: the wall-time ratio AR / policy, the CPU-time ratio of the same runs (every thread of
the process: work the policy does in other threads shows there; on a contended machine it moves
with wall time, spinning threads burning CPU while they wait), A (accepted drafted tokens per
round), the rounds verified / run as AR / switch-offs, the priced ratio when a profile is at hand,
and whether the output is identical to AR's, a classified near-tie (bf16) or a real mismatch
(decoder.check_lossless, fp32 judge). Per dtype, for wall and CPU time: pooled ratio (tokens/s),
minimum, prompts under 0.97x; and the process's RSS after loading and at its peak. Writes
<out>.json, .md. With --repeats 2 or more, each prompt also gets a paired figure, for wall and for
CPU time: the i-th AR and policy runs ran together (or back to back), so their ratio cancels slow
drift; the geometric mean of these per-run ratios and its 95% bootstrap interval over runs. A prompt
is shown under the floor only when the whole interval is under 0.97x, and shown at or above it when
the whole interval is at or above; otherwise this machine's noise leaves it undecided at that many
repeats. --most-repeats N (above --repeats) times an undecided prompt again, --repeats runs at a
time, until its wall-clock interval decides or it has N runs; every run counts, and its median run
is taken afresh. Looking again after each batch makes a wrong verdict somewhat likelier than one
look's 5%; the cap bounds how many looks there are, and every prompt's row shows its run count.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from tabulate import tabulate

from collectors.collect.plan import pair_tree, profile_for, profile_path, tree_config
from collectors.data.prompts import PromptFileError, Question, encode_prompts, load_benchmarks, load_questions
from collectors.evaluation.bootstrap import paired_interval
from collectors.pricing.budget_file import budgets_path
from config.params import Params, load_params, resolve
from decoder.check_lossless import check_outputs, fp32_judge
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.core.outcome import GenerationResult
from decoder.core.policies import AR
from decoder.deploy.latency import LatencyProfile, load_profile
from decoder.deploy.round_prices import ProfilePricer
from decoder.deploy.switch_off import SwitchOff, priced_switch_off
from decoder.measure import Method, Repeats, median_run, run_side_by_side
from decoder.models.memory import keep_freed_memory
from decoder.models.pair import load_pair

log = logging.getLogger("bench_never_loses")
MAX_PROMPT_TOKENS = 256
FLOOR = 0.97  # issue 51: every prompt at least this fraction of AR's speed
N_BOOT = 2000  # resamples of a prompt's runs for its paired interval
POLICY = "policy"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the pair comes from and what it decodes with."""

    name: str
    target: Path
    mid: Path | None
    template: str
    tree: TreeConfig
    policy: str
    profile: LatencyProfile | None


def rss_gib() -> tuple[float, float]:
    """(current, peak) resident set size of this process in GiB (Linux)."""
    current = 0.0
    with open("/proc/self/status", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return current, max(current, peak)  # the kernel's high-water mark can trail VmRSS by a few pages


def held_back(params: Params, per_dataset: int, datasets: list[str] | None = None) -> list[Question]:
    """The first per_dataset questions of each dataset (default: evaluate's) from evaluate.prompt_start
    on."""
    names = list(datasets or params.evaluate.datasets)
    benches = load_benchmarks(resolve(params.data.out_dir), names)
    start = params.evaluate.prompt_start
    return [q for qs in benches.values() for q in qs[start : start + per_dataset]]


def cli_tree(params: Params, args: argparse.Namespace) -> TreeConfig:
    return dataclasses.replace(
        tree_config(params.tree),
        budget=args.budget,
        width=args.width,
        topk=args.topk,
        ngram_min_n=args.ngram_min_n,
    )


def source_of(params: Params, args: argparse.Namespace) -> Source:
    if args.pair:
        target, mid = params.pair_paths(args.pair)
        spec = params.pairs[args.pair]
        has_profile = profile_path(params, args.pair).is_file()
        profile = profile_for(params, args.pair) if has_profile else None
        tree, policy = cli_tree(params, args), args.policy
        chosen = budgets_path(params)
        if chosen.is_file() and args.pair in json.loads(chosen.read_text(encoding="utf-8")):
            tree = pair_tree(params, args.pair)
            policy = json.loads(chosen.read_text(encoding="utf-8"))[args.pair].get("decode_policy", policy)
        return Source(
            args.pair, Path(target), Path(mid) if mid else None, spec.template, tree, policy, profile
        )
    profile = load_profile(args.latency_profile) if args.latency_profile else None
    mid = Path(args.mid) if args.mid else None
    return Source(
        Path(args.target).name,
        Path(args.target),
        mid,
        args.template,
        cli_tree(params, args),
        args.policy,
        profile,
    )


def method_of(source: Source, switch_off: bool) -> Method:
    """The policy as a Method; wrapped in SwitchOff (priced with the profile) when asked."""
    if not switch_off or source.policy == AR:
        return Method(POLICY, source.policy, source.tree)
    if source.profile is None:
        raise SystemExit(
            f"error: --switch-off needs a latency profile for {source.name!r} (--latency-profile)"
        )
    policy = priced_switch_off(source.policy, source.profile, source.tree.depth)
    return Method(POLICY, policy, source.tree)


def classify(pair, prompts, ar: list[GenerationResult], res: list[GenerationResult]) -> list[str]:
    """Per prompt: identical to AR, a near-tie (every divergence within the dtype's tolerance) or a
    real mismatch, judged by the fp32 target (decoder.check_lossless)."""
    ref, out = [r.new_tokens for r in ar], [r.new_tokens for r in res]
    judge = fp32_judge(pair.target) if ref != out else pair.target
    report = check_outputs(judge, prompts, ref, out, pair.target.dtype)
    return [
        "identical" if c.identical else ("mismatch" if c.real_mismatches else "near-tie")
        for c in report.checks
    ]


def geometric_mean_ratio(ar_s: np.ndarray, s: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(mean(log(ar_s / s))) along ``axis``: the typical per-run speedup of paired runs."""
    return np.exp(np.log(ar_s / s).mean(axis=axis))


def paired_runs(ar_runs: list[GenerationResult], runs: list[GenerationResult], clock: str = "wall") -> dict:
    """A prompt's paired per-run ratio (AR run i / policy run i, run back to back) on ``clock``
    ("wall": wall_s; "cpu": cpu_s, keys prefixed ``cpu_``): geometric mean, its 95% bootstrap
    interval over runs, and where that interval lies against the floor."""
    ar_s = np.array([getattr(r, f"{clock}_s") for r in ar_runs])
    s = np.array([getattr(r, f"{clock}_s") for r in runs])
    point, low, high = paired_interval((ar_s, s), geometric_mean_ratio, N_BOOT, seed=0)
    verdict = "under" if high < FLOOR else ("at or above" if low >= FLOOR else "undecided")
    row = {"paired_ratio": point, "paired_low": low, "paired_high": high, "paired_floor": verdict}
    return {("cpu_" if clock == "cpu" else "") + k: v for k, v in row.items()}


def prompt_row(q: Question, ar: GenerationResult, res: GenerationResult, verdict: str, pricer) -> dict:
    modes = res.modes
    row = {
        "category": f"{q.dataset}/{q.category}",
        "question_id": q.question_id,
        "n_tokens": len(res.new_tokens),
        "ratio": ar.wall_s / res.wall_s if res.wall_s > 0 else 0.0,
        "cpu_ratio": ar.cpu_s / res.cpu_s if res.cpu_s > 0 else 0.0,
        "accepted": res.mean_accepted_length,
        "rounds_verified": modes.verified,
        "rounds_as_ar": modes.as_ar,
        "switch_offs": modes.switch_offs,
        "output": verdict,
    }
    if pricer is not None and res.decoded_tokens:
        priced = sum(pricer.round_ms(r) for r in res.rounds)
        row["priced_ratio"] = res.decoded_tokens * pricer.ar_ms / priced if res.rounds else 1.0
    return row


def timed_runs(
    pair, prompts, method: Method, config: DecodeConfig, args, n: int
) -> tuple[list[list[GenerationResult]], list[list[GenerationResult]]]:
    """AR's and the policy's runs of each prompt, ``n`` each (one shared warm-up first, wall clock
    only), decoded in --order; the i-th runs of the two ran together (or back to back)."""
    every_run: dict[str, list[list[GenerationResult]]] = {}
    run_side_by_side(
        pair,
        prompts,
        [method],
        config,
        None,
        warmup_tokens=4,
        timing=False,
        repeats=Repeats(min_ar_s=1e9, most=n),  # every prompt n times
        every_run=every_run,
        lockstep=args.order == "lockstep",
    )
    return every_run[AR], every_run.get(POLICY, every_run[AR])


def settle(pair, prompts, method: Method, config: DecodeConfig, args, medians, all_runs) -> None:
    """Times each prompt whose wall-clock paired interval is undecided again, --repeats runs at a
    time, until the interval decides or the prompt has --most-repeats runs. ``all_runs`` (AR's and
    the policy's runs per prompt) grow in place; ``medians`` (their median runs) are taken afresh."""
    (ar, res), (ar_runs, runs) = medians, all_runs
    for i, prompt in enumerate(prompts):
        while (
            len(runs[i]) < args.most_repeats
            and paired_runs(ar_runs[i], runs[i])["paired_floor"] == "undecided"
        ):
            more_ar, more = timed_runs(
                pair, [prompt], method, config, args, min(args.repeats, args.most_repeats - len(runs[i]))
            )
            ar_runs[i].extend(more_ar[0])
            runs[i].extend(more[0])
            ar[i], res[i] = median_run(ar_runs[i]), median_run(runs[i])
            log.info("prompt %d: %d runs, paired %s", i, len(runs[i]), paired_runs(ar_runs[i], runs[i]))


def measure_dtype(source: Source, dtype: str, questions: list[Question], args: argparse.Namespace) -> dict:
    pair = load_pair(source.target, source.mid, dtype=dtype, device="cpu", linear=args.linear)
    loaded = rss_gib()[0]
    prompts = encode_prompts(questions, pair.tokenizer, source.template, MAX_PROMPT_TOKENS)
    method = method_of(source, args.switch_off)
    config = DecodeConfig(max_new_tokens=args.max_new_tokens)
    ar_runs, runs = timed_runs(pair, prompts, method, config, args, args.repeats)
    ar, res = [median_run(r) for r in ar_runs], [median_run(r) for r in runs]
    settle(pair, prompts, method, config, args, (ar, res), (ar_runs, runs))
    verdicts = classify(pair, prompts, ar, res)
    pricer = None  # the switch-off's own prices, or the profile's for the bare policy
    if isinstance(method.policy, SwitchOff):
        pricer = method.policy.pricer
    elif source.profile is not None:
        pricer = ProfilePricer.for_policy(source.profile, method.policy)
    rows = [prompt_row(q, a, r, v, pricer) for q, a, r, v in zip(questions, ar, res, verdicts, strict=True)]
    for row, a, r in zip(rows, ar_runs, runs, strict=True):
        row["runs"] = len(r)
        row.update(paired_runs(a, r))
        row.update(paired_runs(a, r, "cpu"))
    ar_tps = sum(len(r.new_tokens) for r in ar) / sum(r.wall_s for r in ar)
    tps = sum(len(r.new_tokens) for r in res) / sum(r.wall_s for r in res)
    ratios = [row["ratio"] for row in rows]
    cpu = [row["cpu_ratio"] for row in rows]
    info = {
        "dtype": dtype,
        "rows": rows,
        "pooled_ratio": tps / ar_tps,
        "min_ratio": min(ratios),
        "below_floor": sum(r < FLOOR for r in ratios),
        "pooled_cpu_ratio": sum(r.cpu_s for r in ar) / sum(r.cpu_s for r in res),
        "min_cpu_ratio": min(cpu),
        "below_floor_cpu": sum(r < FLOOR for r in cpu),
        **{
            f"{key}_floor": {
                v: sum(row[f"{key}_floor"] == v for row in rows)
                for v in ("under", "undecided", "at or above")
            }
            for key in ("paired", "cpu_paired")
        },
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "rss_loaded_gib": loaded,
        "rss_peak_gib": rss_gib()[1],
    }
    del pair, ar_runs, runs, ar, res
    gc.collect()
    return info


PROMPT_HEAD = ["prompt", "ratio (wall)", "paired (95%)", "ratio (CPU)", "paired CPU (95%)", "runs", "priced",
               "A", "verified / as AR / switch-offs", "output"]  # fmt: skip


def _prompt_row(r: dict) -> list[str]:
    return [
        f"{r['category']} {r['question_id']}",
        f"{r['ratio']:.2f}x",
        f"{r['paired_ratio']:.2f}x [{r['paired_low']:.2f}, {r['paired_high']:.2f}]",
        f"{r['cpu_ratio']:.3f}x",
        f"{r['cpu_paired_ratio']:.3f}x [{r['cpu_paired_low']:.3f}, {r['cpu_paired_high']:.3f}]",
        str(r["runs"]),
        f"{r['priced_ratio']:.2f}x" if "priced_ratio" in r else "-",
        f"{r['accepted']:.2f}",
        f"{r['rounds_verified']} / {r['rounds_as_ar']} / {r['switch_offs']}",
        str(r["output"]),
    ]


def markdown(head: dict, infos: list[dict]) -> str:
    lines = [
        f"Pair `{head['pair']}`, policy {head['policy']}{' + switch-off' if head['switch_off'] else ''} at "
        f"B = {head['budget']}, W x m = {head['width']} x {head['topk']}, "
        f"n-gram matches >= {head['ngram_min_n']}; "
        f"{head['n_prompts']} prompts, {head['max_new_tokens']} new tokens, {head['threads']} threads, "
        f"median of {head['repeats']} runs per prompt (undecided ones up to {head['most_repeats']}), "
        f"AR and the policy run {head['order']}.",
    ]
    for info in infos:
        lines += [
            "",
            f"**{info['dtype']}**: wall clock pooled {info['pooled_ratio']:.2f}x, minimum "
            f"{info['min_ratio']:.2f}x, {info['below_floor']} prompt(s) under {FLOOR}x; CPU time pooled "
            f"{info['pooled_cpu_ratio']:.2f}x, minimum {info['min_cpu_ratio']:.3f}x, "
            f"{info['below_floor_cpu']} prompt(s) under {FLOOR}x; "
            f"RSS {info['rss_loaded_gib']:.2f} GiB loaded, "
            f"{info['rss_peak_gib']:.2f} GiB peak (process so far). Paired runs against the {FLOOR}x "
            "floor (95% interval), wall clock: "
            + ", ".join(f"{n} {v}" for v, n in info["paired_floor"].items())
            + "; CPU time: "
            + ", ".join(f"{n} {v}" for v, n in info["cpu_paired_floor"].items())
            + f" (OMP_WAIT_POLICY {info['omp_wait_policy']}).",
            "",
        ]
        body = [_prompt_row(r) for r in info["rows"]]
        lines.append(tabulate(body, PROMPT_HEAD, tablefmt="github", disable_numparse=True))
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--pair", help="a registered pair (params.yaml pairs), e.g. zoo-m")
    which.add_argument("--target", help="a target model folder (a pair by local path)")
    p.add_argument("--mid", help="the mid drafter's folder (with --target)")
    p.add_argument("--template", default="chatml", help="chat template of a pair by path")
    p.add_argument("--latency-profile", help="a profile JSON for a pair by path (pricing, --switch-off)")
    p.add_argument("--profile", default=None, help="params profile (profiles/NAME.yaml)")
    p.add_argument("--questions", help="a Spec-Bench-format question.jsonl (default: held-back prompts)")
    p.add_argument("--limit", type=int, default=None, help="the first N questions of --questions")
    p.add_argument("--per-dataset", type=int, default=2)
    p.add_argument(
        "--datasets", nargs="+", default=None, help="held-back datasets (default: evaluate.datasets)"
    )
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--linear", default="stock", choices=["stock", "onednn"])
    p.add_argument("--policy", default="all-small")
    p.add_argument("--budget", type=int, default=6)
    p.add_argument("--width", type=int, default=2)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--ngram-min-n", type=int, default=2)
    p.add_argument(
        "--switch-off", action="store_true", help="wrap the policy in decoder.deploy.switch_off.SwitchOff"
    )
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved AR/policy runs per prompt; each keeps its median-time run (default 3)",
    )
    p.add_argument(
        "--most-repeats",
        type=int,
        default=None,
        help="time a prompt whose paired interval is undecided again, --repeats runs at a time, up "
        "to this many runs in all (default: --repeats, no more)",
    )
    p.add_argument(
        "--order",
        default="lockstep",
        choices=["lockstep", "sequential"],
        help="lockstep: AR and the policy decode a prompt together, one round of each in turn, each "
        "round timed on its own (default); sequential: one whole decode after the other",
    )
    p.add_argument("--out", default="artifacts/bench/never_loses")
    args = p.parse_args(argv)
    if args.mid and not args.target:
        p.error("--mid goes with --target")
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    args.most_repeats = args.repeats if args.most_repeats is None else args.most_repeats
    if args.most_repeats < args.repeats:
        p.error(f"--most-repeats ({args.most_repeats}) must be at least --repeats ({args.repeats})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    params = load_params(profile=args.profile)
    torch.set_num_threads(params.runtime.torch_threads)
    if params.runtime.keep_freed_memory:
        keep_freed_memory()  # as the pipeline's decoding stages (decoder/models/memory.py)
    try:
        questions = (
            load_questions(args.questions)[: args.limit]
            if args.questions
            else held_back(params, args.per_dataset, args.datasets)
        )
        source = source_of(params, args)
        infos = []
        for dtype in args.dtypes:
            infos.append(measure_dtype(source, dtype, questions, args))
            log.info(
                "%s %s: pooled %.2fx, min %.2fx",
                source.name,
                dtype,
                infos[-1]["pooled_ratio"],
                infos[-1]["min_ratio"],
            )
    except (PromptFileError, FileNotFoundError) as err:  # no data or zoo yet: say what to run
        raise SystemExit(f"error: {err} (run `make repro` first, or pass --questions / --target)") from None
    head = {
        "pair": source.name,
        "policy": source.policy,
        "switch_off": bool(args.switch_off and source.policy != AR),
        **{k: getattr(source.tree, k) for k in ("budget", "width", "topk", "ngram_min_n")},
        "n_prompts": len(questions),
        "max_new_tokens": args.max_new_tokens,
        "threads": params.runtime.torch_threads,
        "repeats": args.repeats,
        "most_repeats": args.most_repeats,
        "order": args.order,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({**head, "dtypes": infos}, indent=2) + "\n", encoding="utf-8"
    )
    text = markdown(head, infos)
    out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
