"""Read GitHub markdown tables back into cells, so tests check values, not column padding."""

from __future__ import annotations

import re

SEPARATOR = re.compile(r"^\|(?::?-+:?\|)+$")  # no spaces: a data row of "-" cells is not one


def md_rows(text: str) -> list[list[str]]:
    """The stripped cells of every table line in ``text`` (headers and bodies; separator lines left
    out), in order."""
    return [
        [c.strip() for c in line[1:-1].split("|")]
        for line in (ln.strip() for ln in text.splitlines())
        if line.startswith("|") and line.endswith("|") and not SEPARATOR.match(line)
    ]


def md_tables(text: str) -> list[list[list[str]]]:
    """Each table of ``text`` as rows of cells, header first; checks each is well formed (a
    separator under the header, the same number of cells on every line)."""
    tables, current = [], []
    for line in (*(ln.strip() for ln in text.splitlines()), ""):
        if line.startswith("|"):
            current.append(line)
            continue
        if current:
            assert len(current) >= 2 and SEPARATOR.match(current[1]), current[:2]
            widths = {ln.count("|") for ln in current}
            assert len(widths) == 1, current
            tables.append(md_rows("\n".join(current)))
            current = []
    return tables
