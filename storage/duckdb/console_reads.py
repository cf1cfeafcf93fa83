"""The `ConsoleQueries` port on DuckDB: figures over time, detector health and one trace, read-only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import pyarrow as pa

from storage import figure_shape
from storage.duckdb.window_source import DuckDBWindowSource
from storage.ports import TRACE_ENGINE_MARGIN, DetectorHealth, Figures, Window

# Wide JSON the request view does not show; the analyst SQL has them.
_SPAN_COLUMNS = "* EXCLUDE (resource, events, links, ingested_at)"


class DuckDBConsoleQueries:
    def __init__(self, source: DuckDBWindowSource) -> None:
        self._source = source
        self._tables: dict[str, tuple[str, ...]] | None = None

    def _figure_tables(self) -> dict[str, tuple[str, ...]]:
        """Each detector table's columns but evaluated_at. The detectors' tables are the ones their evaluations
        fill, keyed by window and evaluation time (the run log is too, but it is read as detector_health).
        Names a caller gives are checked against these, never pasted blind."""
        if self._tables is None:
            rows = self._source.arrow(
                """
                SELECT table_name, list(column_name ORDER BY column_index) AS columns
                FROM duckdb_columns() WHERE database_name = current_database() AND table_name <> 'detector_runs'
                GROUP BY table_name
                HAVING list_contains(columns, 'window_end') AND list_contains(columns, 'evaluated_at')
                """
            ).to_pylist()
            self._tables = {r["table_name"]: tuple(c for c in r["columns"] if c != "evaluated_at") for r in rows}
        return self._tables

    def figures(
        self,
        detector: str,
        since: datetime,
        until: datetime,
        *,
        limit: int,
        columns: Sequence[str] = (),
        where: Mapping[str, str] | None = None,
        distinct: bool = False,
    ) -> Figures:
        tables = self._figure_tables()
        if detector not in tables:
            raise KeyError(f"no figures for {detector!r}; known: {', '.join(sorted(tables))}")
        known = tables[detector]
        unknown = [c for c in [*columns, *(where or {})] if c not in known]
        if unknown:
            raise ValueError(f"{detector} has no column {unknown[0]!r}; its columns: {', '.join(known)}")
        chosen = ", ".join(f'"{c}"' for c in columns or known)
        select = f"SELECT {'DISTINCT ' if distinct else ''}{chosen}"
        filters = "".join(f' AND "{c}"::VARCHAR = ?' for c in where or {})
        in_range = f'FROM "{detector}" WHERE window_end > ? AND window_end <= ?{filters}'
        params = [since, until, *(where or {}).values()]
        rows = int(self._source.arrow(f"SELECT count(*) FROM ({select} {in_range})", params).column(0)[0].as_py())
        in_range, step = figure_shape.thinned(in_range, rows, limit, "window_end" in (columns or known))
        if step > 1:
            params = [*params, *params]
        # Chosen columns sort by themselves in the order given (window_end first gives a time series); read
        # newest first, so a cap cuts the oldest.
        order = "ALL DESC NULLS FIRST" if columns else "window_end DESC NULLS FIRST, window_start DESC NULLS FIRST"
        table = self._source.arrow(f"{select} {in_range} ORDER BY {order} LIMIT ?", [*params, int(limit)])
        return Figures(figure_shape.oldest_first(table), step, table.num_rows < rows)

    def detector_health(self, as_of: datetime) -> list[DetectorHealth]:
        rows = self._source.arrow(
            """
            SELECT detector,
                   arg_max(ran_at, ran_at) AS last_run,
                   arg_max(outcome, ran_at) AS last_outcome,
                   arg_max(seconds, ran_at) AS last_seconds,
                   arg_max(error, ran_at) AS last_error,
                   count(*) FILTER (outcome <> 'ok' AND ran_at > ?::TIMESTAMP - INTERVAL 1 DAY) AS failures_24h,
                   count(*) FILTER (ran_at > ?::TIMESTAMP - INTERVAL 1 DAY) AS runs_24h
            FROM detector_runs GROUP BY detector ORDER BY detector
            """,
            [as_of, as_of],
        ).to_pylist()
        return [DetectorHealth(**r) for r in rows]

    def trace(self, trace_id: str, around: Window | None = None) -> dict[str, pa.Table]:
        bound, params = ("AND end_time >= ? AND end_time < ?", [around.start, around.end]) if around else ("", [])
        spans = self._source.arrow(
            f"SELECT {_SPAN_COLUMNS} FROM spans WHERE trace_id = ? {bound} ORDER BY start_time, span_id",
            [trace_id, *params],
        )
        if spans.num_rows == 0:
            return {"spans": spans}
        ends = spans.column("end_time").to_pylist()
        starts = spans.column("start_time").to_pylist()
        # The request model over exactly the trace's span ends: a narrow window, so the join is cheap.
        window = Window(min(ends), max(ends) + timedelta(microseconds=1))
        requests = self._source.arrow(
            "SELECT * FROM llm_requests_between(?::TIMESTAMP, ?::TIMESTAMP) WHERE trace_id = ? ORDER BY start_time",
            [window.start, window.end, trace_id],
        )
        scores = self._source.arrow(
            "SELECT span_id, name, score, label, explanation, source, observed_at FROM span_scores "
            "WHERE trace_id = ? ORDER BY observed_at, name",
            [trace_id],
        )
        replicas = sorted({r for r in spans.column("replica_id").to_pylist() if r is not None})
        replicas += [r for r in requests.column("replica_id").to_pylist() if r is not None and r not in replicas]
        engine = self._source.arrow(
            "SELECT time, replica_id, name, metric, kind, value, interval_s FROM engine_metrics "
            "WHERE replica_id IN (SELECT unnest(?::VARCHAR[])) AND time >= ? AND time <= ? ORDER BY name, time",
            [replicas, min(starts) - TRACE_ENGINE_MARGIN, max(ends) + TRACE_ENGINE_MARGIN],
        )
        return {"spans": spans, "requests": requests, "scores": scores, "engine": engine}
