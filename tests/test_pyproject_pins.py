"""pyproject.toml pins each runtime, dev and ray dependency to requirements.lock's version, so
`pip install .` and the hash-pinned install agree (a local label such as torch's +cpu aside)."""

from __future__ import annotations

import tomllib

from test_lock import ENTRY, ROOT, canonical


def test_every_pyproject_pin_is_the_locked_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lock = "\n".join(
        ln
        for ln in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines()
        if not ln.startswith("#")
    )
    locked = {canonical(n): v.split("+")[0] for n, v, _ in ENTRY.findall(lock)}
    specs = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    specs += project["optional-dependencies"]["ray"]
    assert all(s.count("==") == 1 for s in specs), specs  # exact pins only
    pinned = {canonical(n): v for n, v in (s.split("==") for s in specs)}
    assert {n: locked.get(n) for n in pinned} == pinned
    assert {"tabulate", "scipy"} <= set(pinned)
