"""The DuckDB backend as one object: the database file, its one writer, and every port over them."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

import duckdb
from prometheus_client import CollectorRegistry

from storage.duckdb import migrate
from storage.duckdb.alert_queries import DuckDBAlertQueries
from storage.duckdb.analyst import AnalystQueries, lock_down
from storage.duckdb.changes import DuckDBChangeStore
from storage.duckdb.console_reads import DuckDBConsoleQueries
from storage.duckdb.database import open_database
from storage.duckdb.detector_store import DuckDBDetectorStore
from storage.duckdb.engine_facts import DuckDBEngineFacts
from storage.duckdb.incidents import DuckDBIncidentStore
from storage.duckdb.retention import delete_expired
from storage.duckdb.scrape_health import DuckDBScrapeHealth
from storage.duckdb.sql_reader import Reader
from storage.duckdb.window_source import DuckDBWindowSource
from storage.duckdb.writer import Writer
from storage.group_queue import DEFAULT_MAX_BYTES
from storage.writer_metrics import WriterMetrics

log = logging.getLogger(__name__)


class DuckDBRetention:
    """The `SpanRetention` port: the delete runs on the writer like every other change."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    def delete_ended_before(self, cutoff: datetime) -> int:
        disk = self._writer.disk
        full = disk.full
        if full:
            disk.give_up_reserve()  # room for the delete's own WAL entry and the checkpoint after it
        deleted = self._writer.submit(lambda con: delete_expired(con, cutoff)).result()
        if full:
            if deleted:
                # The deleted rows' space is free only once checkpointed: then the WAL is emptied and their
                # blocks are what new spans are written into (the file itself does not shrink).
                self._writer.submit(lambda con: con.execute("CHECKPOINT"), transaction=False).result()
                disk.committed()
            disk.keep_reserve()
        return deleted


class DuckDBStorage:
    """Every storage port over one database file. `open` migrates it and starts the writer."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        writer: Writer,
        *,
        sql_timeout_seconds: float,
        sql_max_rows: int,
        migrated_from: str | None = None,
    ) -> None:
        self.connection = con
        self.migrated_from = migrated_from  # the schema revision the file had before `open` (None: new)
        self.writer = writer
        self.windows = DuckDBWindowSource(con)
        self.detector_store = DuckDBDetectorStore(self.windows, writer)
        self.alert_queries = DuckDBAlertQueries(self.windows)
        self.incident_store = DuckDBIncidentStore(self.windows, writer)
        self.change_store = DuckDBChangeStore(self.windows, writer)
        self.console_queries = DuckDBConsoleQueries(self.windows)
        self.analyst = AnalystQueries(con, timeout_seconds=sql_timeout_seconds, max_rows=sql_max_rows)
        self.retention = DuckDBRetention(writer)
        self.scrape_health = DuckDBScrapeHealth(writer)
        self.engine_facts = DuckDBEngineFacts(writer)
        self.reader = Reader(con)
        self._closed = False

    @property
    def refusing_writes(self) -> bool:
        """Whether every write is refused for now (a full disk): readiness says so to load balancers."""
        return self.writer.disk.full or self.writer.invalidated is not None

    @property
    def sink(self) -> Writer:
        return self.writer

    @property
    def write_jobs(self) -> Writer:
        return self.writer

    @property
    def lease(self) -> None:
        """None: one process owns the file, so its scheduler's jobs need no turns."""
        return None

    @property
    def otel_traces(self) -> None:
        """None: a Collector's `otel_traces` is followed only on ClickHouse."""
        return None

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        memory_limit: str = "512MB",
        threads: int = 2,
        checkpoint_threshold: str = "256MB",
        max_queued_spans: int = 200_000,
        max_queued_bytes: int = DEFAULT_MAX_BYTES,
        dedup_window_seconds: float = 0,
        dedup_max_spans: int = 0,
        sql_timeout_seconds: float = 30,
        sql_max_rows: int = 10_000,
        registry: CollectorRegistry | None = None,
        reserve_bytes: int = 0,
        spool: Path | None = None,
        spool_backlog: int = 1000,
    ) -> DuckDBStorage:
        """Open (creating if needed) the file, migrate it to the newest schema, start the writer."""
        con = open_database(path, memory_limit=memory_limit, threads=threads, checkpoint_threshold=checkpoint_threshold)
        try:
            before = migrate.current_revision(con)
            migrate.upgrade(con)
            # From here on no connection of this database reads or writes files other than its own, or
            # changes its configuration: the analyst SQL endpoint's first wall.
            lock_down(con)
            writer = Writer(
                con,
                max_queued_spans=max_queued_spans,
                max_queued_bytes=max_queued_bytes,
                dedup_window_seconds=dedup_window_seconds,
                dedup_max_spans=dedup_max_spans,
                metrics=WriterMetrics(registry) if registry is not None else None,
                reserve_bytes=reserve_bytes,
                spool=spool,
                spool_backlog=spool_backlog,
            )
            writer.start()
        except BaseException:
            con.close()
            raise
        return cls(
            con, writer, sql_timeout_seconds=sql_timeout_seconds, sql_max_rows=sql_max_rows, migrated_from=before
        )

    def revision(self) -> str | None:
        """The schema revision the file is at."""
        return migrate.current_revision(self.connection)

    def stop_writes(self) -> None:
        """Commit everything queued and stop the writer. Idempotent."""
        self.writer.close()

    def close(self) -> None:
        """Stop writes, checkpoint and close the file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        if self.writer.invalidated is None:  # an invalidated database refuses the checkpoint; its WAL replays
            try:
                self.connection.execute("CHECKPOINT")
            except duckdb.Error as exc:
                # A full disk, say: what was committed is in the WAL, which the next start replays.
                log.warning("the closing checkpoint failed (the WAL replays at the next start): %s", exc)
        self.connection.close()
