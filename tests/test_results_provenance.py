"""Provenance that cannot drift: a pipeline run records the code it ran, and `make results` names that
run's commit on every page or refuses.

Each test builds a small git checkout in a temporary folder (code files, params.yaml and the overlay
files, a README with the results markers) and a temporary MLflow store, makes a pipeline run there
with the project's own tracking helpers (start_pipeline, stage_run, end_pipeline; provenance's ROOT
pointed at the checkout), and runs `make results`' entry point on it. The last test reads this
repository's own README.md, docs/results.md and docs/ledger.csv.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from results_artifacts import write_artifacts

import pipeline.provenance as provenance_mod
import pipeline.readme as readme_mod
from collectors.evaluation.ledger import GROUPS, Figure, LedgerRow, read_ledger
from config.params import ROOT, Params, load_params
from pipeline.cli import stage_params
from pipeline.provenance import code_digest, commit_code_digest
from pipeline.readme import END, LEDGER, RESULTS_PAGE, START, named_provenance
from pipeline.tracking import PARENT_ENV, end_pipeline, log_metrics, open_store, stage_run, start_pipeline


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A committed checkout with code, params and docs; git and MLflow calls of the project point
    at it and at a store beside it."""
    repo = tmp_path / "checkout"
    for path, text in {
        "decoder/x.py": "A = 1\n",
        "pipeline/y.py": "B = 2\n",
        "dvc.lock": "schema: '2.0'\n",
        "README.md": f"# T\n{START}\nold\n{END}\n## Install\n",
        "docs/LOG.md": "# Log\n",
        ".gitignore": "__pycache__/\nartifacts/\n",
    }.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    for name in ("params.yaml", "dvc.yaml"):  # the stage runs read dvc.yaml at provenance's ROOT
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "profiles", repo / "profiles")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "code")
    monkeypatch.setattr(provenance_mod, "ROOT", repo)
    monkeypatch.setattr(readme_mod, "resolve", lambda p: repo / p)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv(PARENT_ENV, raising=False)
    write_artifacts(repo, load_params())
    return repo


def finished_run(monkeypatch, params: Params, during: Callable[[], None] | None = None) -> str:
    """A pipeline run as `make repro` makes one: the parent, one stage run (after ``during``, an edit
    made while the run goes on), then the parent closed; returns its id."""
    parent = start_pipeline(params)
    monkeypatch.setenv(PARENT_ENV, parent)
    if during is not None:
        during()
    tmp = Path(params.mlflow.db).parent
    staged = load_params(profile=params.overlay, overrides={"collect": {"out_dir": str(tmp / "collect")}})
    with stage_run("canonicalize", stage_params("canonicalize", staged)):
        log_metrics({"n_states": 3})
    monkeypatch.delenv(PARENT_ENV)
    assert end_pipeline(params, parent, 0)
    return parent


def results(capsys) -> tuple[int, str]:
    """`make results` on the checkout: exit status and what it wrote to stderr."""
    capsys.readouterr()
    status = readme_mod.main([])
    return status, capsys.readouterr().err


def pages(repo: Path) -> list[bytes]:
    paths = [repo / p for p in ("README.md", RESULTS_PAGE, LEDGER)]
    return [p.read_bytes() if p.is_file() else b"" for p in paths]


def shown(figure: Figure) -> str:
    """A gain as README's table shows it: +9.4%, with its [low, high] where the run has one."""
    point = f"{figure.value - 1:+.1%}"
    if figure.lo is None or figure.hi is None:
        return point
    return f"{point} [{figure.lo - 1:+.1%}, {figure.hi - 1:+.1%}]"


def named_everywhere(root: Path) -> LedgerRow:
    """The ledger's newest row, checked to name the commit and dvc.lock that README's results block and
    docs/results.md's header name, with the figures README's table shows."""
    readme = (root / "README.md").read_text()
    block = readme[readme.index(START) : readme.index(END)]
    header = (root / RESULTS_PAGE).read_text().split("\n## ", 1)[0]
    newest = read_ledger((root / LEDGER).read_text(), LEDGER)[0]
    (short, short_lock), (commit, lock) = named_provenance(block), named_provenance(header)
    assert commit == newest.commit and newest.commit.startswith(short)
    assert lock == newest.lock_sha256 and newest.lock_sha256.startswith(short_lock)
    f = newest.figures
    for group in GROUPS:
        name = group.replace("-", "_") + "_gain"
        if f"{name}_mean" in f:
            cell = f"| {group.replace('_', ' ')} (" + block.split(f"| {group.replace('_', ' ')} (", 1)[1]
            assert f"mean {shown(f[f'{name}_mean'])}, " in cell.splitlines()[0]
            if f"{name}_worst" in f:
                assert f"worst {shown(f[f'{name}_worst'])}" in cell.splitlines()[0]
    if "pricing_within" in f:
        assert f"on {f['pricing_within'].value:.0f} of {f['pricing_rows'].value:.0f}" in block
    assert f"full GRAFT {f['graft_priced_speedup'].value:.2f}x over" in block
    return newest


def test_the_code_digest_counts_code_files_and_not_docs_params_or_ignored_files(checkout):
    clean = code_digest(checkout)
    assert clean == commit_code_digest("HEAD", checkout) and len(clean) == 64
    commented = (checkout / "params.yaml").read_text() + "# a comment\n"
    for path, text in (("README.md", "# edited\n"), ("docs/LOG.md", "# Log\nnew entry\n"),
                       ("dvc.lock", "schema: '3.0'\n"), ("decoder/__pycache__/x.pyc", "bytes"),
                       ("params.yaml", commented)):  # fmt: skip
        (checkout / path).parent.mkdir(exist_ok=True)
        (checkout / path).write_text(text)
        assert code_digest(checkout) == clean, path
    (checkout / "pipeline/new.py").write_text("C = 3\n")  # untracked, not ignored: it can be imported
    assert code_digest(checkout) != clean
    (checkout / "pipeline/new.py").unlink()
    (checkout / "decoder/x.py").unlink()  # a deleted file is code that no longer runs
    assert code_digest(checkout) != clean
    git(checkout, "checkout", "decoder/x.py")
    (checkout / "dvc.yaml").write_text("stages: {}\n")
    assert code_digest(checkout) != clean and commit_code_digest("HEAD", checkout) == clean
    assert commit_code_digest("0" * 40, checkout) is None


def test_a_pipeline_run_records_the_code_it_starts_on(checkout):
    params = load_params()
    client, _ = open_store(params.mlflow)
    tags = client.get_run(start_pipeline(params)).data.tags
    assert tags["code.digest"] == code_digest(checkout) and tags["code.dirty"] == "false"
    assert tags["git.revision"] == git(checkout, "rev-parse", "HEAD")
    (checkout / "decoder/x.py").write_text("A = 2\n")
    tags = client.get_run(start_pipeline(params)).data.tags
    assert tags["code.digest"] == code_digest(checkout) != commit_code_digest("HEAD", checkout)
    assert tags["code.dirty"] == "true"


def test_make_results_names_the_runs_commit_everywhere_and_adds_one_row(checkout, monkeypatch, capsys):
    run = finished_run(monkeypatch, load_params())
    ran_on = git(checkout, "rev-parse", "HEAD")
    # results are committed with docs: a docs commit after the run moves HEAD, not the commit named
    (checkout / "docs/LOG.md").write_text("# Log\n## 2026-12-08: a run\n")
    git(checkout, "commit", "-qam", "Log the run")
    assert results(capsys) == (0, "")
    newest = named_everywhere(checkout)
    assert newest.commit == ran_on != git(checkout, "rev-parse", "HEAD") and newest.run_id == run
    assert newest.lock_sha256 == readme_mod.lock_digest(checkout)
    assert run in (checkout / RESULTS_PAGE).read_text().splitlines()[2]
    assert "uncommitted" not in (checkout / RESULTS_PAGE).read_text()
    assert results(capsys) == (0, "")  # the same run reported again is the same row, not a second one
    assert read_ledger((checkout / LEDGER).read_text(), LEDGER) == [newest]


def test_make_results_refuses_in_one_line_when_the_checkouts_code_differs(checkout, monkeypatch, capsys):
    run = finished_run(monkeypatch, load_params())
    ran_on = git(checkout, "rev-parse", "HEAD")
    before = pages(checkout)
    (checkout / "decoder/x.py").write_text("A = 2\n")
    status, err = results(capsys)
    assert status == 2 and err.count("\n") == 1 and err.startswith("error: this checkout's code differs")
    assert run in err and f"check out {ran_on[:12]}" in err and "make repro" in err
    assert pages(checkout) == before  # nothing half-written
    git(checkout, "commit", "-qam", "Change the code")  # committed, it is still not the code that ran
    assert results(capsys)[0] == 2 and pages(checkout) == before
    git(checkout, "revert", "--no-edit", "HEAD")  # the code that ran again, at a later commit
    assert results(capsys) == (0, "")
    assert named_everywhere(checkout).commit == ran_on  # the run's own commit comes first


def test_params_count_by_value(checkout, monkeypatch, capsys):
    finished_run(monkeypatch, load_params())
    text = (checkout / "params.yaml").read_text()
    (checkout / "params.yaml").write_text(text + "# a comment changes no value\n")
    assert results(capsys) == (0, "")
    (checkout / "params.yaml").write_text(text.replace("n_questions: 80", "n_questions: 81", 1))
    status, err = results(capsys)
    assert status == 2 and "params" in err and err.count("\n") == 1


def test_a_run_on_code_committed_nowhere_is_refused_until_it_is_committed(checkout, monkeypatch, capsys):
    (checkout / "decoder/x.py").write_text("A = 2\n")
    run = finished_run(monkeypatch, load_params())
    before = pages(checkout)
    status, err = results(capsys)
    assert status == 2 and "committed nowhere" in err and run in err and "with uncommitted changes" in err
    assert pages(checkout) == before
    git(checkout, "commit", "-qam", "Change the code that ran")
    assert results(capsys) == (0, "")
    assert named_everywhere(checkout).commit == git(checkout, "rev-parse", "HEAD")


def test_a_stage_that_ran_on_code_edited_during_the_run_is_refused(checkout, monkeypatch, capsys):
    run = finished_run(monkeypatch, load_params(), lambda: (checkout / "decoder/x.py").write_text("A = 3\n"))
    git(checkout, "checkout", "decoder/x.py")  # the code the run started on, again
    status, err = results(capsys)
    assert status == 2 and "stage canonicalize" in err and run in err and "edited during the run" in err


def test_no_store_no_run_or_a_run_without_its_code_is_refused(checkout, monkeypatch, capsys):
    status, err = results(capsys)
    assert status == 2 and "no MLflow store" in err
    params = load_params()
    open_store(params.mlflow)
    status, err = results(capsys)
    assert status == 2 and "no finished pipeline run of overlay 'base'" in err
    client, _ = open_store(params.mlflow)
    old = finished_run(monkeypatch, params)
    client.set_tag(old, "code.digest", "unknown")  # as a run made before runs recorded their code
    status, err = results(capsys)
    assert status == 2 and "records no code digest" in err
    assert not (checkout / RESULTS_PAGE).exists() and not (checkout / LEDGER).exists()


def test_the_real_pair_page_is_generated_from_its_run_or_refused(checkout, monkeypatch, capsys):
    import pipeline.real_pair_results as real

    monkeypatch.setattr(real, "resolve", lambda p: checkout / p)
    params = load_params(profile=real.OVERLAY)
    finished_run(monkeypatch, load_params())  # a run of the base overlay is not the real pair's
    capsys.readouterr()
    assert real.main([]) == 2 and "no finished pipeline run of overlay 'real-pair'" in capsys.readouterr().err
    run = finished_run(monkeypatch, params)
    capsys.readouterr()
    write_artifacts(checkout, load_params())  # the base run's outputs where the real pair's belong
    status, err = real.main([]), capsys.readouterr().err
    assert status == 2 and "not the real pair's" in err and err.count("\n") == 1
    shutil.rmtree(checkout / "artifacts")
    status, err = real.main([]), capsys.readouterr().err
    assert status == 2 and "results.json: missing" in err and err.count("\n") == 1
    assert not (checkout / real.PAGE).exists()
    write_artifacts(checkout, params)
    bench = checkout / real.BENCHES[1][1]
    bench.parent.mkdir(parents=True)
    bench.with_suffix(".md").write_text("**bfloat16**: wall clock pooled 1.11x\n")
    assert real.main([]) == 0
    page = (checkout / real.PAGE).read_text()
    assert run in page and git(checkout, "rev-parse", "HEAD") in page
    assert "| table.md |" in page and "| wall.md |" in page and "within on 14 of 20" in page
    assert "pooled 1.11x" in page and page.count("Not run: `make real-pair`") == 1


def test_this_repositorys_pages_and_ledger_name_the_same_run():
    newest = named_everywhere(ROOT)
    rows = read_ledger((ROOT / LEDGER).read_text(), LEDGER)
    assert len(rows) >= 2 and [r.date for r in rows] == sorted((r.date for r in rows), reverse=True)
    assert len({r.key() for r in rows}) == len(rows) and newest == rows[0]
