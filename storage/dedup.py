"""Recently committed span identities, so a retried export does not store its spans twice.

A unique index on (trace_id, span_id) would be exact forever, but DuckDB's ART index measured 6x the
table's size on disk and cut inserts from ~900k to ~120k rows/s. Retries arrive within an exporter's
retry budget, so the writer remembers the identities it committed in a sliding window instead, keyed
by a 64-bit hash and confirmed against the table before anything is dropped (docs/ingest.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

_SEED = 0x7A11  # fixed, so keys rebuilt from the table after a restart match keys computed at ingest


def _frame(table: pa.Table, columns: list[str]) -> pl.DataFrame:
    frame = pl.from_arrow(table.select(columns))
    if not isinstance(frame, pl.DataFrame):  # a table always gives a DataFrame; this tells the type checker
        raise TypeError(f"polars gave a {type(frame).__name__} for an Arrow table")
    return frame


def _ids(table: pa.Table) -> pl.DataFrame:
    return _frame(table, ["trace_id", "span_id"])


# 64-bit hash of (trace_id, span_id); collisions are resolved against the table before a span is dropped.
_KEY = pl.concat_str("trace_id", "span_id", separator=":").hash(_SEED).alias("key")
_FIRST = pl.struct("trace_id", "span_id").is_first_distinct().alias("first")


def span_keys(table: pa.Table) -> pl.Series:
    """Every row's identity key."""
    return _ids(table).select(_KEY).to_series()


def score_keys(table: pa.Table) -> list[int]:
    """Every score row's identity key (a retried request carries the same span, name, source and time),
    for the window that spares most commits the look-up of stored scores."""
    frame = _frame(table, ["trace_id", "span_id", "name", "source", "observed_at"])
    # In microseconds as stored (TIMESTAMP rounds a batch's nanoseconds to the nearest), so keys rebuilt
    # from the table after a restart match the ones computed at ingest.
    at = pl.col("observed_at")
    unit = table.schema.field("observed_at").type.unit
    micros = (at.cast(pl.Int64) + 500) // 1000 if unit == "ns" else at.dt.cast_time_unit("us").cast(pl.Int64)
    key = pl.concat_str("trace_id", "span_id", "name", "source", micros.cast(pl.String), separator=":")
    keys: list[int] = frame.select(key.hash(_SEED)).to_series().to_list()
    return keys


def first_occurrences(table: pa.Table) -> pl.Series:
    """True for the first row of each (trace_id, span_id) in `table`: a batch may repeat a span."""
    return _ids(table).select(_FIRST).to_series()


@dataclass(frozen=True)
class Identities:
    """A batch's identity keys and which rows are the first of their identity within it."""

    keys: list[int]
    first: list[bool]

    @classmethod
    def of(cls, table: pa.Table) -> Identities:
        both = _ids(table).select(_KEY, _FIRST)
        return cls(both["key"].to_list(), both["first"].to_list())


def first_in_group(batches: list[Identities], combined: pa.Table) -> list[bool]:
    """True for the first row of each (trace_id, span_id) across `batches`, concatenated as `combined`.

    Each batch's own firsts are exact. Two batches can only share a span if they share its key, so when
    no key is kept twice the firsts stand; when one is (a retry queued beside its original, or two spans
    whose keys collide), the exact comparison over the whole group decides."""
    keep = [f for b in batches for f in b.first]
    if len(batches) > 1:
        kept = [k for b in batches for k, f in zip(b.keys, b.first, strict=True) if f]
        if len(set(kept)) < len(kept):
            return first_occurrences(combined).to_list()
    return keep


@dataclass
class _Chunk:
    at: float  # when the chunk was remembered; drives eviction
    since: float  # the oldest ingested_at (epoch s) among its spans; bounds the confirming lookup
    keys: list[int]


class RecentSpans:
    """A bounded set of recently committed span keys, evicted by age and by count."""

    def __init__(self, window_seconds: float, max_spans: int) -> None:
        self.window_seconds = window_seconds
        self.max_spans = max_spans
        self._keys: set[int] = set()
        self._chunks: deque[_Chunk] = deque()

    def __len__(self) -> int:
        return len(self._keys)

    def contains(self, keys: list[int]) -> list[bool]:
        present = self._keys
        return [k in present for k in keys]

    def add(self, keys: list[int], at: float, since: float | None = None) -> None:
        if not keys:
            return
        self._chunks.append(_Chunk(at, at if since is None else since, keys))
        self._keys.update(keys)
        self.evict(at)

    def evict(self, now: float) -> None:
        horizon = now - self.window_seconds
        chunks = self._chunks
        while chunks and (chunks[0].at < horizon or len(self._keys) > self.max_spans):
            self._keys.difference_update(chunks.popleft().keys)

    def oldest_ingest(self) -> float | None:
        """The oldest ingested_at any remembered key can have: where a confirming lookup must start."""
        return min((c.since for c in self._chunks), default=None)

    def covered_seconds(self, now: float) -> float:
        """How far back duplicates are caught right now: less than the window when `max_spans` binds."""
        return 0.0 if not self._chunks else max(0.0, now - self._chunks[0].at)
