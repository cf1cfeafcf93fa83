"""Retention: spans whose end_time is older than the configured age are deleted."""

from __future__ import annotations

from datetime import datetime

import duckdb


def delete_expired(con: duckdb.DuckDBPyConnection, cutoff: datetime) -> int:
    """Delete spans that ended before `cutoff` (naive UTC); returns how many were deleted.

    Event time, like every window in Tailwatch: a backfill of spans older than the retention age is
    removed at the next pass.
    """
    rows = con.execute("DELETE FROM spans WHERE end_time < ? RETURNING 1", [cutoff]).fetchall()
    return len(rows)
