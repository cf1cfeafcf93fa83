"""Retention: spans (by end_time) and engine metric points (by time) older than the configured age are deleted."""

from __future__ import annotations

from datetime import datetime

import duckdb

from storage.span_layout import SPAN_ROWS


def delete_expired(con: duckdb.DuckDBPyConnection, cutoff: datetime) -> int:
    """Delete spans that ended before `cutoff` (naive UTC); returns how many were deleted.

    Event time, like every window in Tailwatch: a backfill of spans older than the retention age is
    removed at the next pass.
    """
    rows = con.execute(f"DELETE FROM {SPAN_ROWS} WHERE end_time < ? RETURNING 1", [cutoff]).fetchall()
    # Engine metrics age out with the spans they explain.
    con.execute("DELETE FROM engine_metrics WHERE time < ?", [cutoff])
    # slo_burn's per-minute counts outlive the spans they were counted from (an SLO window is up to
    # 90 days, longer than spans are kept), but not beyond that.
    con.execute("DELETE FROM slo_burn_minutes WHERE minute < ?::TIMESTAMP - INTERVAL 90 DAY", [cutoff])
    return len(rows)
