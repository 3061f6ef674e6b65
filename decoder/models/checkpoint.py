"""SHA-256 records of model folders, written once by the pipeline and checked on every load.

Contract: models/checksums.py `record_folder` hashes every file of a model folder and writes
``checkpoint_digest.json`` ({relative path: sha256}) into it; :func:`verify_folder` checks a folder
against its record (that file, or the ``files`` entry of a real pair's ``conversion.json``) and
raises :class:`CheckpointError` naming the first file that is missing, truncated or changed. A
folder without a record is not checked (a user's own checkpoint). A digest catches accidents (a
flipped bit, a cut download, a half-copied folder), not a deliberate edit: whoever can rewrite the
weights can rewrite the record beside them.

Hashing a 3 GB checkpoint costs seconds, so a verified folder is remembered for the process, keyed
by each file's (size, mtime): a file rewritten afterwards is hashed again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from decoder.io.files import sha256_of_file

DIGEST_FILE = "checkpoint_digest.json"
# Records that carry a folder's file digests: (file name, key holding {path: sha256} or None).
RECORDS: tuple[tuple[str, str | None], ...] = ((DIGEST_FILE, None), ("conversion.json", "files"))
_verified: set[tuple[str, tuple[tuple[str, int, int], ...]]] = set()


class CheckpointError(ValueError):
    """A model folder's files do not match its recorded digests."""


def folder_digests(folder: Path) -> dict[str, str]:
    """{relative posix path: sha256} of every file under ``folder`` but the records themselves."""
    skip = {name for name, _ in RECORDS}
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in skip)
    return {p.relative_to(folder).as_posix(): sha256_of_file(p) for p in files}


def read_record(folder: Path) -> tuple[Path, dict[str, str]] | None:
    """(record file, {path: sha256}) of the first record the folder holds, or None."""
    for name, key in RECORDS:
        path = folder / name
        if not path.is_file():
            continue
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{path}: unreadable digest record ({err})") from None
        entry = raw if key is None else raw.get(key) if isinstance(raw, dict) else None
        if entry is None and key is not None:
            continue  # a conversion.json written before digests were recorded
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
            raise CheckpointError(f"{path}: digest record must map file names to SHA-256 strings")
        return path, entry
    return None


def _stat_key(folder: Path, names: list[str]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for name in names:
        st = (folder / name).stat()
        out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def verify_digests(folder: Path | str, expected: Mapping[str, str], source: str = "record") -> None:
    """Raise CheckpointError naming the first file of ``expected`` that is missing or differs."""
    folder = Path(folder)
    names = sorted(expected)
    for name in names:
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder / name}: missing, though {source} lists it")
    key = (str(folder.resolve()), _stat_key(folder, names))
    if key in _verified:
        return
    for name in names:
        actual = sha256_of_file(folder / name)
        if actual != expected[name]:
            raise CheckpointError(
                f"{folder / name}: SHA-256 {actual[:12]}... does not match {source} "
                f"({expected[name][:12]}...): the file is corrupt or was changed"
            )
    _verified.add(key)


def check_safetensors_size(path: Path) -> None:
    """Raise CheckpointError unless the file is as long as its header says (a cut download)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise CheckpointError(f"{path}: not a safetensors file or truncated ({size} bytes)")
        try:
            header = json.loads(fh.read(n))
            end = max(
                (int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
            raise CheckpointError(f"{path}: unreadable safetensors header ({err})") from None
    if 8 + n + end != size:
        raise CheckpointError(
            f"{path}: {size} bytes, but its header describes {8 + n + end}: truncated or padded"
        )


def verify_folder(folder: Path | str) -> bool:
    """Check ``folder`` against its record and every safetensors file against its own header;
    True when a record was checked, False when the folder has none."""
    folder = Path(folder)
    for path in sorted(folder.glob("*.safetensors")):
        check_safetensors_size(path)
    found = read_record(folder)
    if found is None:
        return False
    path, expected = found
    verify_digests(folder, expected, str(path))
    return True
