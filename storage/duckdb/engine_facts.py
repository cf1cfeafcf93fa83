"""Settling engine facts: each LLM span's engine facts computed once and stored beside it.

A span is settled once its end is older than the horizon the caller gives and its own replica's metrics
source has reported past it (or, after a bounded wait, with what exists; `span_engine_facts_between` in the
request model decides which spans are ready), so a Collector that fell behind holds back only its own
replicas' requests instead of having them settled with facts missing. Spans stored late settle at the next
call. Points that arrive after a span settled do not change it (docs/engine-metrics.md).
"""

from __future__ import annotations

from datetime import datetime
from functools import partial

import duckdb

from storage.duckdb.writer import Writer
from storage.engine_settling import CHUNK, FACTS
from storage.span_layout import SPAN_ROWS

_UPDATE = f"""
    UPDATE {SPAN_ROWS} SET engine_settled = true, {", ".join(f"engine_{fact} = f.{fact}" for fact in FACTS)}
    FROM span_engine_facts_between($lo, $hi) AS f
    WHERE {SPAN_ROWS}.rowid = f.row_id
"""


def horizon(con: duckdb.DuckDBPyConnection, until: datetime) -> datetime | None:
    """How far spans can settle: `until`, held back to the newest engine point of any source (no span ending
    later has a source past its end); None without any."""
    newest = con.execute("SELECT max(time) FROM engine_metrics").fetchone()
    if newest is None or newest[0] is None:
        return None
    latest: datetime = newest[0]
    return min(until, latest)


def next_chunk(
    con: duckdb.DuckDBPyConnection, until: datetime, after: datetime | None
) -> tuple[datetime, datetime] | None:
    """The next range of end times, from `after` on, holding unsettled LLM spans, at most CHUNK long; None when
    none is left. Spans still waiting for their source stay behind, so the ranges move on past them."""
    limit = horizon(con, until)
    if limit is None:
        return None
    row = con.execute(
        "SELECT min(end_time) FROM spans WHERE is_llm AND engine_settled IS NULL "
        "AND end_time >= coalesce(?::TIMESTAMP, '-infinity'::TIMESTAMP) AND end_time < ?",
        [after, limit],
    ).fetchone()
    if row is None or row[0] is None:
        return None
    low: datetime = row[0]
    return low, min(limit, low + CHUNK)


def settle_chunk(con: duckdb.DuckDBPyConnection, low: datetime, high: datetime) -> int:
    """Store the engine facts of the unsettled LLM spans that ended in [low, high) and are ready; returns how
    many."""
    row = con.execute(_UPDATE, {"lo": low, "hi": high}).fetchone()
    return int(row[0]) if row else 0


class DuckDBEngineFacts:
    """The `EngineFacts` port: every chunk is one job on the writer, so ingest commits between them."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    def settle(self, until: datetime) -> int:
        settled = 0
        after: datetime | None = None
        while True:
            chunk = self._writer.submit(partial(next_chunk, until=until, after=after)).result()
            if chunk is None:
                return settled
            low, high = chunk
            settled += self._writer.submit(partial(settle_chunk, low=low, high=high)).result()
            after = high
