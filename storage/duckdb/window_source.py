"""The `WindowSource` port on DuckDB: the reads detectors declare, each one statement over the request model.

Every read runs on a fresh cursor of the service's connection, so concurrent readers never share a
result; none of them writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from model.columns import ENGINE_FLEET, ENGINE_REPLICA
from storage import left_out
from storage.grouping_sets import grouping_sql
from storage.ports import Aggregate, FrameBudget, Measure, Requests, RequestSummary, Scores, SloCounts, Window
from storage.quoted_names import column_name

# DuckDB computes the key each frame carries: one 64-bit integer per request instead of two strings.
_KEY = "hash(trace_id, span_id) AS request_key"
_IDS = "trace_id, span_id"
_BATCH_ROWS = 1 << 20


def _text(field: pa.Field) -> bool:
    return bool(pa.types.is_string(field.type) or pa.types.is_large_string(field.type))


def _dictionary_schema(schema: pa.Schema, keep: tuple[str, ...]) -> pa.Schema:
    return pa.schema(
        [pa.field(f.name, pa.dictionary(pa.int32(), f.type)) if _text(f) and f.name not in keep else f for f in schema]
    )


def _dictionary(batch: pa.RecordBatch, keep: tuple[str, ...]) -> pa.RecordBatch:
    # The columns not encoded are copied too: a batch DuckDB hands over is freed only when none of its
    # buffers is referenced, so keeping one of its numeric columns kept all of its text alive as well
    # (about 600 MiB more at the peak of a clustering pass over a day of 10 million requests). Copied
    # with the system allocator, which reuses what DuckDB freed of the batch before: Arrow's default
    # pool took fresh pages for every copy, and faulting them in cost seconds over such a day.
    pool = pa.system_memory_pool()
    return pa.RecordBatch.from_arrays(
        [
            pc.dictionary_encode(column, memory_pool=pool)
            if _text(field) and field.name not in keep
            else pa.concat_arrays([column], memory_pool=pool)
            for field, column in zip(batch.schema, batch.columns, strict=True)
        ],
        names=batch.schema.names,
    )


def _not_null(columns: Iterable[str]) -> str:
    """A WHERE clause over column expressions already checked by `column_name`."""
    terms = [f"{c} IS NOT NULL" for c in columns]
    return f" WHERE {' AND '.join(terms)}" if terms else ""


_MACROS = {
    (False, False): "llm_span_requests_between",
    (True, False): "llm_requests_fleet_between",
    (False, True): "llm_requests_replica_between",
    (True, True): "llm_requests_between",
}


# Where in a window the live join starts to be needed: the earliest end of an LLM span not yet settled,
# when engine points are in reach (the join's two-hour margin); NULL when no request of it needs the join.
_LIVE_FROM = """
    SELECT CASE WHEN EXISTS (SELECT 1 FROM engine_metrics
                             WHERE time >= ?::TIMESTAMP - INTERVAL 2 HOUR AND time < ?::TIMESTAMP + INTERVAL 2 HOUR)
           THEN (SELECT min(end_time) FROM spans
                 WHERE is_llm AND engine_settled IS NULL AND end_time >= ?::TIMESTAMP AND end_time < ?::TIMESTAMP)
           END
"""


def _measure(m: Measure) -> str:
    if m.aggregate is Aggregate.COUNT:
        value = "count(*)"
    elif m.aggregate is Aggregate.MEAN:
        value = f"avg({column_name(str(m.column))})"
    else:
        value = f"quantile_cont({column_name(str(m.column))}, {float(m.q or 0)!r})"
    return f"{value} AS {column_name(m.name)}"


class DuckDBWindowSource:
    """The `WindowSource` port: each declared read as one statement over the curated macros."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def arrow(self, sql: str, params: Sequence[Any] = (), budget: FrameBudget | None = None) -> pa.Table:
        if budget is not None:
            return self._batched(sql, params, budget)
        cur = self._con.cursor()
        try:
            return cur.sql(sql, params=list(params)).to_arrow_table()
        finally:
            cur.close()

    def _batched(
        self, sql: str, params: Sequence[Any], budget: FrameBudget | None, keep: tuple[str, ...] | None = None
    ) -> pa.Table:
        """The result batch by batch as DuckDB produces it, each charged to the budget, and with `keep`
        its text columns other than those dictionary-encoded: the text of a whole window never exists."""
        cur = self._con.cursor()
        try:
            reader = cur.sql(sql, params=list(params)).to_arrow_reader(_BATCH_ROWS)
            schema = reader.schema if keep is None else _dictionary_schema(reader.schema, keep)
            batches = []
            for batch in reader:
                encoded = batch if keep is None else _dictionary(batch, keep)
                if budget is not None:
                    budget.charge(encoded.nbytes)
                batches.append(encoded)
            return pa.Table.from_batches(batches, schema=schema)
        finally:
            cur.close()

    def _model(self, needed: Iterable[str | None], window: Window) -> tuple[str, list[Any]]:
        """The request model a read needs over the window, as a FROM item and its parameters: the spans'
        alone when it asks for no engine column; else the settled model (no join) up to where the live join
        starts to be needed, and the narrowest joined one from there. A request's row falls in the part its
        end time does, and every request ending before the first unsettled span is settled: the same rows
        and values as the joined model over the whole window, at the cost of a join over its last minutes."""
        wanted = {c for c in needed if c is not None}
        engine = (not wanted.isdisjoint(ENGINE_FLEET), not wanted.isdisjoint(ENGINE_REPLICA))
        start, end = window.start, window.end
        if not any(engine):
            return "llm_span_requests_between(?::TIMESTAMP, ?::TIMESTAMP)", [start, end]
        live_from = self.arrow(_LIVE_FROM, [start, end, start, end]).column(0)[0].as_py()
        if live_from is None:
            return "llm_requests_settled_between(?::TIMESTAMP, ?::TIMESTAMP)", [start, end]
        joined = _MACROS[engine]
        if live_from <= start:
            return f"{joined}(?::TIMESTAMP, ?::TIMESTAMP)", [start, end]
        columns = ", ".join(column_name(c) for c in sorted(wanted))
        return (
            f"(SELECT {columns} FROM llm_requests_settled_between(?::TIMESTAMP, ?::TIMESTAMP) "
            f"UNION ALL SELECT {columns} FROM {joined}(?::TIMESTAMP, ?::TIMESTAMP))",
            [start, live_from, live_from, end],
        )

    def requests(self, read: Requests, budget: FrameBudget | None = None) -> pa.Table:
        columns = ["hash(r.trace_id, r.span_id) AS request_key"]
        columns += ["r.trace_id", "r.span_id"] if read.ids else []
        columns += [f"r.{column_name(c)}" for c in read.columns]
        # The traffic labels were stored per replica_count, which the join may have filled.
        traffic = ("deployment", "start_time", "replica_count") if read.traffic_pattern else ()
        model, params = self._model(("trace_id", "span_id", *read.columns, *read.require, *traffic), read.window)
        source = f"{model} AS r"
        if read.traffic_pattern:
            # The stored labels are one row per (deployment, arrival second, replica_count) of a window:
            # joined here, where the data is, instead of shipping both sides to the detector.
            columns.append("l.pattern AS traffic_pattern")
            source += """
                LEFT JOIN traffic_pattern_labels AS l
                  ON l.window_start = ? AND l.window_end = ?
                 AND l.deployment IS NOT DISTINCT FROM r.deployment
                 AND l.arrival_second = date_trunc('second', r.start_time)
                 AND l.replica_count IS NOT DISTINCT FROM r.replica_count"""
            params += [read.window.start, read.window.end]
        sql = f"SELECT {', '.join(columns)} FROM {source}" + _not_null(f"r.{column_name(c)}" for c in read.require)
        if not read.categorical:
            return self.arrow(sql, params, budget)
        return self._batched(sql, params, budget, keep=("trace_id", "span_id"))

    def scores(self, read: Scores, budget: FrameBudget | None = None) -> pa.Table:
        ids = f"{_IDS}, " if read.ids else ""
        return self.arrow(
            f"SELECT {ids}{_KEY}, name, score FROM llm_request_scores_between(?::TIMESTAMP, ?::TIMESTAMP) "
            "WHERE score IS NOT NULL",
            (read.window.start, read.window.end),
            budget,
        )

    def request_summary(self, read: RequestSummary) -> pa.Table:
        g = grouping_sql(read, column_name)
        grouped, names, which, sets = g.columns, g.names, g.which, g.sets
        read = self.left_out(read)
        needed = [*grouped, *read.require, *(m.column for m in read.measures), *left_out.columns(read)]
        model, params = self._model(needed, read.window)

        def param(value: object) -> str:
            params.append(value)
            return "?"

        where = _not_null(map(column_name, read.require))
        leave = left_out.predicate(read.leave_out, param) if read.leave_out is not None else ""
        if leave:
            where = f"{where} AND {leave}" if where else f" WHERE {leave}"
        return self.arrow(
            f"SELECT {names + ', ' if grouped else ''}{which}::INTEGER AS grouping_set, "
            f"{', '.join(map(_measure, read.measures))} "
            f"FROM {model}{where}" + (f" GROUP BY GROUPING SETS ({sets})" if grouped else ""),
            params,
        )

    def left_out(self, read: RequestSummary) -> RequestSummary:
        """The read with the breached windows it leaves out read from their detector's figures."""
        if read.leave_out is None or read.leave_out.ranges is not None:
            return read
        sql = left_out.breached_sql(read.leave_out, "?::TIMESTAMP", "?::TIMESTAMP")
        return left_out.resolved(read, self.arrow(sql, [read.window.end, read.window.start]))

    def firing_alerts(self) -> pa.Table:
        return self.arrow(
            "SELECT alert_id, detector, labels, started_at FROM alerts WHERE state = 'firing' ORDER BY alert_id"
        )

    def first_span_end(self, since: datetime) -> datetime | None:
        rows = self.arrow("SELECT min(end_time) FROM spans WHERE end_time >= ?", [since])
        first: datetime | None = rows.column(0)[0].as_py()
        return first

    def slo_counts(self, read: SloCounts) -> pa.Table:
        if not read.windows:
            raise ValueError("SloCounts needs at least one trailing window")
        # Each stored minute is counted once (the writer replaces a recounted minute), so a window is a sum;
        # one aggregate per window lets the shorter ones skip the older row groups by their min-max stats.
        one = """
            SELECT slo, tenant_id, deployment, model, {seconds}::BIGINT AS window_seconds,
                   sum(good)::BIGINT AS good, sum(total)::BIGINT AS total,
                   count(*) FILTER (WHERE good_slice)::BIGINT AS good_slices, count(*)::BIGINT AS slices
            FROM slo_burn_minutes WHERE minute >= ?::TIMESTAMP - to_seconds({seconds}) AND minute < ?::TIMESTAMP
            GROUP BY ALL
        """
        seconds = [int(s) for s in read.windows]
        sql = " UNION ALL ".join(one.format(seconds=s) for s in seconds)
        return self.arrow(sql, tuple(v for _ in seconds for v in (read.end, read.before)))
