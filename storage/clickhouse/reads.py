"""The read ports on ClickHouse.

Reads of the request model (requests, scores, request summaries, a trace's requests) go through the
evaluator, which runs the DuckDB backend's own request-model SQL over the rows ClickHouse selects; reads
of what Tailwatch stored itself (alerts, clusters, figures, the run log, SLO minutes) run in ClickHouse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import pyarrow as pa

from storage import figure_shape, left_out
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.evaluator import Evaluator, Needs, needs_engine, span_columns
from storage.clickhouse.schema import LAYOUTS, Column
from storage.ports import (
    TRACE_ENGINE_MARGIN,
    DetectorHealth,
    Figures,
    FrameBudget,
    Requests,
    RequestSummary,
    Scores,
    SloCounts,
    Window,
)
from storage.request_model.clickhouse import interpolate, summary_sql


def _names(columns: Sequence[Column], skip: tuple[str, ...] = ()) -> str:
    return ", ".join(f"`{c.name}`" for c in columns if c.name not in skip)


class ClickHouseWindowSource:
    def __init__(self, client: ClickHouse, evaluator: Evaluator) -> None:
        self._client = client
        self._evaluator = evaluator

    def _needs(self, window: Window, used: list[str | None], *, scores: bool = False, labels: bool = False) -> Needs:
        # A live engine join (an engine column asked for, engine points in reach and a span of the window not
        # settled yet: the DuckDB source's own test) reads every fact of the spans; any other read, settled
        # facts included, only the columns it names.
        engine = needs_engine(used) and self._live(window)
        return Needs(
            window, engine=engine, columns=None if engine else span_columns(used), scores=scores, labels=labels
        )

    def _live(self, window: Window) -> bool:
        return bool(
            int(
                self._client.command(
                    # Whether one row exists, not how many: each stops at the first.
                    "SELECT (SELECT count() FROM (SELECT 1 FROM engine_metrics WHERE time >= {s:DateTime64(6)} - "
                    "INTERVAL 2 HOUR AND time < {e:DateTime64(6)} + INTERVAL 2 HOUR LIMIT 1)) > 0 "
                    "AND (SELECT count() FROM (SELECT 1 FROM spans WHERE is_llm AND engine_settled IS NULL "
                    "AND end_time >= {s:DateTime64(6)} AND end_time < {e:DateTime64(6)} LIMIT 1)) > 0",
                    {"s": window.start, "e": window.end},
                )
            )
        )

    def requests(self, read: Requests, budget: FrameBudget | None = None) -> pa.Table:
        traffic = ["deployment", "start_time", "replica_count"] if read.traffic_pattern else []
        needs = self._needs(read.window, [*read.columns, *read.require, *traffic], labels=read.traffic_pattern)
        with self._evaluator.loaded(self._client, needs) as source:
            return source.requests(read, budget)

    def scores(self, read: Scores, budget: FrameBudget | None = None) -> pa.Table:
        with self._evaluator.loaded(self._client, self._needs(read.window, [], scores=True)) as source:
            return source.scores(read, budget)

    def request_summary(self, read: RequestSummary) -> pa.Table:
        read = self._left_out(read)  # read here: a loaded evaluation has no figures tables
        used = [c for s in read.grouping_sets for c in s] + [*read.require] + [m.column for m in read.measures]
        needs = self._needs(read.window, [*used, *left_out.columns(read)])
        if needs.engine:
            with self._evaluator.loaded(self._client, needs) as source:
                return source.request_summary(read)
        # Where the data is: a day of requests becomes one row per group inside ClickHouse.
        params: dict[str, object] = {"t0": read.window.start, "t1": read.window.end}
        stats = self._client.arrow(summary_sql(read, params), params)
        return interpolate(stats, read.measures)

    def _left_out(self, read: RequestSummary) -> RequestSummary:
        if read.leave_out is None or read.leave_out.ranges is not None:
            return read
        sql = left_out.breached_sql(read.leave_out, "{s:DateTime64(6)}", "{e:DateTime64(6)}")
        return left_out.resolved(read, self._client.arrow(sql, {"s": read.window.start, "e": read.window.end}))

    def firing_alerts(self) -> pa.Table:
        return self._client.arrow(
            "SELECT alert_id, detector, labels, started_at FROM alerts WHERE state = 'firing' ORDER BY alert_id"
        )

    def first_span_end(self, since: datetime) -> datetime | None:
        # minOrNull: min of no rows is the type's default (1970), which would look like data.
        first: datetime | None = self._client.arrow(
            "SELECT minOrNull(end_time) FROM spans WHERE end_time >= {since:DateTime64(6)}", {"since": since}
        )[0][0].as_py()
        return first

    def slo_counts(self, read: SloCounts) -> pa.Table:
        if not read.windows:
            raise ValueError("SloCounts needs at least one trailing window")
        one = """
            SELECT slo, tenant_id, deployment, model, toInt64({seconds}) AS window_seconds,
                   toInt64(sum(good)) AS good, toInt64(sum(total)) AS total,
                   toInt64(countIf(good_slice)) AS good_slices, toInt64(count()) AS slices
            FROM slo_burn_minutes
            WHERE minute >= {{end:DateTime64(6)}} - toIntervalSecond({seconds}) AND minute < {{before:DateTime64(6)}}
            GROUP BY slo, tenant_id, deployment, model
        """
        sql = " UNION ALL ".join(one.format(seconds=int(s)) for s in read.windows)
        return self._client.arrow(sql, {"end": read.end, "before": read.before})


class ClickHouseAlertQueries:
    def __init__(self, client: ClickHouse, tables: dict[str, list[Column]]) -> None:
        self._client = client
        self._tables = tables

    def alerts(self, *, state: str | None = None, detector: str | None = None, limit: int = 100) -> pa.Table:
        clauses = [f"{name} = {{{name}:String}}" for name, v in (("state", state), ("detector", detector)) if v]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return self._client.arrow(
            f"SELECT {_names(self._tables['alerts'])} FROM alerts {where} ORDER BY updated_at DESC, alert_id "
            "LIMIT {limit:UInt64}",
            {"state": state, "detector": detector, "limit": int(limit)},
        )

    def clusters(self, *, detector: str | None = None, limit: int = 50) -> pa.Table:
        where = "WHERE detector = {detector:String}" if detector is not None else ""
        return self._client.arrow(
            f"SELECT {_names(self._tables['clusters'], ('evaluated_at',))} FROM clusters {where} "
            "ORDER BY window_end DESC, rank LIMIT {limit:UInt64}",
            {"detector": detector, "limit": int(limit)},
        )


class ClickHouseConsoleQueries:
    def __init__(
        self, client: ClickHouse, evaluator: Evaluator, tables: dict[str, list[Column]], *, otel_table: str | None
    ) -> None:
        self._otel = otel_table
        self._client = client
        self._evaluator = evaluator
        self._figures = {
            name: tuple(c.name for c in columns if c.name != "evaluated_at")
            for name, columns in tables.items()
            if name not in LAYOUTS and {"window_end", "evaluated_at"} <= {c.name for c in columns}
        }
        self._spans = tables["spans"]

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
        if detector not in self._figures:
            raise KeyError(f"no figures for {detector!r}; known: {', '.join(sorted(self._figures))}")
        known = self._figures[detector]
        unknown = [c for c in [*columns, *(where or {})] if c not in known]
        if unknown:
            raise ValueError(f"{detector} has no column {unknown[0]!r}; its columns: {', '.join(known)}")
        chosen = ", ".join(f"`{c}`" for c in columns or known)
        select = f"SELECT {'DISTINCT ' if distinct else ''}{chosen}"
        params: dict[str, object] = {"since": since, "until": until, "limit": int(limit)}
        filters = ""
        for i, (c, value) in enumerate((where or {}).items()):
            filters += f" AND toString(`{c}`) = {{w{i}:String}}"
            params[f"w{i}"] = value
        in_range = (
            f"FROM `{detector}` WHERE window_end > {{since:DateTime64(6)}} AND window_end <= {{until:DateTime64(6)}}"
            f"{filters}"
        )
        rows = int(self._client.arrow(f"SELECT count() FROM ({select} {in_range})", params).column(0)[0].as_py())
        # Named parameters: the repeated range needs no second set.
        in_range, step = figure_shape.thinned(in_range, rows, limit, "window_end" in (columns or known))
        # Newest first, so a cap cuts the oldest; DuckDB's order (NULLs last, oldest first) once reversed.
        ordered = columns or ("window_end", "window_start")
        order = ", ".join(f"`{c}` DESC NULLS FIRST" for c in ordered)
        table = self._client.arrow(f"{select} {in_range} ORDER BY {order} LIMIT {{limit:UInt64}}", params)
        return Figures(figure_shape.oldest_first(table), step, table.num_rows < rows)

    def detector_health(self, as_of: datetime) -> list[DetectorHealth]:
        rows = self._client.arrow(
            """
            SELECT detector, max(ran_at) AS last_run, argMax(outcome, ran_at) AS last_outcome,
                   argMax(seconds, ran_at) AS last_seconds, argMax(error, ran_at) AS last_error,
                   toInt64(countIf(outcome <> 'ok' AND ran_at > {t:DateTime64(6)} - INTERVAL 1 DAY)) AS failures_24h,
                   toInt64(countIf(ran_at > {t:DateTime64(6)} - INTERVAL 1 DAY)) AS runs_24h
            FROM detector_runs GROUP BY detector ORDER BY detector
            """,
            {"t": as_of},
        ).to_pylist()
        return [DetectorHealth(**r) for r in rows]

    def trace(self, trace_id: str, around: Window | None = None) -> dict[str, pa.Table]:
        bound = " AND end_time >= {s:DateTime64(6)} AND end_time < {e:DateTime64(6)}" if around else ""
        params: dict[str, object] = {"t": trace_id}
        if around:
            params |= {"s": around.start, "e": around.end}
        # `spans` keeps the attributes of what it stored since it kept JSON columns; older rows have theirs in
        # otel_traces, where one is kept.
        attributes = (
            "coalesce(spans.attributes, a.attributes) AS attributes FROM spans LEFT JOIN (SELECT SpanId, "
            f"toJSONString(any(SpanAttributes)) AS attributes FROM `{self._otel}` WHERE TraceId = {{t:String}} "
            "GROUP BY SpanId) AS a ON a.SpanId = spans.span_id"
            if self._otel
            else "spans.attributes AS attributes FROM spans"
        )
        spans = self._client.arrow(
            f"SELECT {_names(self._spans, ('ingested_at',))}, {attributes} "
            f"WHERE trace_id = {{t:String}}{bound} ORDER BY start_time, span_id",
            params,
        )
        if spans.num_rows == 0:
            return {"spans": spans}
        ends = spans.column("end_time").to_pylist()
        starts = spans.column("start_time").to_pylist()
        window = Window(min(ends), max(ends) + timedelta(microseconds=1))
        with self._evaluator.loaded(self._client, Needs(window, engine=True, trace_id=trace_id)) as source:
            requests = source.arrow(
                "SELECT * FROM llm_requests_between(?::TIMESTAMP, ?::TIMESTAMP) WHERE trace_id = ? ORDER BY start_time",
                [window.start, window.end, trace_id],
            )
        scores = self._client.arrow(
            "SELECT span_id, name, score, label, explanation, source, observed_at FROM span_scores "
            "WHERE trace_id = {t:String} ORDER BY observed_at, name",
            {"t": trace_id},
        )
        replicas = sorted({r for r in spans.column("replica_id").to_pylist() if r is not None})
        replicas += [r for r in requests.column("replica_id").to_pylist() if r is not None and r not in replicas]
        engine = self._client.arrow(
            "SELECT time, replica_id, name, metric, kind, value, interval_s FROM engine_metrics "
            "WHERE replica_id IN {r:Array(String)} AND time >= {lo:DateTime64(6)} AND time <= {hi:DateTime64(6)} "
            "ORDER BY name, time",
            {"r": replicas, "lo": min(starts) - TRACE_ENGINE_MARGIN, "hi": max(ends) + TRACE_ENGINE_MARGIN},
        )
        return {"spans": spans, "requests": requests, "scores": scores, "engine": engine}
