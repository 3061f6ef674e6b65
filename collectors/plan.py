"""From params to work: which reports to collect, their prompts, their pair and latency profile.

Contract: `plan_reports` validates every name before any work starts (unknown pair or dataset,
unsupported D, an output folder of another schema version) and raises a clear error; `run_report`
does one report end to end and writes it atomically. Both backends (local, Ray) call `run_report`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from collectors.latency import LatencyProfile, load_profile
from collectors.prompts import Question, encode_prompts, load_questions
from collectors.report import ReportSpec, check_out_dir, collect_report, specs_for, write_report
from config.params import Params, TreeParams, resolve
from decoder.config import DecodeConfig, TreeConfig

log = logging.getLogger(__name__)
BACKENDS = ("local", "ray")


def tree_config(tree: TreeParams) -> TreeConfig:
    """The decoder's TreeConfig for params.yaml's ``tree`` section (same fields)."""
    return TreeConfig(**dataclasses.asdict(tree))


@dataclass(frozen=True)
class Plan:
    reports: tuple[ReportSpec, ...]
    reports_dir: Path


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
    specs_for(params.tree.depth)
    reports_dir = resolve(cfg.out_dir) / "reports"
    check_out_dir(reports_dir, params.tree.depth)
    stop = cfg.prompt_start + cfg.prompts_per_report
    reports = tuple(ReportSpec(p, d, cfg.prompt_start, stop) for p in cfg.pairs for d in cfg.datasets)
    return Plan(reports, reports_dir)


_LOADED: dict[tuple, object] = {}


def load_registered_pair(params: Params, name: str):
    """Load a registered pair once per process (the last one only: one pair's weights in memory)."""
    from decoder.models import load_pair

    target, mid = params.pair_paths(name)
    spec = params.pairs[name]
    key = (target, mid, spec.dtype, spec.device)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_pair(target, mid, spec.dtype, spec.device)
    return _LOADED[key]


def profile_for(params: Params, pair: str) -> LatencyProfile:
    path = resolve(params.profile.out_dir) / f"{pair}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no latency profile for pair {pair!r}; run the profile stage first")
    return load_profile(path)


def report_prompts(params: Params, spec: ReportSpec, tokenizer) -> list[list[int]]:
    return report_questions(params, spec, tokenizer)[1]


def report_questions(params: Params, spec: ReportSpec, tokenizer) -> tuple[list[Question], list[list[int]]]:
    """The spec's slice of its dataset, and those questions formatted and tokenized for its pair."""
    questions = load_questions(dataset_file(params, spec.dataset_id), spec.dataset_id)
    chosen = questions[spec.prompt_start : spec.prompt_stop]
    if len(chosen) < spec.prompt_stop - spec.prompt_start:
        raise ValueError(
            f"{spec.dataset_id}: has {len(questions)} questions, "
            f"report needs [{spec.prompt_start}, {spec.prompt_stop})"
        )
    template = params.pairs[spec.pair_id].template
    return chosen, encode_prompts(chosen, tokenizer, template, params.collect.max_prompt_tokens)


def run_report(params: Params, spec: ReportSpec, reports_dir: Path, progress: bool = True) -> Path:
    """Collect one report and write it atomically; returns its folder."""
    pair = load_registered_pair(params, spec.pair_id)
    prompts = report_prompts(params, spec, pair.tokenizer)
    config = DecodeConfig(params.collect.max_new_tokens, 0.0, params.collect.seed, tree_config(params.tree))
    profile = profile_for(params, spec.pair_id)
    stride = params.collect.round_table_stride
    tables = collect_report(spec, pair, prompts, profile, config, params.collect.mode, progress, stride)
    return write_report(reports_dir, spec, tables, params.tree.depth)
