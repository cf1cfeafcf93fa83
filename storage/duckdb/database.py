"""Opening the one DuckDB database a Tailwatch process owns."""

from __future__ import annotations

from pathlib import Path

import duckdb


def held_by_another_process(error: Exception) -> bool:
    """Whether DuckDB refused the file because another process holds it (it allows one per file)."""
    text = str(error).lower()
    return "could not set lock" in text or "conflicting lock" in text


class DamagedDatabase(Exception):
    """The database file (or its WAL) exists but DuckDB cannot open it: never replaced by an empty store."""

    def __init__(self, path: str | Path, detail: str) -> None:
        self.path = str(path)
        super().__init__(
            f"{path} exists but cannot be opened as a Tailwatch database ({detail}). Tailwatch will not start on "
            f"it, and will not replace it with an empty store. Restore it from a backup; or move it and "
            f"{path}.wal aside to start with an empty store; or point --db (TAILWATCH_DB) at another file."
        )


def open_database(
    path: str | Path, *, memory_limit: str = "512MB", threads: int = 2, checkpoint_threshold: str = "256MB"
) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the database file with the service's settings.

    DuckDB lets one process hold a file; every other connection in this process is a `cursor()` of
    the one returned here, because a second `connect()` with other options is refused.
    """
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
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
    except duckdb.Error as exc:
        # Another process holding the file is not damage: the caller says which process to look for.
        if held_by_another_process(exc) or not Path(path).exists():
            raise
        raise DamagedDatabase(path, str(exc).removeprefix("IO Error: ")) from None
    # Long queries otherwise draw a progress bar on the service's stderr.
    con.execute("SET enable_progress_bar = false")
    # GLOBAL: every cursor is a connection of its own, and a session setting would stay behind on this one
    # (an analyst's now()::TIMESTAMP would be the machine's local time).
    con.execute("SET GLOBAL TimeZone = 'UTC'")
    return con
