"""The scheduler's model inputs, pure NumPy (used offline by the stages and online by the decoder).

- state z: context (4) + history (D + 2) + the chosen tree signals, in that order (17 for D = 5
  and 6 signals); :func:`state_feature_names` is the one definition of that order.
- future suffix (steps k+1..D, step k+1 first) encoded in D + 1 dims: its bits right-padded with
  zeros to D - 1, then (#mid calls in the suffix) / D and (suffix length) / D. The length term
  tells an empty suffix from an all-skip one of the same padding.
- value-system input x = [z, suffix encoding] (23 dims for D = 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np

SUFFIX_STATS = ("suffix_mid_frac", "suffix_len_frac")


def state_feature_names(
    context: Sequence[str], history: Sequence[str], signals: Sequence[str]
) -> tuple[str, ...]:
    return (*context, *history, *signals)


def suffix_feature_names(depth: int) -> tuple[str, ...]:
    return (*(f"suffix_bit_{j}" for j in range(1, depth)), *SUFFIX_STATS)


def encode_suffix(suffix: str, depth: int) -> np.ndarray:
    """(D + 1,) encoding of a future suffix given as a bit string, step k+1 first."""
    if len(suffix) > depth - 1 or set(suffix) - {"0", "1"}:
        raise ValueError(f"suffix {suffix!r} is not a bit string of at most {depth - 1} steps")
    bits = [float(c == "1") for c in suffix] + [0.0] * (depth - 1 - len(suffix))
    return np.array([*bits, suffix.count("1") / depth, len(suffix) / depth], dtype=np.float64)


@cache
def all_suffixes(length: int) -> tuple[str, ...]:
    """All 2^length bit strings, in schedule-id order of their bits (first step = lowest bit)."""
    return tuple("".join("1" if (s >> j) & 1 else "0" for j in range(length)) for s in range(2**length))


@cache
def suffix_matrix(length: int, depth: int) -> np.ndarray:
    """(2^length, D + 1) encodings of :func:`all_suffixes`, read-only (cached)."""
    m = np.stack([encode_suffix(s, depth) for s in all_suffixes(length)])
    m.setflags(write=False)
    return m


def value_inputs(z: np.ndarray, suffixes: Sequence[str], depth: int) -> np.ndarray:
    """(n, |z| + D + 1) rows [z_i, encode(suffix_i)] for row-aligned z (n, |z|) and suffixes."""
    enc = np.stack([encode_suffix(s, depth) for s in suffixes]) if len(suffixes) else np.zeros((0, depth + 1))
    return np.concatenate([np.asarray(z, dtype=np.float64), enc], axis=1)
