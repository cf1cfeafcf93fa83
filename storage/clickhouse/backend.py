"""The ClickHouse backend as one object: the client, the schema, the sink and every port over them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from storage.clickhouse import schema
from storage.clickhouse.analyst import ClickHouseAnalyst
from storage.clickhouse.changes import ClickHouseChangeStore
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.evaluator import Evaluator
from storage.clickhouse.incidents import ClickHouseIncidentStore
from storage.clickhouse.lease import ClickHouseLease
from storage.clickhouse.otel_source import ClickHouseOtelTraces
from storage.clickhouse.reads import ClickHouseAlertQueries, ClickHouseConsoleQueries, ClickHouseWindowSource
from storage.clickhouse.stores import (
    ClickHouseDetectorStore,
    ClickHouseEngineFacts,
    ClickHouseRetention,
    ClickHouseScrapeHealth,
)
from storage.clickhouse.writer import ClickHouseWriter
from storage.group_queue import DEFAULT_MAX_BYTES
from storage.ports import OtelTraces
from storage.writer_metrics import WriterMetrics


class ClickHouseStorage:
    """Every storage port over one ClickHouse database. `open` creates what is missing and starts the sink."""

    def __init__(
        self,
        client: ClickHouse,
        evaluator: Evaluator,
        writer: ClickHouseWriter,
        *,
        otel_table: str,
        otel_traces: OtelTraces,
        sql_timeout_seconds: float,
        sql_max_rows: int,
        lease_seconds: float = 60,
        cluster: str | None = None,
        otel_fed: bool = False,
    ) -> None:
        tables = evaluator.tables
        self.cluster = cluster
        self.client = client
        self.writer = writer
        self.windows = ClickHouseWindowSource(client, evaluator)
        self.detector_store = ClickHouseDetectorStore(client, tables)
        self.alert_queries = ClickHouseAlertQueries(client, tables)
        self.incident_store = ClickHouseIncidentStore(client, tables)
        self.change_store = ClickHouseChangeStore(client, tables)
        attributes_from = otel_table if otel_traces != "off" else None
        self.console_queries = ClickHouseConsoleQueries(client, evaluator, tables, otel_table=attributes_from)
        self.analyst = ClickHouseAnalyst(client, evaluator, timeout_seconds=sql_timeout_seconds, max_rows=sql_max_rows)
        self.retention = ClickHouseRetention(client, otel_table, otel_fed, cluster)
        self.scrape_health = ClickHouseScrapeHealth(client, tables)
        self.engine_facts = ClickHouseEngineFacts(client, evaluator)
        self.lease = ClickHouseLease(client, seconds=lease_seconds, cluster=cluster)
        self._otel_table = otel_table
        self._otel_traces = otel_traces
        self._followed: ClickHouseOtelTraces | None = None
        self._evaluator = evaluator
        self._closed = False

    @property
    def refusing_writes(self) -> bool:
        """Whether every write is refused for now (a full disk): readiness says so to load balancers."""
        return False  # the server's disks are its own to watch; a refused insert is retryable

    @property
    def sink(self) -> ClickHouseWriter:
        return self.writer

    @property
    def otel_traces(self) -> ClickHouseOtelTraces | None:
        """The `otel_traces` a user's Collector fills, in follow mode; None otherwise. Its cursor's table is
        created at the first use: by the process that follows, not by every receiver."""
        if self._otel_traces != "follow":
            return None
        if self._followed is None:
            self._followed = ClickHouseOtelTraces(self.client, self._otel_table, self.cluster)
        return self._followed

    @property
    def write_jobs(self) -> None:
        """None: writes are inserts from many processes, with no one writer to queue a change behind."""
        return None

    @property
    def reader(self) -> None:
        """None: reads go through the ports (and the analyst walls), never straight to the server."""
        return None

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        otel_table: str = "otel_traces",
        otel_traces: OtelTraces = "write",
        cluster: str | None = None,
        ttl_days: float | None = None,
        max_queued_spans: int = 200_000,
        max_queued_bytes: int = DEFAULT_MAX_BYTES,
        sql_timeout_seconds: float = 30,
        sql_max_rows: int = 10_000,
        lease_seconds: float = 60,
        registry: CollectorRegistry | None = None,
    ) -> ClickHouseStorage:
        client = ClickHouse(dsn)
        try:
            evaluator = Evaluator()
            full_spans = evaluator.span_columns_with_json()
            otel_fed = schema.create_all(
                client,
                evaluator.tables,
                full_spans,
                otel_table=otel_table,
                otel_traces=otel_traces,
                cluster=cluster,
                ttl_days=ttl_days,
            )
            writer = ClickHouseWriter(
                client,
                max_queued_spans=max_queued_spans,
                max_queued_bytes=max_queued_bytes,
                metrics=WriterMetrics(registry) if registry is not None else None,
            )
            writer.start()
        except BaseException:
            client.close()
            raise
        return cls(
            client,
            evaluator,
            writer,
            otel_table=otel_table,
            otel_traces=otel_traces,
            sql_timeout_seconds=sql_timeout_seconds,
            sql_max_rows=sql_max_rows,
            lease_seconds=lease_seconds,
            cluster=cluster,
            otel_fed=otel_fed,
        )

    def stop_writes(self) -> None:
        self.writer.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        self._evaluator.close()
        self.client.close()
