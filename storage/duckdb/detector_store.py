"""The `DetectorStore` port on DuckDB: firing state read on a cursor, every change through the writer."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime
from typing import Protocol, TypeVar

import duckdb
import polars as pl

from storage.duckdb.window_source import DuckDBWindowSource
from storage.ports import COUNTED_ONCE_PER_MINUTE, Alert, EvaluationRecord, FiringState, RunRecord

T = TypeVar("T")
_INSERT_SLICE = 500_000


class WriteJobs(Protocol):
    """Run a function on the one writer, in a transaction."""

    def submit(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> Future[T]: ...


class DuckDBDetectorStore:
    def __init__(self, source: DuckDBWindowSource, writer: WriteJobs) -> None:
        self._source = source
        self._writer = writer

    def firing_state(self, detector: str) -> FiringState:
        rows = self._source.arrow("SELECT * FROM alerts WHERE detector = ? AND state = 'firing'", [detector])
        counts = self._source.arrow("SELECT fingerprint, breaches FROM alert_conditions WHERE detector = ?", [detector])
        return FiringState(
            firing={r["fingerprint"]: Alert.from_row(r) for r in rows.to_pylist()},
            breaches=dict(zip(counts["fingerprint"].to_pylist(), counts["breaches"].to_pylist(), strict=True)),
        )

    def persist(self, evaluation: EvaluationRecord) -> None:
        self._writer.submit(lambda con: _persist(con, evaluation)).result()

    def log_run(self, run: RunRecord) -> None:
        self._writer.submit(lambda con: _log_run(con, run)).result()

    def evaluated(self, detector: str, since: datetime) -> set[datetime]:
        rows = self._source.arrow(
            "SELECT DISTINCT evaluated_at FROM detector_runs WHERE detector = ? AND evaluated_at >= ?",
            [detector, since],
        )
        return set(rows.column(0).to_pylist())


def _insert_frame(con: duckdb.DuckDBPyConnection, table: str, frame: pl.DataFrame) -> None:
    # In slices: a day of per-request labels is ten million rows, and converting it to Arrow in one
    # piece doubled the pass's peak memory.
    columns = ", ".join(frame.columns)
    for offset in range(0, frame.height, _INSERT_SLICE):
        con.register("_tailwatch_figures", frame.slice(offset, _INSERT_SLICE).to_arrow())
        try:
            con.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM _tailwatch_figures")
        finally:
            con.unregister("_tailwatch_figures")


def _persist(con: duckdb.DuckDBPyConnection, evaluation: EvaluationRecord) -> None:
    run = evaluation.run
    window = run.window
    for table, frame in evaluation.figures.items():
        if table in COUNTED_ONCE_PER_MINUTE:
            con.execute(f"DELETE FROM {table} WHERE minute >= ? AND minute < ?", [window.start, window.end])
        con.execute(f"DELETE FROM {table} WHERE window_start = ? AND window_end = ?", [window.start, window.end])
        _insert_frame(con, table, frame.with_columns(evaluated_at=pl.lit(run.at, pl.Datetime("us"))))
    for alert in evaluation.fired:
        row = alert.as_row()
        con.execute(f"INSERT INTO alerts ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    for alert in evaluation.changed:
        con.execute(
            """UPDATE alerts SET state = ?, severity = ?, summary = ?, value = ?, threshold = ?, window_start = ?,
                      window_end = ?, resolved_at = ?, updated_at = ?
               WHERE alert_id = ?""",
            [alert.state, alert.severity, alert.summary, alert.value, alert.threshold, alert.window_start,
             alert.window_end, alert.resolved_at, alert.updated_at, alert.alert_id],
        )  # fmt: skip
    for alert_id, explanation in evaluation.explanations.items():
        con.execute("UPDATE alerts SET explanation = ? WHERE alert_id = ?", [explanation, alert_id])
    con.execute("DELETE FROM alert_conditions WHERE detector = ?", [run.detector])
    for fp, count in evaluation.breaches.items():
        con.execute("INSERT INTO alert_conditions VALUES (?, ?, ?, ?)", [fp, run.detector, count, run.at])
    _log_run(con, run)


def _log_run(con: duckdb.DuckDBPyConnection, run: RunRecord) -> None:
    con.execute(
        "INSERT INTO detector_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
        [run.detector, run.at, run.window.start, run.window.end, run.outcome, run.seconds, run.rows,
         run.conditions, run.error],
    )  # fmt: skip
