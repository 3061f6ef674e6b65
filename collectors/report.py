"""One report = one (pair, dataset, prompt slice): run every schedule, write its tables atomically.

Contract: `collect_report` is pure work (no files); `write_report` puts the report's tables and a
manifest into a temporary folder and renames it into place, so a report folder either holds a
complete, valid report or does not exist. `completed_reports` is how a run resumes.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from collectors.execute import execute_prompt
from collectors.latency import LatencyProfile, RoundCounts, price_round
from collectors.records import ReportKey, RoundRecord, bits_text, runtime_for, trajectory_rows
from collectors.replay import Replayer
from decoder.config import DecodeConfig
from decoder.models import ModelPair
from decoder.policies import schedule_bits
from features.collect_schemas import MAX_DEPTH, TRAJECTORIES, actions_spec, rounds_spec
from features.tables import SchemaError, TableSpec, read_table, to_table, write_table

MODES = ("replay", "execute")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ReportSpec:
    pair_id: str
    dataset_id: str
    prompt_start: int
    prompt_stop: int

    @property
    def report_id(self) -> str:
        return f"{self.pair_id}__{self.dataset_id}__{self.prompt_start}-{self.prompt_stop}"

    @property
    def key(self) -> ReportKey:
        return ReportKey(self.report_id, self.pair_id, self.dataset_id)


@dataclass(frozen=True)
class ReportTables:
    trajectories: pa.Table
    actions: pa.Table
    rounds: pa.Table


def specs_for(depth: int) -> dict[str, TableSpec]:
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth D={depth} is not supported: schedule ids encode 1 <= D <= {MAX_DEPTH}")
    return {"trajectories": TRAJECTORIES, "actions": actions_spec(depth), "rounds": rounds_spec(depth)}


def collect_report(
    spec: ReportSpec,
    pair: ModelPair,
    prompts: list[list[int]],
    profile: LatencyProfile,
    config: DecodeConfig,
    mode: str,
    progress: bool = True,
    round_table_stride: int = 1,
) -> ReportTables:
    """Run all 2^D schedules on the report's prompts and build its three tables."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    depth = config.tree.depth
    specs = specs_for(depth)
    schedules = [schedule_bits(s, depth) for s in range(2**depth)]
    per_schedule: dict[int, list[RoundRecord]] = {s: [] for s in range(len(schedules))}
    tokens = dict.fromkeys(per_schedule, 0)
    round_rows: list[dict] = []
    bar = tqdm(
        total=len(prompts) * (len(schedules) if mode == "execute" else 1),
        disable=not progress,
        desc=spec.report_id,
        unit="prompt" if mode == "replay" else "decode",
        leave=False,
    )
    if mode == "replay":
        replayer = Replayer(pair, config, schedules, round_table_stride)
        for p_id, prompt in enumerate(prompts):
            rep = replayer.replay_prompt(prompt)
            for s in per_schedule:
                per_schedule[s] += rep.rounds[s]
                tokens[s] += rep.n_tokens[s]
            round_rows += _round_rows(spec.key, p_id, rep.starts, profile)
            bar.update()
    else:
        for s, bits in enumerate(schedules):
            bar.set_postfix(schedule=bits_text(bits))
            for prompt in prompts:
                recs, n = execute_prompt(pair, prompt, bits, config)
                per_schedule[s] += recs
                tokens[s] += n
                bar.update()
    bar.close()
    runtime = runtime_for(profile, sum(map(len, prompts)) / len(prompts), config.tree)
    traj, actions = [], []
    for s, bits in enumerate(schedules):
        t, a = trajectory_rows(
            spec.key, s, bits, per_schedule[s], tokens[s], len(prompts), profile, runtime, mode
        )
        traj.append(t)
        actions += a
    return ReportTables(
        to_table(specs["trajectories"], traj),
        to_table(specs["actions"], actions),
        to_table(specs["rounds"], round_rows),
    )


def _round_rows(key: ReportKey, prompt_id: int, starts: dict, profile: LatencyProfile) -> list[dict]:
    """Every schedule from every visited start, priced as if the mid drafter were caught up."""
    rows = []
    for start, outcomes in sorted(starts.items()):
        depth = len(outcomes[0].signals)
        ms = [
            price_round(
                profile,
                RoundCounts(o.verified_nodes, o.mid_tree_tokens, depth - len(o.mid_tree_tokens), depth),
            )
            for o in outcomes
        ]
        tps = [1e3 * (o.accepted + 1) / t for o, t in zip(outcomes, ms, strict=True)]
        best = max(range(len(outcomes)), key=lambda s: (tps[s], -s))
        for s, o in enumerate(outcomes):
            rows.append(
                {
                    **key.as_row(),
                    "prompt_id": prompt_id,
                    "start_position": start,
                    "schedule_id": s,
                    "accepted": o.accepted,
                    "verified_nodes": o.verified_nodes,
                    "mid_call_tokens": list(o.mid_tree_tokens),
                    "n_small_steps": depth - len(o.mid_tree_tokens),
                    "round_latency_ms": ms[s],
                    "throughput_tok_per_s": tps[s],
                    "is_round_best": s == best,
                    "signals": [x for step in o.signals for x in step],
                }
            )
    return rows


def write_report(out_dir: Path, spec: ReportSpec, tables: ReportTables, depth: int) -> Path:
    """Write the report folder atomically (temporary folder, then rename)."""
    final = out_dir / spec.report_id
    tmp = out_dir / f".tmp-{spec.report_id}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        specs = specs_for(depth)
        for name, table in (
            ("trajectories", tables.trajectories),
            ("actions", tables.actions),
            ("rounds", tables.rounds),
        ):
            write_table(tmp / f"{name}.parquet", specs[name], table)
        manifest = {"report_id": spec.report_id, "schemas": {n: s.tag for n, s in specs.items()}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def check_out_dir(out_dir: Path, depth: int) -> None:
    """Refuse an output folder that holds reports of another schema version (nothing is touched)."""
    want = {n: s.tag for n, s in specs_for(depth).items()}
    for manifest in sorted(out_dir.glob(f"*/{MANIFEST}")):
        got = json.loads(manifest.read_text()).get("schemas")
        if got != want:
            raise SchemaError(
                f"{manifest.parent}: written with schemas {got}, this run writes {want}; "
                "use another collect.out_dir or remove the old reports"
            )


def completed_reports(out_dir: Path, depth: int) -> set[str]:
    """Report ids whose folder is complete and readable."""
    done = set()
    specs = specs_for(depth)
    for manifest in out_dir.glob(f"*/{MANIFEST}"):
        folder = manifest.parent
        try:
            for name, spec in specs.items():
                read_table(folder / f"{name}.parquet", spec)
        except (SchemaError, FileNotFoundError, OSError):
            continue
        done.add(folder.name)
    return done
