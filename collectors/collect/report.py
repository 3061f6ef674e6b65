"""One report = one (pair, dataset, prompt slice): run every schedule, write its tables atomically.

Contract: `collect_report` is pure work (no files); `write_report` puts the report's tables and a
manifest into a temporary folder, fsyncs them and renames it into place, so a report folder either
holds a complete report or does not exist. The manifest records the report's resume inputs
(everything that shapes it: see collectors.collect.plan.report_inputs), their key and each table file's
sha256. `completed_reports` is how a run resumes: a folder is reused only if its key matches and its
files match their digests; anything else (other inputs, truncated or garbage Parquet, bad manifest
JSON) is recollected with a warning naming the file, so old and new rows never mix.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from collectors.collect.execute import execute_prompt
from collectors.collect.records import ReportKey, RoundRecord, bits_text, runtime_for, trajectory_rows
from collectors.collect.replay import Replayer
from collectors.collect.trajectory import BranchOutcome, PromptReplay
from config.params import COLLECT_MODES
from decoder.core.config import DecodeConfig
from decoder.core.policies import schedule_bits
from decoder.deploy.latency import LatencyProfile, RoundCounts, price_round
from decoder.io.files import fsync_dir, sha256_of_file
from decoder.io.json_manifest import digest_json, read_json_object
from decoder.models.pair import ModelPair
from features.collect_schemas import CONTINUATIONS, MAX_DEPTH, TRAJECTORIES, actions_spec, rounds_spec
from features.tables import SchemaError, TableSpec, read_table, to_table, write_table

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
TABLE_NAMES = ("trajectories", "actions", "rounds", "continuations")


class ReportError(ValueError):
    """A report folder is not a finished report of this run's inputs (the message names the file)."""


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
    continuations: pa.Table  # replay mode: each prompt's g (execute mode: no rows)


def prompt_digest(prompt: list[int]) -> str:
    """sha256 of one prompt's token ids: what a continuation row is keyed by for a later reader."""
    return digest_json([int(t) for t in prompt])


def read_continuations(path: Path) -> dict[tuple[str, str], list[int]]:
    """The collect stage's merged ``continuations.parquet`` (checked against its digest in
    ``tables.json``): (pair id, prompt digest) -> the target's g for that prompt; {} without the
    file."""
    if not path.is_file():
        return {}
    table = read_table(path, CONTINUATIONS)
    pairs, digests, tokens = (table.column(c).to_pylist() for c in ("pair_id", "prompt_sha256", "tokens"))
    return {(p, d): g for p, d, g in zip(pairs, digests, tokens, strict=True)}


def specs_for(depth: int) -> dict[str, TableSpec]:
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth D={depth} is not supported: schedule ids encode 1 <= D <= {MAX_DEPTH}")
    return {"trajectories": TRAJECTORIES, "actions": actions_spec(depth), "rounds": rounds_spec(depth),
            "continuations": CONTINUATIONS}  # fmt: skip


def collect_report(
    spec: ReportSpec,
    pair: ModelPair,
    prompts: list[list[int]],
    profile: LatencyProfile,
    config: DecodeConfig,
    mode: str,
    progress: bool = True,
    round_table_stride: int = 1,
    batch_rows: int = 0,
) -> ReportTables:
    """Run all 2^D schedules on the report's prompts and build its tables (in replay mode with each
    prompt's greedy continuation g, which the replay computes anyway; ``batch_rows``: Replayer's)."""
    if mode not in COLLECT_MODES:
        raise ValueError(f"mode must be one of {COLLECT_MODES}, got {mode!r}")
    depth = config.tree.depth
    specs = specs_for(depth)
    schedules = [schedule_bits(s, depth) for s in range(2**depth)]
    per_schedule: dict[int, list[RoundRecord]] = {s: [] for s in range(len(schedules))}
    tokens: dict[int, list[int]] = {s: [] for s in per_schedule}  # per prompt
    n_rounds: dict[int, list[int]] = {s: [] for s in per_schedule}  # per prompt
    round_rows: list[dict] = []
    continuations: list[dict] = []
    bar = tqdm(
        total=len(prompts) * (len(schedules) if mode == "execute" else 1),
        disable=not progress,
        desc=spec.report_id,
        unit="prompt" if mode == "replay" else "decode",
        leave=False,
    )
    if mode == "replay":
        replayer = Replayer(pair, config, schedules, round_table_stride, profile, batch_rows)
        replayer.warm(prompts)
        for p_id, prompt in enumerate(prompts):
            inputs = replayer.inputs(prompt)
            rep = replayer.replay_prompt(prompt, inputs)
            continuations.append({
                **spec.key.as_row(), "prompt_id": p_id, "prompt_sha256": prompt_digest(prompt),
                "tokens": inputs.text[len(prompt):], "stop": inputs.limit,
            })  # fmt: skip
            for s in per_schedule:
                per_schedule[s] += rep.rounds[s]
                tokens[s].append(rep.n_tokens[s])
                n_rounds[s].append(len(rep.rounds[s]))
            round_rows += _round_rows(spec.key, p_id, len(prompt), rep, profile)
            bar.update()
    else:
        for s, bits in enumerate(schedules):
            bar.set_postfix(schedule=bits_text(bits))
            for prompt in prompts:
                recs, n = execute_prompt(pair, prompt, bits, config)
                per_schedule[s] += recs
                tokens[s].append(n)
                n_rounds[s].append(len(recs))
                bar.update()
    bar.close()
    runtime = runtime_for(profile, sum(map(len, prompts)) / len(prompts), config.tree)
    traj, actions = [], []
    for s, bits in enumerate(schedules):
        t, a = trajectory_rows(
            spec.key, s, bits, per_schedule[s], tokens[s], n_rounds[s], profile, runtime, mode
        )
        traj.append(t)
        actions += a
    return ReportTables(
        to_table(specs["trajectories"], traj),
        to_table(specs["actions"], actions),
        to_table(specs["rounds"], round_rows),
        to_table(specs["continuations"], continuations),
    )


def _round_rows(
    key: ReportKey, prompt_id: int, prompt_tokens: int, rep: PromptReplay, profile: LatencyProfile
) -> list[dict]:
    """Every schedule from every round-table start, priced as execute mode would price it arriving
    with the start's mid lag: the first mid call also forwards the lag (catch-up), as in
    RoundRecord.counts, with the same tree and frontier counts as the trajectory rows; the prompt-row
    blocks it reads are charged where the arrival the lag comes from had not read them; ``catch_up_ms``
    is what the catch-up adds (the round priced with it less the round priced as if caught up)."""
    rows = []
    for start, outcomes in sorted(rep.starts.items()):
        depth = len(outcomes[0].signals)
        lag, seen = rep.start_lags[start], rep.start_blocks[start]
        counts = [_counts(o, depth, lag, seen) for o in outcomes]
        ms = [price_round(profile, c) for c in counts]
        tps = [1e3 * (o.accepted + 1) / t for o, t in zip(outcomes, ms, strict=True)]
        best = max(range(len(outcomes)), key=lambda s: (tps[s], -s))
        for s, o in enumerate(outcomes):
            rows.append(
                {
                    **key.as_row(),
                    "prompt_id": prompt_id,
                    "prompt_tokens": prompt_tokens,
                    "start_position": start,
                    "mid_lag": lag,
                    "schedule_id": s,
                    "accepted": o.accepted,
                    "verified_nodes": o.verified_nodes,
                    "mid_call_tokens": list(o.mid_tree_tokens),
                    "n_small_steps": depth - len(o.mid_tree_tokens),
                    "prompt_blocks": counts[s].prompt_blocks,
                    "round_latency_ms": ms[s],
                    "catch_up_ms": _catch_up_ms(profile, o, depth, lag, seen, ms[s]),
                    "decision_ms": profile.decision_ms,
                    "decision_cold_ms": profile.decision_cold_ms,
                    "throughput_tok_per_s": tps[s],
                    "is_round_best": s == best,
                    "signals": [x for step in o.signals for x in step],
                }
            )
    return rows


def _catch_up_ms(
    profile: LatencyProfile, o: BranchOutcome, depth: int, lag: int, seen: frozenset[int], ms: float
) -> float:
    """What forwarding the lag in the round's first mid call adds to its price ``ms`` (0 for a round
    that calls no mid drafter or arrives caught up)."""
    if not (o.mid_tree_tokens and lag):
        return 0.0
    return max(0.0, ms - price_round(profile, _counts(o, depth, 0, seen)))


def _counts(o: BranchOutcome, depth: int, lag: int, seen: frozenset[int]) -> RoundCounts:
    """A round-table round's counts; it computes the prompt-row blocks it reads that `seen` lacks."""
    record = RoundRecord(
        accepted=o.accepted,
        emitted=o.accepted + 1,
        verified_nodes=o.verified_nodes,
        mid_tree_tokens=o.mid_tree_tokens,
        mid_catch_up=lag if o.mid_tree_tokens else 0,
        small_steps=depth - len(o.mid_tree_tokens),
        signals=o.signals,
        tree_nodes=o.tree_nodes,
        small_frontier=o.small_frontier,
        mid_lag=lag,
        prompt_blocks=len(o.prompt_blocks - seen),
    )
    return record.counts()


def inputs_key(inputs: Mapping[str, object]) -> str:
    return digest_json(dict(inputs))


def changed_inputs(old: Mapping[str, object], new: Mapping[str, object]) -> list[str]:
    """``name: old -> new`` for every entry that differs (missing entries read as None)."""
    return [
        f"{name}: {old.get(name)!r} -> {new.get(name)!r}"
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]


def schema_inputs(depth: int) -> dict[str, str]:
    """The table schema versions a report is written with, as entries of its resume inputs."""
    return {f"schema.{n}": s.tag for n, s in specs_for(depth).items()}


def write_report(
    out_dir: Path, spec: ReportSpec, tables: ReportTables, depth: int, inputs: Mapping[str, object]
) -> Path:
    """Write the report folder atomically: tables and manifest into a temporary folder, each file
    fsynced, then the folder fsynced and renamed into place (an older folder is moved aside first)."""
    final = out_dir / spec.report_id
    tmp = out_dir / f".tmp-{os.getpid()}-{spec.report_id}"
    old = out_dir / f".old-{os.getpid()}-{spec.report_id}"
    for path in (tmp, old):
        shutil.rmtree(path, ignore_errors=True)
    try:
        specs = specs_for(depth)
        files = {}
        for name in TABLE_NAMES:
            path = tmp / f"{name}.parquet"
            write_table(path, specs[name], getattr(tables, name))
            files[path.name] = sha256_of_file(path)
        manifest = {
            "report_id": spec.report_id,
            "key": inputs_key(inputs),
            "inputs": dict(inputs),
            "schemas": {n: s.tag for n, s in specs.items()},
            "files": files,
        }
        with (tmp / MANIFEST).open("w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return final


def _manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise ReportError(f"{path}: no manifest (the report folder is incomplete)")
    manifest = read_json_object(path, ReportError)
    want = {"key": str, "inputs": dict, "files": dict}
    bad = [k for k, t in want.items() if not isinstance(manifest.get(k), t)]
    if bad:
        raise ReportError(f"{path}: missing or malformed {bad} (written by an older collector?)")
    return manifest


def check_report(folder: Path, inputs: Mapping[str, object]) -> None:
    """Raise ReportError naming the file unless ``folder`` is a finished report of exactly ``inputs``:
    its manifest parses, its key matches, and every table file has the content the manifest records."""
    manifest = _manifest(folder)
    if manifest["key"] != inputs_key(inputs):
        changed = changed_inputs(manifest["inputs"], inputs) or ["key does not match its recorded inputs"]
        raise ReportError(f"{folder / MANIFEST}: computed from other inputs ({'; '.join(changed)})")
    for name in TABLE_NAMES:
        path = folder / f"{name}.parquet"
        if not path.is_file():
            raise ReportError(f"{path}: missing")
        if sha256_of_file(path) != manifest["files"].get(path.name):
            raise ReportError(f"{path}: content differs from its digest in {MANIFEST} (truncated or corrupt)")


def read_report(folder: Path, depth: int, inputs: Mapping[str, object]) -> ReportTables:
    """A checked report's tables (see `check_report`); errors name the file."""
    check_report(folder, inputs)
    specs = specs_for(depth)
    tables = {}
    for name in TABLE_NAMES:
        path = folder / f"{name}.parquet"
        try:
            tables[name] = read_table(path, specs[name])
        except (SchemaError, pa.ArrowException, OSError) as err:
            raise ReportError(f"{path}: unreadable ({err})") from err
    return ReportTables(**tables)


def completed_reports(out_dir: Path, inputs_by_id: Mapping[str, Mapping[str, object]]) -> set[str]:
    """The planned report ids whose folder is a finished report of their inputs.

    A folder that is not (other inputs, a corrupt or missing file, bad manifest JSON) is left to be
    recollected, with a warning naming the file; it is replaced when its report is written again.
    """
    done = set()
    for report_id, inputs in inputs_by_id.items():
        folder = out_dir / report_id
        if not folder.exists():
            continue
        try:
            check_report(folder, inputs)
        except ReportError as err:
            log.warning("recollecting report %s: %s", report_id, err)
            continue
        done.add(report_id)
    return done


_TEMP = re.compile(r"^\.(?:tmp|old)-(\d+)-")


def remove_stale_temps(out_dir: Path) -> list[Path]:
    """Remove the temporary folders of writers that died (by pid on this host); returns them."""
    removed = []
    for path in sorted(out_dir.glob(".*")):
        match = _TEMP.match(path.name)
        if match and not _alive(int(match[1])):
            shutil.rmtree(path, ignore_errors=True)
            log.info("%s: removed the half-written folder of a writer that died", path)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers are never in use between reports
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
