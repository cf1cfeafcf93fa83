"""Opening the one DuckDB database a Tailwatch process owns."""

from __future__ import annotations

from pathlib import Path

import duckdb


def open_database(
    path: str | Path, *, memory_limit: str = "512MB", threads: int = 2, checkpoint_threshold: str = "256MB"
) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the database file with the service's settings.

    DuckDB lets one process hold a file; every other connection in this process is a `cursor()` of
    the one returned here, because a second `connect()` with other options is refused.
    """
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(
        str(path),
        config={
            "memory_limit": memory_limit,
            "threads": threads,
            # DuckDB's 16MB default checkpoints every ~15k spans, and a checkpoint rewrites the partly
            # filled row group each time: measured 90 ms to 3.4 s stalls of the writer. A larger WAL
            # checkpoints ~15x less often for the same total work; it costs a longer replay after a crash.
            "checkpoint_threshold": checkpoint_threshold,
        },
    )
    # Long queries otherwise draw a progress bar on the service's stderr.
    con.execute("SET enable_progress_bar = false")
    # GLOBAL: every cursor is a connection of its own, and a session setting would stay behind on this one
    # (an analyst's now()::TIMESTAMP would be the machine's local time).
    con.execute("SET GLOBAL TimeZone = 'UTC'")
    return con
