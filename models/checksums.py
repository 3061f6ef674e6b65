"""The one writer of folder checksums: a JSON record {file: sha256} written beside the files.

Two records use it: a model folder's ``checkpoint_digest.json`` (every file under the folder, by
relative path; :func:`record_folder`, written by the zoo stage and checked by
decoder.models.checkpoint at every load) and a deployment bundle's ``checksums.json`` (every other
file of the flat pair folder; :func:`seal_folder`, checked by decoder.deploy.bundle). Both are
written atomically and flushed to disk (decoder.io.files.replace_atomically: temp file, fsync,
rename, fsync of the folder), so a crash leaves the old record or the new one, never half of one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from decoder.deploy.bundle import CHECKSUMS_FILE, DeploymentError
from decoder.io.files import replace_atomically, sha256_of_file
from decoder.models.checkpoint import DIGEST_FILE, folder_digests


def write_checksums(path: Path, digests: Mapping[str, str]) -> str:
    """Write ``digests`` ({file: sha256}) as sorted JSON to ``path``, atomically and durably;
    return the record's own sha256."""
    replace_atomically(path, (json.dumps(dict(digests), indent=2, sort_keys=True) + "\n").encode())
    return sha256_of_file(path)


def record_folder(folder: Path | str) -> dict[str, str]:
    """Hash every file of a model folder and write ``checkpoint_digest.json`` beside them; return
    the record."""
    folder = Path(folder)
    digests = folder_digests(folder)
    write_checksums(folder / DIGEST_FILE, digests)
    return digests


def seal_folder(folder: Path) -> str:
    """Write a bundle folder's ``checksums.json`` over every other file of it; return its sha256."""
    files = sorted(p for p in folder.iterdir() if p.name != CHECKSUMS_FILE)
    nested = [p.name for p in files if not p.is_file()]
    if nested:
        raise DeploymentError(f"{folder}: a bundle folder holds files only, found {nested}")
    return write_checksums(folder / CHECKSUMS_FILE, {p.name: sha256_of_file(p) for p in files})
