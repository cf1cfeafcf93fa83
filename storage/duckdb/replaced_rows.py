"""Rows kept in place by their id (incidents, changes): a row found again replaces the one stored."""

from __future__ import annotations

import duckdb
import pyarrow as pa


def replace_rows(con: duckdb.DuckDBPyConnection, table: str, key: str, rows: list[dict[str, object]]) -> None:
    """Delete the stored rows of these ids and insert these, in the writer's transaction."""
    columns = ", ".join(f'"{c}"' for c in rows[0])
    con.execute(f"DELETE FROM {table} WHERE list_contains(?, {key})", [[r[key] for r in rows]])
    view = f"_tailwatch_{table}"
    con.register(view, pa.Table.from_pylist(rows))
    try:
        con.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {view}")
    finally:
        con.unregister(view)
