"""The composition root: settings in, storage and the detection pass out.

`serve`, `detect`, `migrate`, the benchmarks and the tests build their parts here, so there is one
place that knows which backend a setting selects and how it is configured: the rest of the shell sees
storage through `storage.ports.Storage`, and what only one backend has through its optional ports.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
from prometheus_client import CollectorRegistry

from collector.metrics import IngestMetrics
from collector.normalize import build_plan
from collector.otel_traces_follower import Follower
from collector.scrape import Scraper
from detectors.changes import ChangeMetrics, ChangePass
from detectors.clusters import KEY as CLUSTERS
from detectors.clusters import Config as ClustersConfig
from detectors.clusters import following
from detectors.compare import Compared, Comparing, Sets, compare
from detectors.detection import AlertSink, DetectionPass, DetectorMetrics
from detectors.incidents import IncidentMetrics, IncidentPass
from detectors.notify import Notifier
from storage.clickhouse.analyst import ClickHouseAnalyst
from storage.clickhouse.backend import ClickHouseStorage
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.evaluator import Evaluator
from storage.clickhouse.schema import SCHEMA_VERSION as CLICKHOUSE_SCHEMA
from storage.duckdb import analyst
from storage.duckdb.backend import DuckDBStorage
from storage.duckdb.database import DamagedDatabase, held_by_another_process
from storage.duckdb.migrate import migrated
from storage.ports import AnalystSQL, FrameBudget, Storage
from tailwatch.settings import Settings, SettingsError


def _dsn(settings: Settings) -> str:
    dsn = settings.storage.clickhouse.dsn
    if dsn is None:  # loaded settings refuse clickhouse without one; settings built in code may lack it
        raise SettingsError("storage.backend is clickhouse but storage.clickhouse.dsn is not set: name the server")
    return dsn.get_secret_value()


def open_storage(settings: Settings, registry: CollectorRegistry | None = None) -> Storage:
    """The configured store, its schema brought up to date, its writer running."""
    return _open(settings, registry)


def _open(settings: Settings, registry: CollectorRegistry | None = None) -> DuckDBStorage | ClickHouseStorage:
    s, i = settings.storage, settings.ingest
    if s.backend == "clickhouse":
        ch = s.clickhouse
        return ClickHouseStorage.open(
            _dsn(settings),
            otel_table=ch.otel_table,
            otel_traces=ch.otel_traces,
            cluster=ch.cluster,
            ttl_days=s.retention_days,
            max_queued_spans=i.max_queued_spans,
            max_queued_bytes=i.max_queued_bytes,
            sql_timeout_seconds=settings.sql.timeout_seconds,
            sql_max_rows=settings.sql.max_rows,
            lease_seconds=ch.lease_seconds,
            registry=registry,
        )
    return DuckDBStorage.open(
        settings.db,
        memory_limit=s.memory_limit,
        threads=s.duckdb_threads(),
        checkpoint_threshold=s.checkpoint_threshold,
        max_queued_spans=i.max_queued_spans,
        max_queued_bytes=i.max_queued_bytes,
        dedup_window_seconds=i.dedup_window_seconds,
        dedup_max_spans=i.dedup_max_spans,
        sql_timeout_seconds=settings.sql.timeout_seconds,
        sql_max_rows=settings.sql.max_rows,
        registry=registry,
        reserve_bytes=s.reserve_mb * 2**20,
        spool=Path(f"{settings.db}.spool") if i.spool else None,
        spool_backlog=i.spool_backlog_spans,
    )


def migrate(settings: Settings) -> str:
    """Bring the configured store's schema up to date; says where it now is (`tailwatch migrate`)."""
    storage = _open(settings)
    if isinstance(storage, ClickHouseStorage):
        storage.close()
        return f"ClickHouse: Tailwatch's tables at schema {CLICKHOUSE_SCHEMA}"
    before, after = storage.migrated_from, storage.revision()
    storage.close()
    return migrated(settings.db, before, after) if before != after else f"{settings.db}: schema at {after}"


def migrate_in_a_child(settings: Settings) -> None:
    """Bring the DuckDB file to the newest schema in a process of its own, so that the service never imports
    Alembic and SQLAlchemy (~50 MiB it would hold for its whole life). If the child cannot, the service's
    own open migrates, or says why it cannot."""
    s = settings.storage
    subprocess.run(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-m", "storage.duckdb.migrate", str(settings.db),
         "--memory-limit", s.memory_limit, "--threads", str(s.duckdb_threads())],
        check=False,
    )  # fmt: skip


def store_failure(exc: BaseException, db: str) -> tuple[int, str] | None:
    """What a failure of the store means at the command line, as an exit code and one line; None when `exc` is
    not one. `db` names the database file."""
    if isinstance(exc, DamagedDatabase):
        return 4, str(exc)
    if isinstance(exc, duckdb.IOException) and held_by_another_process(exc):
        return 3, (
            f"{db} is held by another process (is a `tailwatch serve` running on it?); "
            "DuckDB allows one process per database file."
        )
    return None


def follower_of(settings: Settings, storage: Storage) -> Follower | None:
    """The job that normalizes the rows a user's Collector writes to otel_traces; None unless the store follows
    one."""
    rows = storage.otel_traces
    if rows is None:
        return None
    ch, days = settings.storage.clickhouse, settings.storage.retention_days
    return Follower(
        rows,
        storage.sink,
        build_plan(settings.normalize),
        lag=timedelta(seconds=ch.follow_lag_seconds),
        start=lambda: datetime.now(UTC).replace(tzinfo=None) - timedelta(days=days),
    )


def notifier(settings: Settings, registry: CollectorRegistry | None = None) -> Notifier:
    """Alert delivery to the configured webhooks and Alertmanager."""
    a = settings.alerting
    return Notifier(
        webhook_urls=a.webhook_urls,
        alertmanager_url=a.alertmanager_url,
        timeout_seconds=a.timeout_seconds,
        max_attempts=a.max_attempts,
        backoff_seconds=a.backoff_seconds,
        queue_size=a.queue_size,
        webhook_payloads=a.webhook_payloads,
        registry=registry,
    )


def detection_pass(
    settings: Settings,
    storage: Storage,
    *,
    sink: AlertSink | None = None,
    registry: CollectorRegistry | None = None,
) -> DetectionPass:
    """The one detection pass over `storage`, with the configured detectors."""
    return DetectionPass(
        storage.windows,
        storage.detector_store,
        settings.detector_configs(),
        sink=sink,
        metrics=DetectorMetrics(registry) if registry is not None else None,
        max_frame_bytes=settings.storage.detection_memory_mb * 2**20,
        incidents=IncidentPass(
            storage.incident_store,
            settings.incidents,
            source=storage.windows,
            metrics=IncidentMetrics(registry) if registry is not None else None,
            changes=storage.change_store,
        ),
        changes=ChangePass(
            storage.change_store, settings.changes, metrics=ChangeMetrics(registry) if registry is not None else None
        ),
    )


def comparing(settings: Settings, storage: Storage) -> Comparing:
    """`GET /v1/compare` over `storage`: the sets read as the configured clusters read a window, within the
    detection pass's memory bound."""
    clusters = following(settings.detector_configs())[CLUSTERS]
    if not isinstance(clusters, ClustersConfig):
        raise TypeError(f"detectors.clusters is a {type(clusters).__name__}, not the clusters' config")

    def run(sets: Sets, limit: int) -> Compared:
        budget = FrameBudget(settings.storage.detection_memory_mb * 2**20)
        return compare(storage.windows, storage.change_store, sets, clusters, settings.changes, limit=limit,
                       budget=budget)  # fmt: skip

    return run


def scraper(
    settings: Settings,
    storage: Storage,
    *,
    registry: CollectorRegistry | None = None,
    ingest_metrics: IngestMetrics | None = None,
) -> Scraper | None:
    """Scrape mode over `storage`: None when no targets are configured."""
    m = settings.metrics
    if not m.scrape.targets:
        return None
    return Scraper(
        m.scrape.targets,
        names=m.engine_names(),
        plan=build_plan(settings.normalize),
        sink=storage.sink,
        health=storage.scrape_health,
        timeout_seconds=m.scrape.timeout_seconds,
        registry=registry,
        ingest_metrics=ingest_metrics,
    )


@contextmanager
def open_file_analyst(settings: Settings, path: Path) -> Iterator[AnalystSQL]:
    """Analyst SQL straight on a database file that no service holds, under the API's limits."""
    with analyst.open_file(path, timeout_seconds=settings.sql.timeout_seconds, max_rows=settings.sql.max_rows) as a:
        yield a


@contextmanager
def open_clickhouse_analyst(settings: Settings) -> Iterator[AnalystSQL]:
    """Analyst SQL straight on the configured ClickHouse, under the API's limits; creates nothing there."""
    client = ClickHouse(_dsn(settings))
    evaluator = Evaluator()
    try:
        yield ClickHouseAnalyst(
            client, evaluator, timeout_seconds=settings.sql.timeout_seconds, max_rows=settings.sql.max_rows
        )
    finally:
        evaluator.close()
        client.close()


def database_held(path: Path) -> bool:
    """Whether a process (a running service) holds the database file."""
    return analyst.held(path)
