"""Files on disk, the helpers every layer uses: writing one atomically and hashing one.

`replace_atomically` writes the bytes to a temporary file in the target's folder, fsyncs it,
renames it over the target and fsyncs the folder; on any error the temporary file is removed and
the old file, if any, is left as it was. `sha256_of_file` is the hex SHA-256 of a file's bytes,
read in 1 MiB chunks so a multi-gigabyte checkpoint never sits in memory whole.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

_CHUNK = 1 << 20


def sha256_of_file(path: Path | str) -> str:
    """Hex SHA-256 of the file's bytes, streamed in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``path`` (parents created) by temp file, fsync and rename; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
