"""docs/LOG.md is a dated log: every entry has a date and names a commit of this repository.

An entry's heading is `## YYYY-MM-DD: what`, entries run newest first, and each entry names at least
one commit (7-12 hex digits) that `git rev-list --all` knows. A finding dated only relative to
another run ("the run before") loses its meaning as soon as a newer run is logged, so those
phrases fail too. The commit check needs the git history and skips without it (an export, a
shallow clone).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "docs" / "LOG.md"
HEADING = re.compile(r"^## (\d{4}-\d{2}-\d{2}): \S")
HASH = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,12}(?![0-9A-Za-z])")
RELATIVE = ("the run before", "a session before", "the last run")


@dataclass(frozen=True)
class Entry:
    heading: str
    body: str


def entries(text: str) -> list[Entry]:
    """The `## ` entries of a log, each with the text up to the next `## ` heading."""
    out: list[Entry] = []
    for chunk in re.split(r"^(?=## )", text, flags=re.M)[1:]:
        heading, _, body = chunk.partition("\n")
        out.append(Entry(heading, body))
    return out


def undated(log: list[Entry]) -> list[str]:
    return [e.heading for e in log if not HEADING.match(e.heading)]


def out_of_order(log: list[Entry]) -> list[str]:
    """Headings dated after the entry above them (the log runs newest first)."""
    dates = [m.group(1) for e in log if (m := HEADING.match(e.heading))]
    return [f"{b} after {a}" for a, b in pairwise(dates) if b > a]


def relative_dating(text: str) -> list[str]:
    lowered = " ".join(text.lower().split())  # a phrase may be wrapped over two lines
    return [p for p in RELATIVE if p in lowered]


def without_commit(log: list[Entry], commits: set[str]) -> list[str]:
    """Headings of entries that name no commit from ``commits`` (full hashes)."""

    def known(token: str) -> bool:
        return any(c.startswith(token) for c in commits)

    return [e.heading for e in log if not any(known(t) for t in HASH.findall(e.heading + "\n" + e.body))]


def git_commits() -> set[str] | None:
    """Every commit hash in the repository's history, or None where that history is not at hand."""
    try:
        shallow = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if shallow != "false":
            return None
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "rev-list", "--all"], capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return set(listed) or None


def test_every_entry_is_dated_and_newest_first():
    log = entries(LOG.read_text())
    assert len(log) > 1
    assert not undated(log), f"docs/LOG.md: headings without a YYYY-MM-DD date: {undated(log)}"
    assert not out_of_order(log), f"docs/LOG.md: not newest first: {out_of_order(log)}"


def test_no_relative_dating():
    found = relative_dating(LOG.read_text())
    assert not found, f"docs/LOG.md dates a finding relative to another run: {found}"


def test_every_entry_names_a_commit_of_this_repository():
    commits = git_commits()
    if commits is None:
        pytest.skip("no full git history here")
    missing = without_commit(entries(LOG.read_text()), commits)
    assert not missing, f"docs/LOG.md: entries naming no commit of this repository: {missing}"


def test_the_checks_catch_what_they_are_for():
    text = (
        "# Log\n\n## 2026-12-05: first (abc1234)\nbody\n"
        "## Undated history\nthe run\nbefore this one, 0123456789abcdef0 is too long\n"
        "## 2026-12-06: later, numbers 1,838 and deadbeef0 only\nA session before.\n"
    )
    log = entries(text)
    assert [e.heading for e in log] == [
        "## 2026-12-05: first (abc1234)",
        "## Undated history",
        "## 2026-12-06: later, numbers 1,838 and deadbeef0 only",
    ]
    assert undated(log) == ["## Undated history"]
    assert out_of_order(log) == ["2026-12-06 after 2026-12-05"]
    assert relative_dating(text) == ["the run before", "a session before"]
    commits = {"abc1234" + "0" * 33, "deadbeef1" + "0" * 31}
    assert without_commit(log, commits) == [
        "## Undated history",
        "## 2026-12-06: later, numbers 1,838 and deadbeef0 only",
    ]
