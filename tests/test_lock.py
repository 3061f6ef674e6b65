"""requirements.lock (the hash-pinned install) pins exactly constraints.txt's versions, each with a
SHA-256, so `pip install --require-hashes -r requirements.lock` installs the tested environment."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"^([A-Za-z0-9][\w.-]*)==(\S+) \\\n    --hash=sha256:([0-9a-f]{64})$", re.M)
EXTRA = {"setuptools"}  # the resolver adds it; constraints.txt is a pip freeze, which leaves it out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    rows = [ln.split("==") for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return {canonical(n): v for n, v in rows}


def test_lock_pins_constraints_with_one_hash_each() -> None:
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    entries = ENTRY.findall(body)
    assert len(entries) == body.count("==") == body.count("--hash=sha256:")  # no entry without a hash
    locked = {canonical(n): v for n, v, _ in entries}
    assert len(locked) == len(entries)  # no package twice
    expected = pins((ROOT / "constraints.txt").read_text(encoding="utf-8"))
    assert {k: v for k, v in locked.items() if k not in EXTRA} == expected
    assert locked["torch"] == "2.13.0+cpu"
