"""The `AlertQueries` port on DuckDB: the API's alert and cluster listings, newest first, read-only."""

from __future__ import annotations

import pyarrow as pa

from storage.duckdb.window_source import DuckDBWindowSource


class DuckDBAlertQueries:
    def __init__(self, source: DuckDBWindowSource) -> None:
        self._source = source

    def alerts(self, *, state: str | None = None, detector: str | None = None, limit: int = 100) -> pa.Table:
        clauses = [
            (f"{name} = ?", value) for name, value in (("state", state), ("detector", detector)) if value is not None
        ]
        where = f"WHERE {' AND '.join(c for c, _ in clauses)}" if clauses else ""
        return self._source.arrow(
            f"SELECT * FROM alerts {where} ORDER BY updated_at DESC, alert_id LIMIT ?",
            [*(v for _, v in clauses), int(limit)],
        )

    def clusters(self, *, detector: str | None = None, limit: int = 50) -> pa.Table:
        where, params = ("WHERE detector = ?", [detector]) if detector is not None else ("", [])
        return self._source.arrow(
            f"SELECT * EXCLUDE (evaluated_at) FROM clusters {where} ORDER BY window_end DESC, rank LIMIT ?",
            [*params, int(limit)],
        )
