"""From params to work: which reports to collect, their prompts, their pair and latency profile.

Contract: `plan_reports` validates every name before any work starts (unknown pair or dataset,
unsupported D, a missing latency profile or model folder) and raises a clear error; it also gives
each report its resume inputs (`report_inputs`: everything that shapes the report's rows, by value
or by content digest). `run_report` does one report end to end and writes it atomically with those
inputs in its manifest. Both backends (local, Ray) call `run_report`.

Digests: a model enters the inputs as `digest_folder` (every file: weights, config, tokenizer;
cached per process while sizes and mtimes hold), the code as `digest_code`: the fingerprint of the
project source that `collectors.collect.plan` can import (its normalised AST and the library versions, as
the DVC stages' fingerprints), so a change to what the decoder does recollects instead of reusing
rows the old code computed, while a comment or docstring edit keeps them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from collectors.collect.report import (
    ReportSpec,
    collect_report,
    schema_inputs,
    specs_for,
    write_report,
)
from collectors.collect.source_closure import closure_fingerprint
from collectors.data.prompts import Question, encode_prompts, load_questions
from collectors.pricing.budget_file import read_pair_budget
from config.params import Params, TreeParams, resolve
from decoder.core.config import DecodeConfig, TreeConfig
from decoder.deploy.latency import LatencyProfile, load_profile
from decoder.io.files import sha256_of_file
from decoder.io.json_manifest import digest_json

log = logging.getLogger(__name__)
BACKENDS = ("local", "ray")
KEY_VERSION = 2  # bump when the meaning of an entry of report_inputs changes
REPORT_CODE = ("collectors.collect.plan",)  # the modules whose import closure computes a report


def tree_config(tree: TreeParams) -> TreeConfig:
    """The decoder's TreeConfig for params.yaml's ``tree`` section (same fields)."""
    return TreeConfig(**tree.model_dump())


def pair_tree(params: Params, pair_id: str) -> TreeConfig:
    """The pair's TreeConfig: the ``tree`` section with the verification budget, tree shape
    (width, topk, ngram_min_n) and per-round budget rule (if any) the budget stage chose for this pair
    (``<budget.out_dir>/budgets.json``)."""
    chosen = read_pair_budget(params, pair_id)
    width, topk, min_n = chosen.shape
    tree = dataclasses.replace(
        tree_config(params.tree), budget=chosen.budget, width=width, topk=topk, ngram_min_n=min_n
    )
    return dataclasses.replace(tree, **chosen.round_rule)


@dataclass(frozen=True)
class Plan:
    reports: tuple[ReportSpec, ...]
    reports_dir: Path
    inputs: Mapping[str, Mapping[str, object]]  # report_id -> report_inputs (the resume inputs)


def dataset_file(params: Params, dataset: str) -> Path:
    return resolve(params.data.out_dir) / dataset / "question.jsonl"


def plan_reports(params: Params) -> Plan:
    """Every (pair, dataset) report of the collect section, validated."""
    cfg = params.collect
    unknown = [p for p in cfg.pairs if p not in params.pairs]
    if unknown:
        raise ValueError(f"collect.pairs: unknown pair(s) {unknown}; the registry has {sorted(params.pairs)}")
    missing = [d for d in cfg.datasets if not dataset_file(params, d).is_file()]
    if missing:
        known = sorted(p.parent.name for p in resolve(params.data.out_dir).glob("*/question.jsonl"))
        raise ValueError(f"collect.datasets: unknown dataset(s) {missing}; {params.data.out_dir} has {known}")
    if cfg.backend not in BACKENDS:
        raise ValueError(f"collect.backend must be one of {BACKENDS}, got {cfg.backend!r}")
    if cfg.prompts_per_report <= 0 or cfg.max_new_tokens <= 0 or cfg.prompt_start < 0:
        raise ValueError("collect.prompts_per_report and collect.max_new_tokens must be positive")
    if cfg.workers < 1:
        raise ValueError(f"collect.workers must be >= 1 (1: collect in this process), got {cfg.workers}")
    specs_for(params.tree.depth)
    check_widths(params, cfg.pairs)
    reports_dir = resolve(cfg.out_dir) / "reports"
    stop = cfg.prompt_start + cfg.prompts_per_report
    reports = tuple(ReportSpec(p, d, cfg.prompt_start, stop) for p in cfg.pairs for d in cfg.datasets)
    return Plan(reports, reports_dir, {s.report_id: report_inputs(params, s) for s in reports})


def check_widths(params: Params, pairs: Sequence[str]) -> None:
    """Every collected pair grows its trees at the tree section's width W: the student's tree
    signals read the top-W frontier, and the export declares W = tree.width for the decoder to
    check. A pair the budget stage gave another width (a swept shape) is refused here, before any
    collection, not at deploy."""
    wide = {p: pair_tree(params, p).width for p in pairs}
    other = {p: w for p, w in wide.items() if w != params.tree.width}
    if other:
        raise ValueError(
            f"collect.pairs: the budget stage's shape gives {other} a tree width other than tree.width = "
            f"{params.tree.width}, which the student's signals are declared for; set tree.width and "
            "tree.topk to that shape, or budget.shapes to one shape of width tree.width"
        )


def report_inputs(params: Params, spec: ReportSpec) -> dict[str, object]:
    """Everything that shapes the report's rows, as a flat JSON-able mapping (its key is the resume key).

    Models, profile, prompts and code enter by content digest, the rest by value; paths, backend
    and output folders do not enter (moving a model or the output keeps the reports valid).
    """
    cfg = params.collect
    target, mid = params.pair_paths(spec.pair_id)
    pair = params.pairs[spec.pair_id]
    questions = report_slice(params, spec)
    inputs = {
        "key_version": KEY_VERSION,
        "report_id": spec.report_id,
        "target": digest_folder(target),
        "mid": digest_folder(mid),
        "pair.dtype": pair.dtype,
        "pair.device": pair.device,
        "pair.template": pair.template,
        "profile": digest_json(dataclasses.asdict(profile_for(params, spec.pair_id))),
        "prompts": digest_json([dataclasses.asdict(q) for q in questions]),
        **{f"tree.{k}": v for k, v in dataclasses.asdict(pair_tree(params, spec.pair_id)).items()},
        "collect.mode": cfg.mode,
        "collect.max_new_tokens": cfg.max_new_tokens,
        "collect.max_prompt_tokens": cfg.max_prompt_tokens,
        "collect.seed": cfg.seed,
        "collect.round_table_stride": cfg.round_table_stride,
        **schema_inputs(params.tree.depth),
        "code": digest_code(REPORT_CODE),
    }
    return json.loads(json.dumps(inputs))  # as a manifest reads back (tuples become lists)


_LOADED: dict[tuple, object] = {}


def load_registered_pair(params: Params, name: str):
    """Load a registered pair once per process (the last one only: one pair's weights in memory)."""
    from decoder.models.pair import load_pair

    target, mid = params.pair_paths(name)
    spec = params.pairs[name]
    key = (target, mid, spec.dtype, spec.device, spec.linear)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_pair(target, mid, spec.dtype, spec.device, spec.linear)
    return _LOADED[key]


def profile_path(params: Params, pair: str) -> Path:
    """The profile stage's file for ``pair`` (the one place its name is built)."""
    return resolve(params.profile.out_dir) / f"{pair}.json"


def profile_for(params: Params, pair: str) -> LatencyProfile:
    path = profile_path(params, pair)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no latency profile for pair {pair!r}; run the profile stage first")
    return load_profile(path)


PASSES_DIR = "passes"  # under profile.out_dir: <pair>.<i>.json, each pass the profile stage measured


def pass_path(params: Params, pair: str, index: int) -> Path:
    """The profile stage's file of one of its passes of ``pair``."""
    return resolve(params.profile.out_dir) / PASSES_DIR / f"{pair}.{index}.json"


def pass_profiles(params: Params, pair: str) -> tuple[LatencyProfile, ...]:
    """Every pass the profile stage measured of ``pair``, in order (the stage's profile is their
    median); the stage's profile alone where no pass was kept (a profile measured elsewhere)."""
    found = []
    while (path := pass_path(params, pair, len(found))).is_file():
        found.append(load_profile(path))
    return tuple(found) or (profile_for(params, pair),)


def report_prompts(params: Params, spec: ReportSpec, tokenizer) -> list[list[int]]:
    return report_questions(params, spec, tokenizer)[1]


def report_slice(params: Params, spec: ReportSpec) -> list[Question]:
    """The spec's slice of its dataset."""
    questions = load_questions(dataset_file(params, spec.dataset_id), spec.dataset_id)
    chosen = questions[spec.prompt_start : spec.prompt_stop]
    if len(chosen) < spec.prompt_stop - spec.prompt_start:
        raise ValueError(
            f"{spec.dataset_id}: has {len(questions)} questions, "
            f"report needs [{spec.prompt_start}, {spec.prompt_stop})"
        )
    return chosen


def report_questions(params: Params, spec: ReportSpec, tokenizer) -> tuple[list[Question], list[list[int]]]:
    """The spec's slice of its dataset, and those questions formatted and tokenized for its pair."""
    chosen = report_slice(params, spec)
    template = params.pairs[spec.pair_id].template
    return chosen, encode_prompts(chosen, tokenizer, template, params.collect.max_prompt_tokens)


def run_report(
    params: Params,
    spec: ReportSpec,
    reports_dir: Path,
    progress: bool = True,
    inputs: Mapping[str, object] | None = None,
) -> Path:
    """Collect one report and write it atomically with its resume inputs; returns its folder.

    ``inputs`` are `report_inputs(params, spec)` when the caller has them (plan_reports computes
    them for every report), else computed here.
    """
    inputs = report_inputs(params, spec) if inputs is None else inputs
    pair = load_registered_pair(params, spec.pair_id)
    prompts = report_prompts(params, spec, pair.tokenizer)
    cfg = params.collect
    config = DecodeConfig(cfg.max_new_tokens, 0.0, cfg.seed, pair_tree(params, spec.pair_id))
    profile = profile_for(params, spec.pair_id)
    stride, rows = params.collect.round_table_stride, params.runtime.replay_batch_rows
    tables = collect_report(spec, pair, prompts, profile, config, params.collect.mode, progress, stride, rows)
    return write_report(reports_dir, spec, tables, params.tree.depth, inputs)


_FOLDERS: dict[tuple, str] = {}


def digest_folder(folder: Path) -> str:
    """sha256 over (relative path, content digest) of every non-hidden file under ``folder``."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: model folder not found")
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not files:
        raise FileNotFoundError(f"{folder}: model folder holds no files")
    stamp = (str(folder.resolve()), tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if stamp not in _FOLDERS:
        entries = [(p.relative_to(folder).as_posix(), sha256_of_file(p)) for p in files]
        _FOLDERS[stamp] = digest_json(entries)
    return _FOLDERS[stamp]


@cache
def digest_code(roots: tuple[str, ...]) -> str:
    """The fingerprint of the source the modules ``roots`` can import (cached per process): the
    same digest as the DVC stages' (source_closure), so a comment edit keeps the reports."""
    return str(closure_fingerprint(roots)["digest"])
