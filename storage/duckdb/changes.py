"""The `ChangeStore` port on DuckDB: sightings read on a cursor, changes written through the writer.

A sighting groups by the tracked values themselves, taken out of each span's resource in the statement: a
resource attribute that differs on every span (a request id) costs nothing, only the tracked ones group.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from model.attribute_keys import attribute_key
from storage.duckdb.detector_store import WriteJobs
from storage.duckdb.replaced_rows import replace_rows
from storage.duckdb.window_source import DuckDBWindowSource
from storage.ports import CACHE_CONFIG_METRIC, Change, Sightings
from storage.span_layout import SPAN_ROWS


def sightings_sql(read: Sightings) -> str:
    """Spans and engine metric points of the window, by where, minute and tracked values."""
    keys = [attribute_key(k) for k in read.resource_keys]
    labels = [attribute_key(k) for k in read.cache_labels]

    def resource(key: str) -> str:
        return f"""resource->>'$."{key}"' AS "{key}\""""

    spans = ", ".join(["model AS model", "quantization AS quantization", *map(resource, keys),
                       *(f'NULL::VARCHAR AS "engine.cache.{k}"' for k in labels)])  # fmt: skip
    metrics = ", ".join([
        "model AS model", "NULL::VARCHAR AS quantization", *map(resource, keys),
        *(f"""CASE WHEN name = '{CACHE_CONFIG_METRIC}' THEN attributes->>'$."{k}"' END AS "engine.cache.{k}\""""
          for k in labels),
    ])  # fmt: skip
    return f"""
        SELECT 'spans' AS source, coalesce(deployment, service_name) AS deployment, replica_id,
               date_trunc('minute', end_time) AS minute, min(end_time) AS first_seen, max(end_time) AS last_seen,
               count(*) AS n, {spans}
        FROM {SPAN_ROWS} WHERE end_time >= ? AND end_time < ? AND replica_id IS NOT NULL
        GROUP BY ALL
        UNION ALL BY NAME
        SELECT 'metrics' AS source, deployment, replica_id, date_trunc('minute', "time") AS minute,
               min("time") AS first_seen, max("time") AS last_seen, count(*) AS n, {metrics}
        FROM engine_metrics WHERE "time" >= ? AND "time" < ? AND replica_id IS NOT NULL
        GROUP BY ALL
        LIMIT ?
    """


class DuckDBChangeStore:
    def __init__(self, source: DuckDBWindowSource, writer: WriteJobs) -> None:
        self._source = source
        self._writer = writer

    def sightings(self, read: Sightings) -> pa.Table:
        return self._source.arrow(sightings_sql(read), [*(read.window.start, read.window.end) * 2, read.limit + 1])

    def keep_changes(self, changes: Sequence[Change]) -> None:
        rows = [c.as_row() for c in changes]
        if rows:
            self._writer.submit(lambda con: replace_rows(con, "changes", "change_id", rows)).result()

    def changes(self, *, since: datetime | None = None, until: datetime | None = None, limit: int = 100) -> pa.Table:
        clauses = [(c, v) for c, v in (('"at" >= ?', since), ('"at" < ?', until)) if v is not None]
        where = f"WHERE {' AND '.join(c for c, _ in clauses)}" if clauses else ""
        return self._source.arrow(
            f'SELECT * FROM changes {where} ORDER BY "at" DESC, change_id LIMIT ?',
            [*(v for _, v in clauses), int(limit)],
        )

    def change(self, change_id: str) -> Change | None:
        rows = self._source.arrow("SELECT * FROM changes WHERE change_id = ?", [change_id]).to_pylist()
        return Change.from_row(rows[0]) if rows else None
