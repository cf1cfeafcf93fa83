"""The read ports on DuckDB: detectors' window reads and the API's alert and cluster listings.

Every read runs on a fresh cursor of the service's connection, so concurrent readers never share a
result; none of them writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from storage.ports import Aggregate, Measure, Requests, RequestSummary, Scores, TrafficLabels

# DuckDB computes the key each frame carries: one 64-bit integer per request instead of two strings.
_KEY = "hash(trace_id, span_id) AS request_key"
_IDS = "trace_id, span_id"
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _column(name: str) -> str:
    # Column names come from detector code and from config (clusters' extra_dimensions): they are
    # checked and quoted, never pasted.
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a column name of the request model")
    return f'"{name}"'


def _not_null(columns: Iterable[str]) -> str:
    terms = [f"{_column(c)} IS NOT NULL" for c in columns]
    return f" WHERE {' AND '.join(terms)}" if terms else ""


def _measure(m: Measure) -> str:
    if m.aggregate is Aggregate.COUNT:
        value = "count(*)"
    elif m.aggregate is Aggregate.MEAN:
        value = f"avg({_column(str(m.column))})"
    else:
        value = f"quantile_cont({_column(str(m.column))}, {float(m.q or 0)!r})"
    return f"{value} AS {_column(m.name)}"


class DuckDBWindowSource:
    """The `WindowSource` port: each declared read as one statement over the curated macros."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def arrow(self, sql: str, params: Sequence[Any] = ()) -> pa.Table:
        cur = self._con.cursor()
        try:
            return cur.sql(sql, params=list(params)).to_arrow_table()
        finally:
            cur.close()

    def requests(self, read: Requests) -> pa.Table:
        columns = [_KEY, *([_IDS] if read.ids else []), *map(_column, read.columns)]
        return self.arrow(
            f"SELECT {', '.join(columns)} FROM llm_requests_between(?::TIMESTAMP, ?::TIMESTAMP)"
            + _not_null(read.require),
            (read.window.start, read.window.end),
        )

    def scores(self, read: Scores) -> pa.Table:
        ids = f"{_IDS}, " if read.ids else ""
        return self.arrow(
            f"SELECT {ids}{_KEY}, name, score FROM llm_request_scores_between(?::TIMESTAMP, ?::TIMESTAMP) "
            "WHERE score IS NOT NULL",
            (read.window.start, read.window.end),
        )

    def request_summary(self, read: RequestSummary) -> pa.Table:
        grouped = list(dict.fromkeys(c for s in read.grouping_sets for c in s))
        if len(set(map(frozenset, read.grouping_sets))) != len(read.grouping_sets):
            raise ValueError("each grouping set must group by different columns")
        # GROUPING(c1..cn) sets bit n-1-j when cj is not grouped: each set has its own mask.
        masks = [
            sum(1 << (len(grouped) - 1 - j) for j, c in enumerate(grouped) if c not in s) for s in read.grouping_sets
        ]
        names = ", ".join(map(_column, grouped))
        which = (
            f"CASE GROUPING({names}) " + " ".join(f"WHEN {m} THEN {i}" for i, m in enumerate(masks)) + " END"
            if grouped
            else "0"
        )
        sets = ", ".join(f"({', '.join(map(_column, s))})" for s in read.grouping_sets)
        return self.arrow(
            f"SELECT {names + ', ' if grouped else ''}{which}::INTEGER AS grouping_set, "
            f"{', '.join(map(_measure, read.measures))} "
            f"FROM llm_requests_between(?::TIMESTAMP, ?::TIMESTAMP){_not_null(read.require)}"
            + (f" GROUP BY GROUPING SETS ({sets})" if grouped else ""),
            (read.window.start, read.window.end),
        )

    def traffic_labels(self, read: TrafficLabels) -> pa.Table:
        ids = f"{_IDS}, " if read.ids else ""
        return self.arrow(
            f"SELECT {_KEY}, {ids}pattern FROM request_traffic_patterns_between(?::TIMESTAMP, ?::TIMESTAMP) "
            "WHERE window_start = ? AND window_end = ?",
            (read.window.start, read.window.end, read.window.start, read.window.end),
        )

    def firing_alerts(self) -> pa.Table:
        return self.arrow("SELECT detector, labels FROM alerts WHERE state = 'firing' ORDER BY alert_id")


class DuckDBAlertQueries:
    """The `AlertQueries` port."""

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
