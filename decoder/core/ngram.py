"""The small drafter: training-free n-gram lookup over the committed context.

Contract (token ids only, no torch):
- `NgramIndex` maps every n-gram (n = 1..max_n) of the committed text to the positions where it
  ends, and to its distinct successor tokens, each with the latest position the n-gram ended
  before it (most recent last). It is extended incrementally with accepted tokens, never rebuilt:
  O(max_n) per token.
- `TargetLogpCache` holds, for committed position i, the target's top-m next-token log-probs
  (refreshed at accepted positions after each verification). The prompt's rows come from a
  `RowSource` (`set_source`: the prefill's, decoder/core/verify.py) a block at a time, the first time a
  position of the block is read: the drafter reads only the rows its matches continue from.
  `blocks_read` counts the blocks computed: the decoder records them per round
  (`RoundStats.prompt_blocks`) and the pricing charges each one output head over a block.
- `NgramDrafter.propose(suffix)` matches the longest suffix (min_n <= n <= max_n; `min_n` = 2 drops
  one-token matches, the least reliable drafts, so a round without a longer match drafts nothing and
  verifies the root alone, one plain target step) of context + draft path and
  returns up to `max_matches` distinct continuations, most recent occurrence first, each a chain of
  up to `chain_len` tokens copied from the context. It reads only those continuations from the
  successor map, never the (context-long) occurrence lists: O(max_n + max_matches x chain_len) per
  call, however often the n-gram occurs.

Edge scores: a continuation token t copied from committed position j gets the target's cached
log-prob of t after position j - 1. When t is outside that cached top-m, it gets the m-th best cached
log-prob (the tightest known upper bound). So every proposed node has a finite score, generated
text is scored by real target log-probs (not 0), and the scale matches the mid drafter's log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

from decoder.core.config import TreeConfig


class NgramIndex:
    """Positions where each n-gram ends and its latest successors, kept up to date on append."""

    def __init__(self, max_n: int = 5) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], list[int]] = {}
        # n-gram -> {successor token: latest end position followed by it}, oldest update first
        self.successors: dict[tuple[int, ...], dict[int, int]] = {}
        self._last_keys: list[tuple[int, ...]] = []  # the n-grams ending at the last position

    def extend(self, tokens: Sequence[int]) -> None:
        toks = self.tokens
        table = self.table
        successors = self.successors
        for t in tokens:
            t = int(t)
            end = len(toks) - 1
            for key in self._last_keys:  # the n-grams ending at `end` are now followed by t
                after = successors.get(key)
                if after is None:
                    successors[key] = {t: end}
                else:
                    after.pop(t, None)  # re-insert: the dict stays ordered by latest end
                    after[t] = end
            toks.append(t)
            end += 1
            keys = [tuple(toks[end - n + 1 : end + 1]) for n in range(1, min(self.max_n, end + 1) + 1)]
            for key in keys:
                hits = table.get(key)
                if hits is None:
                    table[key] = [end]
                else:
                    hits.append(end)
            self._last_keys = keys

    def copy(self) -> NgramIndex:
        """An independent index of the same text: extending either leaves the other as it is."""
        new = NgramIndex(self.max_n)
        new.tokens = list(self.tokens)
        new.table = {key: list(hits) for key, hits in self.table.items()}
        new.successors = {key: dict(after) for key, after in self.successors.items()}
        new._last_keys = list(self._last_keys)
        return new

    def latest_continuations(self, suffix: Sequence[int], limit: int, min_n: int = 1) -> list[int]:
        """End positions of the longest n-gram (n >= min_n) of `suffix`'s tail that has a successor,
        one per distinct successor token, most recent first, at most `limit`: O(max_n + limit)."""
        for n in range(min(self.max_n, len(suffix)), min_n - 1, -1):
            after = self.successors.get(tuple(suffix[-n:]))
            if after:
                return list(islice(reversed(after.values()), limit))
        return []

    def match_length(self, suffix: Sequence[int], min_n: int = 1) -> int:
        """n of the n-gram :meth:`latest_continuations` would continue from (the longest of
        `suffix`'s tail, n >= min_n, with a successor); 0 when none: O(max_n), no positions read."""
        for n in range(min(self.max_n, len(suffix)), min_n - 1, -1):
            if self.successors.get(tuple(suffix[-n:])):
                return n
        return 0

    def longest_match(self, suffix: Sequence[int]) -> list[int]:
        """End positions (ascending) of the longest n-gram of `suffix`'s tail that has a successor."""
        last = len(self.tokens) - 1
        for n in range(min(self.max_n, len(suffix)), 0, -1):
            hits = self.table.get(tuple(suffix[-n:]))
            if hits and (hits[0] < last):
                return hits
        return []


class Rows(Protocol):
    """Top-m rows of consecutive positions from `start` (decoder.core.verify.TopLogps)."""

    start: int
    tokens: list[list[int]]
    logps: list[list[float]]


class RowSource(Protocol):
    """Rows of positions start..start+count-1, computed on demand a block at a time."""

    start: int
    count: int

    def block(self, position: int) -> Rows:
        """The rows of a block of positions that holds `position`."""
        ...


class TargetLogpCache:
    """Target top-m next-token log-probs per committed position, with a per-position floor."""

    def __init__(self) -> None:
        self.entries: list[dict[int, float] | None] = []
        self.floors: list[float] = []
        self._source: RowSource | None = None
        self.blocks_read = 0  # blocks of rows computed by the source so far (each costs an output head)

    def set_source(self, source: RowSource) -> None:
        """Positions source.start.. (with no row yet) take their rows from `source` when first read."""
        self._reserve(source.start + source.count)
        self._source = source

    def set_rows(self, start: int, token_rows: list[list[int]], logp_rows: list[list[float]]) -> None:
        """Store rows for positions start, start+1, ...; earlier positions must already exist."""
        self._reserve(start + len(token_rows))
        for i, (toks, lps) in enumerate(zip(token_rows, logp_rows, strict=True)):
            self.entries[start + i] = dict(zip(toks, lps, strict=True))
            self.floors[start + i] = min(lps)

    def _reserve(self, need: int) -> None:
        """Grow to `need` positions, the new ones without a row."""
        if len(self.entries) < need:
            self.entries.extend([None] * (need - len(self.entries)))
            self.floors.extend([0.0] * (need - len(self.floors)))

    def truncate(self, length: int) -> None:
        del self.entries[length:]
        del self.floors[length:]

    def logp(self, position: int, token: int) -> float:
        entry = self.entries[position]
        src = self._source
        if entry is None and src is not None and src.start <= position < src.start + src.count:
            rows = src.block(position)
            self.blocks_read += 1
            self.set_rows(rows.start, rows.tokens, rows.logps)
            entry = self.entries[position]
        if entry is None:
            raise KeyError(f"no target log-probs cached for position {position}")
        return entry.get(token, self.floors[position])


@dataclass(frozen=True)
class Chain:
    """A proposed continuation: tokens in order and the edge log-prob of each."""

    tokens: tuple[int, ...]
    logps: tuple[float, ...]


class NgramDrafter:
    """Proposes continuation chains for a draft path from the committed context."""

    def __init__(self, max_n: int = 5, max_matches: int = 8, chain_len: int = 4, min_n: int = 1) -> None:
        self.index = NgramIndex(max_n)
        self.cache = TargetLogpCache()
        self.max_matches = max_matches
        self.chain_len = chain_len
        self.min_n = min_n

    @classmethod
    def for_tree(cls, cfg: TreeConfig) -> NgramDrafter:
        """The drafter of a TreeConfig's n-gram settings."""
        return cls(cfg.ngram_max_n, cfg.ngram_max_matches, cfg.ngram_chain_len, cfg.ngram_min_n)

    @property
    def max_n(self) -> int:
        return self.index.max_n

    def fork(self) -> NgramDrafter:
        """A drafter over a copy of the committed text's index, sharing this one's score cache: what
        this drafter proposes now, whatever either commits later."""
        new = NgramDrafter(self.index.max_n, self.max_matches, self.chain_len, self.min_n)
        new.index, new.cache = self.index.copy(), self.cache
        return new

    def commit(self, tokens: Sequence[int]) -> None:
        self.index.extend(tokens)

    def match_length(self, suffix: Sequence[int]) -> int:
        """The n of the match :meth:`propose` would draft from (0: it would draft nothing)."""
        return self.index.match_length(suffix, self.min_n)

    def propose(self, suffix: Sequence[int], limit: int) -> list[Chain]:
        """At most `limit` chains with distinct first tokens, best first-token score first."""
        toks = self.index.tokens
        cache = self.cache
        last = len(toks) - 1
        chains: list[Chain] = []
        for end in self.index.latest_continuations(suffix, self.max_matches, self.min_n):
            stop = min(end + 1 + self.chain_len, last + 1)
            chain = tuple(toks[end + 1 : stop])
            logps = tuple(cache.logp(j - 1, toks[j]) for j in range(end + 1, stop))
            chains.append(Chain(chain, logps))
        chains.sort(key=lambda c: -c.logps[0])
        return chains[:limit]
