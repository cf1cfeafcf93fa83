"""The request model over ClickHouse: the same SQL as the DuckDB backend's, run on the rows a read needs.

The request model (client and server spans of one request counted once, attempts, engine facts joined by
replica and time) is a set of DuckDB views and table macros (storage/request_model/duckdb). Rather than a
second copy of those rules in ClickHouse's dialect, a read on ClickHouse copies the rows it needs into an
in-memory DuckDB migrated to the same schema and asks the DuckDB window source there: the same answers by
construction (the conformance suite holds both backends to it). ClickHouse does the selective part, the
window's spans by the sorting key and the other spans of the same traces; the pairing runs on those alone.

What a read needs: the LLM spans of the traces with a span ending in the window, from up to an hour
either side (the request model's pairing reach); their scores; engine points from two hours before the
first to two hours after the last (the engine join's reach), only when the read asks for an engine column
and a span of the window is not settled yet; and the traffic labels stored for the window.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow as pa

from model.columns import ENGINE_JOINED
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.schema import SPAN_JSON_COLUMNS, Column, clickhouse_type, tables_of
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.engine_facts import FACTS
from storage.duckdb.reads import DuckDBWindowSource
from storage.duckdb.stored_attributes import SPAN_ROWS, STORED_ONLY
from storage.ports import Window
from storage.request_model.clickhouse import span_level_columns

PAIRING_REACH = timedelta(hours=1)
ENGINE_REACH = timedelta(hours=2)
_LOADED = (SPAN_ROWS, "span_scores", "engine_metrics", "traffic_pattern_labels")


@dataclass(frozen=True)
class Needs:
    """What one read needs loaded besides the window's spans."""

    window: Window
    engine: bool = False
    scores: bool = False
    labels: bool = False
    trace_id: str | None = None  # only this trace's spans (the console's trace view)
    # The request-model columns the read asks for; None: all of them. Every other column of `spans` is loaded
    # as NULL: each output column of the request model depends on its own span column and the pairing keys.
    columns: frozenset[str] | None = None


# What pairing, the engine join and the NOT NULL columns read, whatever the read asks for.
_ALWAYS = frozenset(
    {"trace_id", "span_id", "llm_role", "is_llm", "name", "kind", "start_time", "end_time", "duration_ms",
     "status_code", "ingested_at", "engine_settled", "replica_id", "deployment"}
)  # fmt: skip


def needs_engine(columns: tuple[str | None, ...] | list[str | None]) -> bool:
    return any(c in ENGINE_JOINED for c in columns)


def span_columns(asked: Iterable[str | None]) -> frozenset[str]:
    """The `spans` columns a read of these request-model columns depends on."""
    wanted = [c for c in asked if c is not None]
    return _ALWAYS | set(wanted) | set(span_level_columns(wanted))


class Evaluator:
    """An in-memory DuckDB at the migrations' head, loaded per read under one lock."""

    def __init__(self) -> None:
        self._con = open_database(":memory:", memory_limit="2GB", threads=2)
        migrate.upgrade(self._con)
        self.tables = tables_of(self._con)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def span_columns_with_json(self) -> list[Column]:
        """Every column of `spans`, the JSON ones too (what the ingest table takes), but how DuckDB stores
        `attributes`: ClickHouse is sent the attributes whole."""
        rows = self._con.execute(
            "SELECT column_name, data_type, is_nullable FROM duckdb_columns() WHERE table_name = 'spans' "
            "ORDER BY column_index"
        ).fetchall()
        return [Column(name, clickhouse_type(typ, nullable)) for name, typ, nullable in rows if name not in STORED_ONLY]

    def _select(self, table: str) -> str:
        return ", ".join(f"`{c.name}`" for c in self.tables[table])

    @contextmanager
    def loaded(self, client: ClickHouse, needs: Needs) -> Iterator[DuckDBWindowSource]:
        with self._lock:
            con = self._con
            for table in _LOADED:
                con.execute(f"DELETE FROM {table}").fetchall()
            self._load(client, needs)
            yield DuckDBWindowSource(con)

    def _insert(self, table: str, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        self._con.register("_tailwatch_loaded", rows)
        try:
            self._con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _tailwatch_loaded").fetchall()
        finally:
            self._con.unregister("_tailwatch_loaded")

    def _load(self, client: ClickHouse, needs: Needs) -> None:
        w = needs.window
        in_window = "is_llm AND end_time >= {s:DateTime64(6)} AND end_time < {e:DateTime64(6)}"
        if needs.trace_id is not None:
            in_window += " AND trace_id = {t:String}"
        params = {"s": w.start, "e": w.end, "lo": w.start - PAIRING_REACH, "hi": w.end + PAIRING_REACH,
                  "t": needs.trace_id}  # fmt: skip
        traces = f"SELECT trace_id FROM spans WHERE {in_window}"
        # A short window's requests pair with spans up to an hour away: only those of its traces are loaded. A
        # long window (a day's baseline) holds most of that reach already, and the set of its traces would cost
        # more than the few extra spans.
        of_traces = needs.trace_id is not None or w.end - w.start < 2 * PAIRING_REACH
        columns = [c for c in self.tables["spans"] if needs.columns is None or c.name in needs.columns]
        spans = client.arrow(
            f"SELECT {', '.join(f'`{c.name}`' for c in columns)} FROM spans "
            "WHERE is_llm AND end_time >= {lo:DateTime64(6)} AND end_time < {hi:DateTime64(6)}"
            + (f" AND trace_id IN ({traces})" if of_traces else ""),
            params,
        )
        self._insert(SPAN_ROWS, spans.drop_columns([c for c in SPAN_JSON_COLUMNS if c in spans.column_names]))
        if spans.num_rows == 0:
            return
        if needs.scores:
            self._insert(
                "span_scores",
                client.arrow(f"SELECT {self._select('span_scores')} FROM span_scores WHERE trace_id IN ({traces})",
                             params),
            )  # fmt: skip
        if needs.labels:
            self._insert(
                "traffic_pattern_labels",
                client.arrow(
                    f"SELECT {self._select('traffic_pattern_labels')} FROM traffic_pattern_labels "
                    "WHERE window_start = {s:DateTime64(6)} AND window_end = {e:DateTime64(6)}",
                    params,
                ),
            )
        if needs.engine and self._unsettled(w):
            self._load_engine(client)

    def _load_engine(self, client: ClickHouse) -> None:
        """The engine points the join can reach from the loaded spans."""
        [(lo, hi)] = self._con.execute("SELECT min(start_time), max(end_time) FROM spans").fetchall()
        reach = ENGINE_REACH + PAIRING_REACH
        self._insert(
            "engine_metrics",
            client.arrow(
                f"SELECT {self._select('engine_metrics')} FROM engine_metrics "
                "WHERE time >= {lo:DateTime64(6)} AND time < {hi:DateTime64(6)}",
                {"lo": _minus(lo, reach), "hi": _plus(hi, reach)},
            ),
        )

    def settle(self, client: ClickHouse, window: Window) -> pa.Table:
        """The unsettled LLM spans that ended in `window` as `spans` rows with their engine facts stored."""
        with self._lock:
            con = self._con
            for table in _LOADED:
                con.execute(f"DELETE FROM {table}").fetchall()
            params = {"s": window.start, "e": window.end}
            spans = client.arrow(
                f"SELECT {self._select('spans')} FROM spans WHERE is_llm AND engine_settled IS NULL "
                "AND end_time >= {s:DateTime64(6)} AND end_time < {e:DateTime64(6)}",
                params,
            )
            self._insert(SPAN_ROWS, spans)
            self._load_engine(client)
            cur = con.cursor()
            try:
                return cur.sql(_settle_sql(self.tables["spans"]), params=[window.start, window.end]).to_arrow_table()
            finally:
                cur.close()

    def _unsettled(self, w: Window) -> bool:
        [(unsettled,)] = self._con.execute(
            "SELECT count(*) FROM spans WHERE engine_settled IS NULL AND end_time >= ? - INTERVAL 1 HOUR "
            "AND end_time < ? + INTERVAL 1 HOUR",
            [w.start, w.end],
        ).fetchall()
        return bool(unsettled)


def _minus(t: datetime | None, d: timedelta) -> datetime:
    return (t or datetime(1970, 1, 1)) - d


def _plus(t: datetime | None, d: timedelta) -> datetime:
    return (t or datetime(1970, 1, 1)) + d


def _settle_sql(columns: list[Column]) -> str:
    facts = {f"engine_{fact}": f"f.{fact}" for fact in FACTS} | {"engine_settled": "true"}
    select = ", ".join(f"{facts.get(c.name, f's.{c.name}')} AS {c.name}" for c in columns)
    return (
        f"SELECT {select} FROM span_engine_facts_between(?::TIMESTAMP, ?::TIMESTAMP) AS f "
        f"JOIN {SPAN_ROWS} AS s ON s.rowid = f.row_id"
    )
