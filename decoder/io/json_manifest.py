"""The JSON manifests written beside saved files: read, check the field names, digest.

Used by the block drafter's config (decoder/graft/drafter.py), the edge scorer's manifest
(decoder/graft/edge_scorer.py) and a collect report's manifest (collectors/collect/report.py). Each reader
raises its own error type (``error``), always naming the file and, where one is at fault, the
field. The digest is SHA-256 of the canonical JSON (sorted keys, no spaces) of every field but the
one that stores it, so any edit after writing shows. The scheduler artifacts (decoder/deploy/artifact.py)
keep their own digest, which keeps key order: changing it would refuse every saved artifact.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def read_json_object(path: Path, error: type[Exception]) -> dict[str, Any]:
    """``path`` parsed as a JSON object; ``error`` naming the file if it is not UTF-8 JSON or not an
    object."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise error(f"{path}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def check_field_names(
    raw: Mapping[str, Any], expected: Iterable[str], path: Path, error: type[Exception]
) -> None:
    """``error`` naming the first missing field (by name), else the first unknown one."""
    want = set(expected)
    missing, unknown = sorted(want - set(raw)), sorted(set(raw) - want)
    if missing or unknown:
        key = (missing or unknown)[0]
        raise error(f"{path}: field {key!r} is {'missing' if missing else 'unknown'}")


def digest_json(value: object) -> str:
    """SHA-256 of ``value``'s canonical JSON (sorted keys, no spaces; NaN refused): the project's one
    digest of a JSON value (manifests, collect's inputs and prompts, priced cells' prompts)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_digest(fields: Mapping[str, Any], exclude: str) -> str:
    """SHA-256 of the canonical JSON of every field but ``exclude`` (the field that stores it)."""
    return digest_json({k: v for k, v in fields.items() if k != exclude})
