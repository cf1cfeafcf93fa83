"""The `ChangeStore` port on ClickHouse: the sightings statement in its dialect, changes as replaced rows by id."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from model.attribute_keys import attribute_key
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.schema import Column, versioned
from storage.clickhouse.stores import fit
from storage.ports import CACHE_CONFIG_METRIC, Change, Sightings


def sightings_sql(read: Sightings) -> str:
    """As on DuckDB (storage/duckdb/changes.py): by where, minute and tracked values, tracked values only."""
    keys = [attribute_key(k) for k in read.resource_keys]
    labels = [attribute_key(k) for k in read.cache_labels]

    def resource(key: str) -> str:
        return f"nullIf(JSONExtractString(ifNull(resource, '{{}}'), '{key}'), '') AS `{key}`"

    spans = ", ".join(["model AS model", "quantization AS quantization", *map(resource, keys),
                       *(f"CAST(NULL, 'Nullable(String)') AS `engine.cache.{k}`" for k in labels)])  # fmt: skip
    metrics = ", ".join([
        "model AS model", "CAST(NULL, 'Nullable(String)') AS quantization", *map(resource, keys),
        *(f"if(name = '{CACHE_CONFIG_METRIC}', nullIf(JSONExtractString(ifNull(attributes, '{{}}'), '{k}'), ''), "
          f"NULL) AS `engine.cache.{k}`" for k in labels),
    ])  # fmt: skip
    between = "{{start:DateTime64(6)}} AND {col} < {{end:DateTime64(6)}}"
    return f"""
        SELECT * FROM (
            SELECT 'spans' AS source, coalesce(deployment, service_name) AS deployment, replica_id,
                   toDateTime64(toStartOfMinute(end_time), 6) AS minute, min(end_time) AS first_seen,
                   max(end_time) AS last_seen, toInt64(count()) AS n, {spans}
            FROM spans WHERE end_time >= {between.format(col="end_time")} AND replica_id IS NOT NULL
            GROUP BY ALL
            UNION ALL
            SELECT 'metrics' AS source, deployment, replica_id, toDateTime64(toStartOfMinute(time), 6) AS minute,
                   min(time) AS first_seen, max(time) AS last_seen, toInt64(count()) AS n, {metrics}
            FROM engine_metrics WHERE time >= {between.format(col="time")} AND replica_id IS NOT NULL
            GROUP BY ALL
        ) LIMIT {{limit:UInt64}}
    """


class ClickHouseChangeStore:
    def __init__(self, client: ClickHouse, tables: dict[str, list[Column]]) -> None:
        self._client = client
        self._tables = tables

    def sightings(self, read: Sightings) -> pa.Table:
        return self._client.arrow(
            sightings_sql(read), {"start": read.window.start, "end": read.window.end, "limit": read.limit + 1}
        )

    def keep_changes(self, changes: Sequence[Change]) -> None:
        if changes:
            rows = pa.Table.from_pylist([c.as_row() for c in changes])
            self._client.insert("changes", versioned(fit(rows, self._tables["changes"], "changes")), replacing=True)

    def changes(self, *, since: datetime | None = None, until: datetime | None = None, limit: int = 100) -> pa.Table:
        clauses: list[str] = []
        params: dict[str, object] = {"limit": int(limit)}
        for clause, name, value in (("at >= {since:DateTime64(6)}", "since", since),
                                    ("at < {until:DateTime64(6)}", "until", until)):  # fmt: skip
            if value is not None:
                clauses.append(clause)
                params[name] = value
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return self._client.arrow(
            f"SELECT {self._names} FROM changes {where} ORDER BY at DESC, change_id LIMIT {{limit:UInt64}}", params
        )

    def change(self, change_id: str) -> Change | None:
        rows = self._client.arrow(
            f"SELECT {self._names} FROM changes WHERE change_id = {{i:String}}", {"i": change_id}
        ).to_pylist()
        return Change.from_row(rows[0]) if rows else None

    @property
    def _names(self) -> str:
        return ", ".join(f"`{c.name}`" for c in self._tables["changes"])
