"""Writing deployment bundles (the deploy stage's output); the decoder reads them
(decoder/deploy/deployment.py, decoder/deploy/bundle.py).

A pair folder holds the student, the pair's latency profile, deployment.json and checksums.json
(models/checksums.py); ``index.json`` beside the folders lists each pair with the sha256 of its
checksums.json. Every write is checked by loading it back before it takes its place.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from decoder.deploy.bundle import INDEX_FILE, INDEX_SCHEMA, DeploymentError, is_pair_name
from decoder.deploy.deployment import DEPLOYMENT_FILE, PROFILE_FILE, STUDENT_FILES, load_deployment
from decoder.deploy.record import parse_record
from decoder.io.files import replace_atomically
from models.checksums import seal_folder


def write_index(root: Path, digests: Mapping[str, str]) -> Path:
    """``<root>/index.json``: every pair's folder and the sha256 of its checksums.json."""
    bad = [p for p in digests if not is_pair_name(p)]
    if bad:
        raise DeploymentError(f"{root / INDEX_FILE}: pair ids {bad} cannot be folder names")
    pairs = {p: {"folder": p, "checksums_sha256": d} for p, d in sorted(digests.items())}
    record = {"schema_version": INDEX_SCHEMA, "pairs": pairs}
    return replace_atomically(
        root / INDEX_FILE, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    )


def write_pair_bundle(folder: Path, record: Mapping[str, Any], student: Path, profile: Path) -> str:
    """Write one pair's bundle folder: the student artifact at ``student`` (its .json and
    .safetensors, copied byte for byte), the pair's latency profile file ``profile`` (as
    profile.json, byte for byte), ``record`` as deployment.json (checked field by field first)
    and checksums.json; return checksums.json's sha256. The folder is built beside its place and
    loaded back (every check of :func:`load_deployment`) before it is renamed into place, so a
    failure leaves no half-written or unloadable bundle."""
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    parse_record(text.encode(), folder / DEPLOYMENT_FILE)
    sources = [student.with_suffix(".json"), student.with_suffix(".safetensors"), profile]
    tmp = folder.parent / f".{folder.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for src, name in zip(sources, (*STUDENT_FILES, PROFILE_FILE), strict=True):
            shutil.copyfile(src, tmp / name)
        (tmp / DEPLOYMENT_FILE).write_text(text)
        seal_folder(tmp)
        digest = load_deployment(tmp).checksums_sha256  # beside its place: relative paths resolve alike
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return digest
