"""The pipeline run a results page reports, and whether this checkout may report it.

Contract: :func:`newest_run` reads the newest FINISHED pipeline (parent) run of an overlay from the
MLflow store into a :class:`RunRecord`: the commit it started on, the code digest of that working
tree and whether it differed from the commit (pipeline/provenance.py code_digest), its params hash,
its date, and each stage run's own code digest. :func:`reportable_commit` returns the commit a page
may name for that run, or raises a one-line :class:`ProvenanceError` saying why none: the run
recorded no code, a stage ran on other code than the run started on, this checkout's code or params
differ from what ran, or the code and params that ran are committed nowhere. The commit named is
the first, of the run's own commit and then the commits after it up to HEAD (oldest first), whose
code tree is the code that ran and whose params are the run's, so one run names one commit however
often it is reported. Code is compared by content; params by value (a comment does not count).
Reads only: no store is created, nothing is written.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.params import Params, ParamsError, load_params
from pipeline.provenance import (
    code_digest,
    commit_code_digest,
    commits_after,
    file_at,
    git_revision,
    json_sha256,
    pipeline_values,
)
from pipeline.tracking import (
    CODE_DIGEST,
    CODE_DIRTY,
    GIT_REVISION,
    KIND,
    OVERLAY,
    PARAMS_HASH,
    STAGE,
    tracking_uri,
)

MOST_COMMITS = 500  # commits after the run's that are searched for its code


class ProvenanceError(Exception):
    """Why a run cannot be reported from this checkout, in one line that says what to do."""


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    overlay: str
    commit: str  # HEAD when the run started
    code_digest: str  # the working tree's code then; "" where the run recorded none
    code_dirty: bool  # that code differed from the commit's
    params_hash: str
    date: str  # the day it started, UTC, YYYY-MM-DD
    stage_digests: tuple[tuple[str, str], ...]  # (stage, the code digest its process started on)

    def named(self) -> str:
        """The run and where it ran, for messages."""
        state = " with uncommitted changes" if self.code_dirty else ""
        return f"pipeline run {self.run_id} of {self.date} (commit {self.commit[:12]}{state})"


def _client(params: Params, repro: str) -> Any:
    import mlflow

    uri = tracking_uri(params.mlflow)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ProvenanceError(f"no MLflow store at {uri.removeprefix('sqlite:///')}: run `{repro}` first")
    return mlflow.MlflowClient(uri)


def newest_run(params: Params, repro: str = "make repro") -> RunRecord:
    """The newest FINISHED pipeline run of ``params.overlay`` in the store, with its stages' digests;
    raises ProvenanceError (advising ``repro``) where there is none."""
    client = _client(params, repro)
    exp = client.get_experiment_by_name(params.mlflow.experiment)
    found = []
    if exp is not None:
        found = client.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.`{KIND}` = 'pipeline' and tags.`{OVERLAY}` = '{params.overlay}' "
            "and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
    if not found:
        raise ProvenanceError(
            f"no finished pipeline run of overlay {params.overlay!r} in {tracking_uri(params.mlflow)}: "
            f"run `{repro}` first"
        )
    run = found[0]
    stages = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'",
        max_results=1000,
    )
    tags = run.data.tags
    return RunRecord(
        run_id=run.info.run_id,
        overlay=params.overlay,
        commit=tags.get(GIT_REVISION, "unknown"),
        code_digest="" if tags.get(CODE_DIGEST, "unknown") == "unknown" else tags[CODE_DIGEST],
        code_dirty=tags.get(CODE_DIRTY) != "false",
        params_hash=tags.get(PARAMS_HASH, ""),
        date=dt.datetime.fromtimestamp(run.info.start_time / 1000, tz=dt.UTC).date().isoformat(),
        stage_digests=tuple(
            (s.data.tags.get(STAGE, s.info.run_id), s.data.tags[CODE_DIGEST])
            for s in stages
            if CODE_DIGEST in s.data.tags
        ),
    )


def params_hash(overlay: str, root: Path, commit: str | None = None) -> str | None:
    """The params hash a run of ``overlay`` records on this checkout, or on ``commit``'s params.yaml
    and overlay file; None where the commit has no such files or they do not load."""
    if commit is None:
        return json_sha256(pipeline_values(load_params(root / "params.yaml", profile=overlay)))
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("params.yaml", f"profiles/{overlay}.yaml"):
            text = file_at(commit, name, root)
            if text is None:
                return None
            (Path(tmp) / name).parent.mkdir(exist_ok=True)
            (Path(tmp) / name).write_text(text)
        try:
            return json_sha256(pipeline_values(load_params(Path(tmp) / "params.yaml", profile=overlay)))
        except ParamsError:
            return None


def _candidates(commit: str, root: Path) -> list[str]:
    """The run's commit, then the commits after it up to HEAD, oldest first; HEAD alone where git
    does not know the run's commit."""
    after = commits_after(commit, MOST_COMMITS, root)
    return [git_revision(root)] if after is None else [commit, *after]


def reportable_commit(
    record: RunRecord, root: Path, command: str = "make results", repro: str = "make repro"
) -> str:
    """The commit whose code ``record``'s stages ran, checked against this checkout (see the module's
    contract); raises ProvenanceError, whose advice names ``command`` (what reports the run) and
    ``repro`` (what makes a new one)."""
    if not record.code_digest:
        raise ProvenanceError(
            f"{record.named()} records no code digest (made before runs recorded their code): rerun `{repro}`"
        )
    moved = sorted({s for s, d in record.stage_digests if d != record.code_digest})
    if moved:
        raise ProvenanceError(
            f"stage {', '.join(moved)} of {record.named()} ran on other code than the run started on "
            f"(code edited during the run): rerun `{repro}`"
        )
    back = "restore the code it ran" if record.code_dirty else f"check out {record.commit[:12]}"
    if code_digest(root) != record.code_digest:
        raise ProvenanceError(
            f"this checkout's code differs from the code of {record.named()}: {back} or rerun `{repro}`"
        )
    if params_hash(record.overlay, root) != record.params_hash:
        raise ProvenanceError(
            f"this checkout's params (params.yaml with profiles/{record.overlay}.yaml) differ from those "
            f"of {record.named()}: {back} or rerun `{repro}`"
        )
    for commit in _candidates(record.commit, root):
        if (
            commit_code_digest(commit, root) == record.code_digest
            and params_hash(record.overlay, root, commit) == record.params_hash
        ):
            return commit
    raise ProvenanceError(
        f"{record.named()} ran on code or params committed nowhere: commit them, then run `{command}` again"
    )
