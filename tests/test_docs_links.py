"""Every relative link in README.md and docs/ names a file inside the repository.

A link that leaves the repository (`../shared/...`) or names a file that is not there breaks for
every reader of a fresh clone, so both fail here. Links with a scheme (https:, mailto:) and pure
anchors are not files and are skipped; a link's own `#anchor` is dropped before the check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# [text](target) and ![alt](target); the target ends at whitespace or ')', an optional "title" after.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# <a href="..."> and <img src="..."> in raw HTML.
HTML = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, code fences and inline code left out."""
    prose = re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))
    return LINK.findall(prose) + HTML.findall(prose)


def broken(doc: Path, target: str) -> str | None:
    """Why ``target`` (a link in ``doc``) is broken, or None when it names a file in the repository."""
    if SCHEME.match(target) or target.startswith("#"):
        return None
    path = target.split("#", 1)[0].split("?", 1)[0]
    if path.startswith("/"):
        return "an absolute path"
    resolved = (doc.parent / path).resolve()
    if not resolved.is_relative_to(ROOT):
        return "outside the repository"
    if not resolved.exists():
        return "no such file"
    return None


def test_the_readme_and_the_docs_pages_exist():
    names = {p.relative_to(ROOT).as_posix() for p in documents()}
    for page in ("README.md", "docs/decoder.md", "docs/pipeline.md", "docs/data-and-zoo.md",
                 "docs/real-pair.md", "docs/design/treegraft.md", "docs/design/graft.md",
                 "docs/LOG.md", "docs/results.md", "docs/real-pair-results.md"):  # fmt: skip
        assert page in names


@pytest.mark.parametrize("doc", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_inside_the_repository(doc):
    bad = [f"{t}: {why}" for t in links(doc.read_text()) if (why := broken(doc, t)) is not None]
    assert not bad, f"{doc.relative_to(ROOT)}: broken links: {bad}"


def test_the_checker_catches_what_it_is_for():
    doc = ROOT / "docs" / "x.md"  # never written: only its folder matters
    text = (
        "[ok](decoder.md) [a](../README.md#install) [web](https://example.org) [anchor](#top)\n"
        "[out](../../shared/design/GRAFT.md) [gone](nothing-here.md) ![img](/etc/passwd)\n"
        '`[code](not-a-link.md)`\n```\n[fenced](also-not.md)\n```\n<a href="../dvc.yaml">y</a>\n'
    )
    found = {t: broken(doc, t) for t in links(text)}
    assert found == {
        "decoder.md": None,
        "../README.md#install": None,
        "https://example.org": None,
        "#top": None,
        "../../shared/design/GRAFT.md": "outside the repository",
        "nothing-here.md": "no such file",
        "/etc/passwd": "an absolute path",
        "../dvc.yaml": None,
    }
