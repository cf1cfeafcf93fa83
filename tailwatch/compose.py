"""The composition root: settings in, storage and the detection pass out.

`serve`, `detect`, `migrate`, the benchmarks and the tests build their parts here, so there is one
place that knows which backend a setting selects and how it is configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry

from collector.follow import Follower
from collector.metrics import IngestMetrics
from collector.normalize import build_plan
from collector.scrape import Scraper
from detectors.detection import AlertSink, DetectionPass, DetectorMetrics
from detectors.notify import Notifier
from storage.clickhouse.analyst import ClickHouseAnalyst
from storage.clickhouse.backend import ClickHouseStorage
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.evaluator import Evaluator
from storage.clickhouse.otel_source import ClickHouseOtelTraces
from storage.duckdb import analyst
from storage.duckdb.backend import DuckDBStorage
from storage.ports import AnalystSQL
from tailwatch.settings import Settings

AnyStorage = DuckDBStorage | ClickHouseStorage


def open_storage(settings: Settings, registry: CollectorRegistry | None = None) -> AnyStorage:
    """The configured store, its schema brought up to date, its writer running."""
    s, i = settings.storage, settings.ingest
    if s.backend == "clickhouse":
        ch = s.clickhouse
        assert ch.dsn is not None  # the settings refuse clickhouse without one
        return ClickHouseStorage.open(
            ch.dsn.get_secret_value(),
            otel_table=ch.otel_table,
            receivers_write_otel_table=ch.otel_traces == "write",
            cluster=ch.cluster,
            ttl_days=s.retention_days,
            max_queued_spans=i.max_queued_spans,
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
        dedup_window_seconds=i.dedup_window_seconds,
        dedup_max_spans=i.dedup_max_spans,
        sql_timeout_seconds=settings.sql.timeout_seconds,
        sql_max_rows=settings.sql.max_rows,
        registry=registry,
        reserve_bytes=s.reserve_mb * 2**20,
        spool=Path(f"{settings.db}.spool") if i.spool else None,
        spool_backlog=i.spool_backlog_spans,
    )


def follower_of(settings: Settings, storage: AnyStorage) -> Follower | None:
    """The job that normalizes the rows a user's Collector writes to otel_traces; None unless configured."""
    ch = settings.storage.clickhouse
    if not isinstance(storage, ClickHouseStorage) or ch.otel_traces != "follow":
        return None
    days = settings.storage.retention_days
    return Follower(
        ClickHouseOtelTraces(storage.client, ch.otel_table, ch.cluster),
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
        registry=registry,
    )


def detection_pass(
    settings: Settings,
    storage: AnyStorage,
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
    )


def scraper(
    settings: Settings,
    storage: AnyStorage,
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
    dsn = settings.storage.clickhouse.dsn
    assert dsn is not None  # the settings refuse clickhouse without one
    client = ClickHouse(dsn.get_secret_value())
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
