"""The composition root: settings in, storage and the detection pass out.

`serve`, `detect`, `migrate`, the benchmarks and the tests build their parts here, so there is one
place that knows which backend a setting selects and how it is configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry

from collector.metrics import IngestMetrics
from collector.normalize import build_plan
from collector.scrape import Scraper
from detectors.detection import AlertSink, DetectionPass, DetectorMetrics
from detectors.notify import Notifier
from storage.duckdb import analyst
from storage.duckdb.backend import DuckDBStorage
from storage.ports import AnalystSQL
from tailwatch.settings import Settings


def open_storage(settings: Settings, registry: CollectorRegistry | None = None) -> DuckDBStorage:
    """The configured database, migrated to the newest schema, its writer running."""
    s, i = settings.storage, settings.ingest
    return DuckDBStorage.open(
        settings.db,
        memory_limit=s.memory_limit,
        threads=s.threads,
        checkpoint_threshold=s.checkpoint_threshold,
        max_queued_spans=i.max_queued_spans,
        dedup_window_seconds=i.dedup_window_seconds,
        dedup_max_spans=i.dedup_max_spans,
        sql_timeout_seconds=settings.sql.timeout_seconds,
        sql_max_rows=settings.sql.max_rows,
        registry=registry,
        reserve_bytes=s.reserve_mb * 2**20,
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
    storage: DuckDBStorage,
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
    )


def scraper(
    settings: Settings,
    storage: DuckDBStorage,
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


def database_held(path: Path) -> bool:
    """Whether a process (a running service) holds the database file."""
    return analyst.held(path)
