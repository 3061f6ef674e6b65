"""A pair's model reference -> a local folder: a path, or a Hub id already in the local HF cache.

The pipeline loads offline (``HF_HUB_OFFLINE=1``): nothing is downloaded. A reference that is an
existing folder (relative to the repository root) is used as is. One shaped like a Hub id
(``org/name``) that is not a folder here is looked up in the local Hugging Face cache and accepted
when a snapshot of it is there; otherwise the error says to download it once or pass a local folder.
Any other reference resolves to its path, and the loader names it when it is not a model folder.

Imports nothing of the project (config is the bottom layer); huggingface_hub is imported lazily.
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


class ModelNotLocalError(FileNotFoundError):
    """A Hub id that is not in the local cache (the pipeline never downloads)."""


def cached_snapshot(repo_id: str) -> Path | None:
    """The local cache's snapshot folder of ``repo_id``, or None when it holds none."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None


def resolve_model(reference: str, root: Path, where: str) -> Path:
    """The local folder of a pair's ``target`` or ``mid`` (``where`` names the key for errors)."""
    path = Path(reference) if Path(reference).is_absolute() else root / reference
    if path.exists() or not HUB_ID.fullmatch(reference):
        return path
    snapshot = cached_snapshot(reference)
    if snapshot is not None and (snapshot / "config.json").is_file():
        return snapshot
    raise ModelNotLocalError(
        f"{where}: {reference!r} is neither a folder under {root} nor a Hub id in the local Hugging "
        "Face cache. The pipeline loads offline (HF_HUB_OFFLINE=1): pass a local folder, or "
        f"download it once first (huggingface-cli download {reference})"
    )
