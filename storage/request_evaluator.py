"""The request model evaluated over rows handed to it: an in-memory DuckDB at the newest schema.

The request model (client and server spans of one request counted once, attempts, engine facts joined by
replica and time) is DuckDB SQL (storage/request_model/duckdb). A backend whose own engine does not run it
(ClickHouse) copies the rows a read needs into this evaluator and reads the request model here, rather than
keeping a second copy of its rules in another dialect: the same answers as the DuckDB backend's by
construction. Which rows a read needs is the caller's to know; this module knows no other engine.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

import pyarrow as pa

from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.window_source import DuckDBWindowSource
from storage.engine_settling import FACTS
from storage.ports import Window
from storage.span_layout import SPAN_ROWS

# What a caller fills for a use: the stored spans, their scores, engine points and the traffic labels.
LOADED = (SPAN_ROWS, "span_scores", "engine_metrics", "traffic_pattern_labels")
_INSERTED = "_tailwatch_loaded"


class Evaluation(DuckDBWindowSource):
    """One use of the evaluator: rows inserted, then the request model read over them (every read of the
    `WindowSource` port, and `arrow` for a statement of its own)."""

    def insert(self, table: str, rows: pa.Table) -> None:
        """Add `rows` to `table`, by column name."""
        if rows.num_rows == 0:
            return
        self._con.register(_INSERTED, rows)
        try:
            self._con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {_INSERTED}").fetchall()
        finally:
            self._con.unregister(_INSERTED)

    def span_times(self) -> tuple[datetime | None, datetime | None]:
        """The first start and the last end of the spans inserted (None, None without any)."""
        [(first, last)] = self._con.execute("SELECT min(start_time), max(end_time) FROM spans").fetchall()
        return first, last

    def unsettled(self, window: Window) -> bool:
        """Whether a span inserted that ends within the pairing's hour of `window` has no engine facts stored."""
        [(unsettled,)] = self._con.execute(
            "SELECT count(*) FROM spans WHERE engine_settled IS NULL AND end_time >= ? - INTERVAL 1 HOUR "
            "AND end_time < ? + INTERVAL 1 HOUR",
            [window.start, window.end],
        ).fetchall()
        return bool(unsettled)

    def settled(self, window: Window, columns: Sequence[str]) -> pa.Table:
        """The spans inserted that ended in `window`, as `columns` of their stored row with their engine facts
        computed and `engine_settled` set (what settling stores)."""
        facts = {f"engine_{fact}": f"f.{fact}" for fact in FACTS} | {"engine_settled": "true"}
        select = ", ".join(f"{facts.get(c, f's.{c}')} AS {c}" for c in columns)
        return self.arrow(
            f"SELECT {select} FROM span_engine_facts_between(?::TIMESTAMP, ?::TIMESTAMP) AS f "
            f"JOIN {SPAN_ROWS} AS s ON s.rowid = f.row_id",
            [window.start, window.end],
        )


class RequestEvaluator:
    """An in-memory DuckDB migrated to the newest schema, used by one caller at a time."""

    def __init__(self) -> None:
        self._con = open_database(":memory:", memory_limit="2GB", threads=2)
        migrate.upgrade(self._con)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def table_columns(self) -> list[tuple[str, str, str, bool]]:
        """(table, column, DuckDB type, nullable) of every table of the schema, in each table's column order;
        `spans` is stored as SPAN_ROWS."""
        return [
            (table, column, typ, bool(nullable))
            for table, column, typ, nullable in self._con.execute(
                """
                SELECT c.table_name, c.column_name, c.data_type, c.is_nullable
                FROM duckdb_columns() c JOIN duckdb_tables() t USING (table_name)
                WHERE c.database_name = current_database() ORDER BY c.table_name, c.column_index
                """
            ).fetchall()
        ]

    def view_columns(self, view: str) -> list[tuple[str, str, bool]]:
        """(column, DuckDB type, nullable) of a table or view as read (`spans`: every column, `attributes` whole)."""
        rows = self._con.execute(
            "SELECT column_name, data_type, is_nullable FROM duckdb_columns() WHERE table_name = ? "
            "ORDER BY column_index",
            [view],
        ).fetchall()
        return [(name, typ, bool(nullable)) for name, typ, nullable in rows]

    @contextmanager
    def emptied(self) -> Iterator[Evaluation]:
        """The evaluator for one use, with every LOADED table emptied of the use before; others wait."""
        with self._lock:
            for table in LOADED:
                self._con.execute(f"DELETE FROM {table}").fetchall()
            yield Evaluation(self._con)
