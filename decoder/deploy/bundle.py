"""A deployment bundle's files on disk: finding a pair and checking every file before it is read.

Layout: ``<root>/index.json`` lists the pairs, each with its folder and the sha256 of that folder's
``checksums.json``; ``<root>/<pair>/checksums.json`` maps every other file of the folder (a flat
folder) to its sha256. Pinning one digest (the pair's checksums.json) pins every byte of the pair's
bundle. A pair folder can also be used on its own, without the index.

Contract: :func:`verified_folder` finds the pair's folder (the only pair when none is named, else
a :class:`DeploymentError` naming the choices) and checks, before anything is parsed: the index
and checksums files are JSON of the right shape, checksums.json's digest equals the index's entry
and ``expect_sha256``, every listed file exists and hashes to its entry (a truncated or edited file
is named), every required file is listed and no unlisted file lies beside them. Each failure is one
DeploymentError naming the file. Each file is read once: the folder it returns carries the bytes it
hashed, and callers parse those, so a file swapped after the check is never what gets loaded.
NumPy-free, torch-free. The bundle is written offline (models/bundle.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

INDEX_FILE = "index.json"
CHECKSUMS_FILE = "checksums.json"
INDEX_SCHEMA = "treegraft-deployment-index/1"
HEX64 = r"[0-9a-f]{64}"  # a sha256 as hexdigest() writes it
PAIR_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"  # a folder name: no separators, no leading dot
_HEX64, _NAME = re.compile(HEX64), re.compile(PAIR_NAME)


class DeploymentError(ValueError):
    """A deployment bundle is missing, corrupt, edited or does not fit this decoder."""


def is_hex_digest(value: object) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def is_pair_name(value: object) -> bool:
    """A pair id usable as a folder name (no path separators, no leading dot)."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def read_json(path: Path) -> object:
    """A JSON file's value, or a DeploymentError naming the file."""
    if not path.is_file():
        raise DeploymentError(f"{path}: missing file")
    return parse_json(path.read_bytes(), path)


def parse_json(data: bytes, path: Path) -> object:
    """The JSON value of a file's bytes, or a DeploymentError naming the file."""
    try:
        return json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DeploymentError(f"{path}: not a JSON file ({err})") from err


@dataclass(frozen=True)
class PairFolder:
    pair_id: str | None  # None: a pair folder given directly (its deployment.json names the pair)
    folder: Path
    checksums_sha256: str | None  # what the index pins, None without an index
    # verified_folder: every listed file's bytes, the ones it hashed, for the caller to parse
    files: Mapping[str, bytes] = field(default_factory=dict)


def _index_entries(path: Path) -> dict[str, dict]:
    index = read_json(path)
    if not isinstance(index, dict) or index.get("schema_version") != INDEX_SCHEMA:
        raise DeploymentError(f"{path}: expected schema_version {INDEX_SCHEMA!r}")
    pairs = index.get("pairs")
    if not isinstance(pairs, dict) or not pairs:
        raise DeploymentError(f"{path}: field 'pairs' must map pair ids to entries, got {pairs!r}")
    for pair_id, entry in pairs.items():
        ok = isinstance(entry, dict) and set(entry) == {"folder", "checksums_sha256"}
        if not ok or not is_pair_name(entry["folder"]) or not is_hex_digest(entry["checksums_sha256"]):
            raise DeploymentError(
                f"{path}: pairs.{pair_id} must be {{folder: a folder name, checksums_sha256: 64 hex}}, "
                f"got {entry!r}"
            )
    return pairs


def find_pair(path: Path | str, pair: str | None) -> PairFolder:
    """The folder of ``pair`` under a bundle root (its index.json), or ``path`` itself when it is a
    pair folder (it has a checksums.json and no index)."""
    root = Path(path)
    if not root.is_dir():
        raise DeploymentError(f"{root}: no deployment bundle folder")
    if not (root / INDEX_FILE).is_file():
        if (root / CHECKSUMS_FILE).is_file():
            return PairFolder(None, root, None)
        raise DeploymentError(
            f"{root}: neither a bundle root ({INDEX_FILE}) nor a pair folder ({CHECKSUMS_FILE})"
        )
    pairs = _index_entries(root / INDEX_FILE)
    if pair is None:
        if len(pairs) != 1:
            raise DeploymentError(f"{root / INDEX_FILE}: holds pairs {sorted(pairs)}; name one (--pair)")
        pair = next(iter(pairs))
    if pair not in pairs:
        raise DeploymentError(f"{root / INDEX_FILE}: no pair {pair!r}; it holds {sorted(pairs)}")
    entry = pairs[pair]
    return PairFolder(pair, root / entry["folder"], entry["checksums_sha256"])


def verified_folder(
    path: Path | str, pair: str | None, required: Sequence[str], expect_sha256: str | None = None
) -> PairFolder:
    """The pair's folder (:func:`find_pair`) with every file checked (module docstring)."""
    if expect_sha256 is not None and not is_hex_digest(expect_sha256):
        raise DeploymentError(f"expected sha256 must be 64 lowercase hex digits, got {expect_sha256!r}")
    found = find_pair(path, pair)
    folder, sums_path = found.folder, found.folder / CHECKSUMS_FILE
    if not sums_path.is_file():
        raise DeploymentError(f"{sums_path}: missing file")
    raw = sums_path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    for what, want in (("index.json's entry", found.checksums_sha256), ("--expect-sha256", expect_sha256)):
        if want is not None and digest != want:
            raise DeploymentError(f"{sums_path}: sha256 {digest} differs from {what} {want}")
    sums = parse_json(raw, sums_path)
    if not isinstance(sums, dict) or not all(is_hex_digest(v) for v in sums.values()):
        raise DeploymentError(f"{sums_path}: expected a mapping of file name -> 64 hex digits")
    unlisted = sorted(set(required) - set(sums))
    if unlisted:
        raise DeploymentError(f"{sums_path}: does not list required file(s) {unlisted}")
    files = {}
    for name, want in sorted(sums.items()):
        file = folder / name
        if not is_pair_name(name) or not file.is_file():
            raise DeploymentError(f"{file}: missing file (listed in {CHECKSUMS_FILE})")
        files[name] = file.read_bytes()  # read once: the bytes hashed are the bytes parsed
        if hashlib.sha256(files[name]).hexdigest() != want:
            raise DeploymentError(f"{file}: sha256 differs from {CHECKSUMS_FILE} (truncated or edited)")
    extra = sorted(p.name for p in folder.iterdir() if p.name != CHECKSUMS_FILE and p.name not in sums)
    if extra:
        raise DeploymentError(f"{folder / extra[0]}: not covered by {CHECKSUMS_FILE}")
    return PairFolder(found.pair_id, folder, digest, files)
