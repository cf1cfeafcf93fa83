"""The `StoreReader` port on DuckDB: read statements for everything that is not the writer, on cursors of the
service's database, never writes."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa


class Reader:
    """Runs read queries on a fresh cursor each time, so concurrent readers never share a result."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self._con

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        cur = self._con.cursor()
        try:
            return cur.execute(sql, params or []).fetchall()
        finally:
            cur.close()

    def arrow(self, sql: str, params: list[Any] | None = None) -> pa.Table:
        cur = self._con.cursor()
        try:
            return cur.sql(sql, params=params or []).to_arrow_table()
        finally:
            cur.close()
