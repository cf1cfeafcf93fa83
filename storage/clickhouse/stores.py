"""The write-side ports on ClickHouse besides ingest: detector persistence, scrape health, retention and
engine facts.

ClickHouse has no transaction across tables, so `persist` makes the evaluation's rows first (every figure
frame cast to its table's columns: a frame that does not fit fails here, before anything is written) and
then writes them in an order a crash half-way leaves harmless: figures, whose window a replay rewrites;
alerts and explanations, replaced rows keyed by alert_id; breach counters; the run log last, so a run
that is logged stored everything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from storage.clickhouse.client import ClickHouse
from storage.clickhouse.evaluator import Evaluator
from storage.clickhouse.schema import Column, delete_rows, versioned
from storage.engine_settling import CHUNK
from storage.ports import COUNTED_ONCE_PER_MINUTE, Alert, EvaluationRecord, FiringState, RunRecord, TargetHealth, Window

_ARROW = {
    "String": pa.string(),
    "Int64": pa.int64(),
    "Int32": pa.int32(),
    "Float64": pa.float64(),
    "Bool": pa.bool_(),
    "DateTime64(6, 'UTC')": pa.timestamp("us"),
    "Array(String)": pa.list_(pa.string()),
    "Map(String, Float64)": pa.map_(pa.string(), pa.float64()),
}


def arrow_type(clickhouse_type: str) -> pa.DataType:
    inner = clickhouse_type.removeprefix("Nullable(").removesuffix(")") if clickhouse_type.startswith(
        "Nullable(") else clickhouse_type  # fmt: skip
    return _ARROW[inner]


def fit(frame: pl.DataFrame | pa.Table, columns: Sequence[Column], table: str) -> pa.Table:
    """`frame` as `table`'s columns: names it lacks are NULL, names the table lacks are an error."""
    data = frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame
    known = {c.name for c in columns}
    unknown = [n for n in data.column_names if n not in known]
    if unknown:
        raise ValueError(f"{table} has no column {unknown[0]!r}")
    arrays = []
    for c in columns:
        typ = arrow_type(c.type)
        arrays.append(data.column(c.name).cast(typ) if c.name in data.column_names else pa.nulls(data.num_rows, typ))
    return pa.Table.from_arrays(arrays, names=[c.name for c in columns])


class ClickHouseDetectorStore:
    def __init__(self, client: ClickHouse, tables: dict[str, list[Column]]) -> None:
        self._client = client
        self._tables = tables

    def firing_state(self, detector: str) -> FiringState:
        columns = ", ".join(f"`{c.name}`" for c in self._tables["alerts"])
        rows = self._client.arrow(
            f"SELECT {columns} FROM alerts WHERE detector = {{d:String}} AND state = 'firing'", {"d": detector}
        )
        counts = self._client.arrow(
            "SELECT fingerprint, breaches FROM alert_conditions WHERE detector = {d:String}", {"d": detector}
        )
        return FiringState(
            firing={r["fingerprint"]: Alert.from_row(r) for r in rows.to_pylist()},
            breaches=dict(zip(counts["fingerprint"].to_pylist(), counts["breaches"].to_pylist(), strict=True)),
        )

    def _alerts(self, alerts: Sequence[Alert], explanations: Mapping[str, str]) -> pa.Table | None:
        """The alerts' rows as they are to be stored, explanations written in; None without any."""
        if not alerts:
            return None
        rows = [{**a.as_row(), "explanation": explanations.get(a.alert_id, a.explanation)} for a in alerts]
        return versioned(fit(pa.Table.from_pylist(rows), self._tables["alerts"], "alerts"))

    def persist(self, evaluation: EvaluationRecord) -> None:
        run, window = evaluation.run, evaluation.run.window
        at = pl.lit(run.at, pl.Datetime("us"))
        unknown = [table for table in evaluation.figures if table not in self._tables]
        if unknown:
            raise ValueError(f"no table {unknown[0]!r} on ClickHouse")
        figures = {
            table: fit(frame.with_columns(evaluated_at=at), self._tables[table], table)
            for table, frame in evaluation.figures.items()
        }
        explanations = dict(evaluation.explanations)
        changed = [*evaluation.fired, *evaluation.changed]
        # An explanation of an alert not written here (another detector's) replaces that alert's stored row.
        others = [i for i in explanations if i not in {a.alert_id for a in changed}]
        if others:
            columns = ", ".join(f"`{c.name}`" for c in self._tables["alerts"])
            stored = self._client.arrow(
                f"SELECT {columns} FROM alerts WHERE alert_id IN {{ids:Array(String)}}", {"ids": others}
            ).to_pylist()
            changed += [Alert.from_row(r) for r in stored]
        alerts = self._alerts(changed, explanations)
        conditions = pa.table(
            {
                "fingerprint": pa.array(list(evaluation.breaches), pa.string()),
                "detector": pa.array([run.detector] * len(evaluation.breaches), pa.string()),
                "breaches": pa.array(list(evaluation.breaches.values()), pa.int32()),
                "last_evaluated": pa.array([run.at] * len(evaluation.breaches), pa.timestamp("us")),
            }
        )
        for table, rows in figures.items():
            self._replace_window(table, window, rows)
        if alerts is not None:
            self._client.insert("alerts", alerts, replacing=True)
        if self._has("alert_conditions", "detector = {d:String}", {"d": run.detector}):
            self._client.command("DELETE FROM alert_conditions WHERE detector = {d:String}", {"d": run.detector})
        if conditions.num_rows:
            self._client.insert("alert_conditions", conditions, replacing=True)
        self.log_run(run)

    def _has(self, table: str, where: str, params: Mapping[str, object]) -> bool:
        return bool(int(self._client.command(f"SELECT count() FROM {table} WHERE {where}", params)))

    def _replace_window(self, table: str, window: Window, rows: pa.Table) -> None:
        # A window evaluated again replaces its rows: the DELETE only runs when there are rows to replace (a
        # replay), so the steady state of one evaluation per new window is inserts alone.
        params = {"s": window.start, "e": window.end}
        where = "window_start = {s:DateTime64(6)} AND window_end = {e:DateTime64(6)}"
        if self._has(table, where, params):
            self._client.command(f"DELETE FROM {table} WHERE {where}", params)
        if table in COUNTED_ONCE_PER_MINUTE:
            minutes = "minute >= {s:DateTime64(6)} AND minute < {e:DateTime64(6)}"
            if self._has(table, minutes, params):
                self._client.command(f"DELETE FROM {table} WHERE {minutes}", params)
        if rows.num_rows:
            self._client.insert(table, rows, replacing=True)

    def evaluated(self, detector: str, since: datetime) -> set[datetime]:
        rows = self._client.arrow(
            "SELECT DISTINCT evaluated_at FROM detector_runs WHERE detector = {d:String} "
            "AND evaluated_at >= {since:DateTime64(6)}",
            {"d": detector, "since": since},
        )
        return set(rows.column(0).to_pylist())

    def log_run(self, run: RunRecord) -> None:
        row = {
            "detector": run.detector, "evaluated_at": run.at, "window_start": run.window.start,
            "window_end": run.window.end, "outcome": run.outcome, "seconds": run.seconds, "rows": run.rows,
            "conditions": run.conditions, "error": run.error, "ran_at": datetime.now(UTC).replace(tzinfo=None),
        }  # fmt: skip
        runs = fit(pa.Table.from_pylist([row]), self._tables["detector_runs"], "detector_runs")
        self._client.insert("detector_runs", runs, replacing=True)


class ClickHouseScrapeHealth:
    """One row per target, replaced each round; a failed scrape keeps the last success."""

    def __init__(self, client: ClickHouse, tables: dict[str, list[Column]]) -> None:
        self._client = client
        self._columns = tables["scrape_targets"]

    def record(self, rows: Sequence[TargetHealth]) -> Future[None]:
        future: Future[None] = Future()
        try:
            urls = [r.url for r in rows]
            before = {
                r["url"]: r["last_success"]
                for r in self._client.arrow(
                    "SELECT url, last_success FROM scrape_targets WHERE url IN {u:Array(String)}", {"u": urls}
                ).to_pylist()
            }
            table = fit(
                pa.Table.from_pylist(
                    [
                        {"url": r.url, "replica_id": r.replica_id, "deployment": r.deployment, "up": r.up,
                         "last_scrape": r.scraped_at,
                         "last_success": r.scraped_at if r.error is None else before.get(r.url),
                         "last_error": r.error, "points": r.points, "seconds": r.seconds}
                        for r in rows
                    ]
                ),
                self._columns,
                "scrape_targets",
            )  # fmt: skip
            if table.num_rows:
                self._client.insert("scrape_targets", versioned(table))
        except Exception as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        else:
            future.set_result(None)
        return future


class ClickHouseRetention:
    """Deletes what ended before the cutoff. Tables also carry a TTL of the configured retention, which
    ClickHouse applies by dropping whole parts in merges; this delete makes the cutoff exact and immediate."""

    def __init__(self, client: ClickHouse, otel_table: str, own_otel_table: bool, cluster: str | None = None) -> None:
        self._client = client
        self._otel = otel_table if own_otel_table else None
        self._cluster = cluster

    def _delete(self, table: str, where: str, params: Mapping[str, object], *, sharded: bool | None = None) -> None:
        self._client.command(delete_rows(table, where, self._cluster, sharded=sharded), params)

    def delete_ended_before(self, cutoff: datetime) -> int:
        params = {"c": cutoff}
        deleted = int(self._client.command("SELECT count() FROM spans WHERE end_time < {c:DateTime64(6)}", params))
        if deleted:
            self._delete("spans", "end_time < {c:DateTime64(6)}", params)
            if self._otel:
                self._delete(self._otel, "Timestamp < {c:DateTime64(9)}", params, sharded=True)
        self._delete("engine_metrics", "time < {c:DateTime64(6)}", params)
        self._client.command("DELETE FROM slo_burn_minutes WHERE minute < {c:DateTime64(6)} - INTERVAL 90 DAY", params)
        return deleted


class ClickHouseEngineFacts:
    """Settles engine facts with the request model's own rules (run where the evaluator runs them) and stores
    them as a newer version of each span's row."""

    def __init__(self, client: ClickHouse, evaluator: Evaluator) -> None:
        self._client = client
        self._evaluator = evaluator

    def settle(self, until: datetime) -> int:
        settled = 0
        newest = self._client.arrow("SELECT max(time) AS t FROM engine_metrics").column(0)[0].as_py()
        if newest is None or int(self._client.command("SELECT count() FROM engine_metrics")) == 0:
            return 0
        limit = min(until, newest)
        while True:
            low = (
                self._client.arrow(
                    "SELECT min(end_time) AS t FROM spans WHERE is_llm AND engine_settled IS NULL "
                    "AND end_time < {l:DateTime64(6)}",
                    {"l": limit},
                )
                .column(0)[0]
                .as_py()
            )
            if low is None:
                return settled
            window = Window(low, min(limit, low + CHUNK))
            rows = self._evaluator.settle(self._client, window)
            if rows.num_rows == 0:
                return settled
            self._client.insert("spans", versioned(rows))
            settled += rows.num_rows
