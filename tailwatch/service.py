"""Wiring and lifecycle of `tailwatch serve`: database, writer, decoders, receivers, API, schedules."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from aiohttp import web
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from collector.grpc_receiver import GrpcReceiver
from collector.http_receiver import HttpReceiver
from collector.metrics import IngestMetrics
from collector.pipeline import IngestPipeline
from collector.scrape import Scraper
from detectors.detection import DetectionPass
from detectors.notify import Notifier
from detectors.scheduler import schedule
from storage.ports import Storage, StoreReader, WriteJobs
from tailwatch.api import api_app
from tailwatch.compose import comparing, detection_pass, follower_of, notifier, open_storage, scraper
from tailwatch.connection_limits import ConnectionGuard, ConnectionMetrics, MalformedRequestFilter
from tailwatch.settings import Settings

log = logging.getLogger("tailwatch")


def _tls(settings: Settings) -> ssl.SSLContext | None:
    a = settings.api
    if a.tls_cert_file is None or a.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(a.tls_cert_file, a.tls_key_file)
    return context


class Service:
    """All long-lived parts of a running Tailwatch. `start` returns once every port listens."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.grpc_port = settings.grpc_port
        self.http_port = settings.http_port
        self.api_port = settings.api_port
        self._storage: Storage | None = None
        self._pipeline: IngestPipeline | None = None
        self._grpc: GrpcReceiver | None = None
        self._http_runner: web.AppRunner | None = None
        self._api_runner: web.AppRunner | None = None
        self._scheduler: BackgroundScheduler | None = None
        self._notifier: Notifier | None = None
        self._scraper: Scraper | None = None
        self._guards: list[ConnectionGuard] = []
        self._connection_metrics = ConnectionMetrics(self.registry)
        self._malformed_filter = MalformedRequestFilter(self._connection_metrics)
        self.detection: DetectionPass | None = None
        self._ready = False
        self._stopped = False

    @property
    def ready(self) -> bool:
        # A full disk refuses every span: a load balancer should send them to a replica that can store them.
        return self._ready and not (self._storage is not None and self._storage.refusing_writes)

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            raise RuntimeError("the service is not started")
        return self._storage

    @property
    def writer(self) -> WriteJobs:
        """The one writer of the store (DuckDB's): every change to the database goes through `writer.submit`."""
        jobs = self.storage.write_jobs
        if jobs is None:
            raise RuntimeError(f"{_store(self.settings)} has no writer of jobs: only a DuckDB file has one")
        return jobs

    def reader(self) -> StoreReader:
        """Read-only access to the running service's store (a DuckDB file's)."""
        reader = self.storage.reader
        if reader is None:
            raise RuntimeError(f"{_store(self.settings)} has no reader: only a DuckDB file has one")
        return reader

    async def start(self) -> None:
        s = self.settings
        started = time.perf_counter()
        logging.getLogger("aiohttp.server").addFilter(self._malformed_filter)
        self._storage = storage = open_storage(s, self.registry)
        ingest_metrics = IngestMetrics(self.registry)
        self._pipeline = IngestPipeline(
            storage.sink,
            ingest_metrics,
            decode_workers=s.ingest.decoder_processes(),
            max_inflight_bytes=s.ingest.max_inflight_bytes,
            normalize=s.normalize,
            engine_names=s.metrics.engine_names(),
            decoder=s.ingest.trace_decoder(),
            split_attributes=s.storage.splits_attributes(),
        )
        self._grpc = GrpcReceiver(
            self._pipeline,
            host=s.host,
            port=s.grpc_port,
            max_message_bytes=s.ingest.max_request_bytes,
            max_concurrent_requests=s.ingest.max_concurrent_requests,
            retry_after_seconds=s.ingest.retry_after_seconds,
        )
        self.grpc_port = self._grpc.port
        await self._grpc.start()
        http = HttpReceiver(
            self._pipeline,
            max_body_bytes=s.ingest.max_request_bytes,
            retry_after_seconds=s.ingest.retry_after_seconds,
            read_timeout_seconds=s.ingest.http_read_timeout_seconds,
        )
        self._http_runner, self.http_port = await self._serve(http.app(), s.http_port, "otlp_http")
        self._notifier = notifier(s, self.registry)
        self.detection = detection_pass(s, storage, sink=self._notifier, registry=self.registry)
        app = api_app(
            self.registry,
            lambda: self.ready,
            storage.alert_queries,
            self.detection,
            analyst=storage.analyst,
            console=storage.console_queries,
            incidents=storage.incident_store,
            changes=storage.change_store,
            comparing=comparing(s, storage),
            token=s.api.token.get_secret_value() if s.api.token else None,
            sql_slots=s.sql.max_concurrent,
            tls=(tls := _tls(s)) is not None,
            facts={"decoder": self._pipeline.decoder.value, "decoder_processes": str(self._pipeline.processes)},
        )
        self._api_runner, self.api_port = await self._serve(app, s.api_port, "api", tls=tls)
        self._scheduler = BackgroundScheduler(
            timezone="UTC", job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60}
        )
        if s.scheduler:
            self._schedule_upkeep(self._scheduler)
        detectors = (
            schedule(self._scheduler, self.detection, gate=self._gate, catch_up=s.catch_up) if s.scheduler else []
        )
        # Following the Collector's table is scheduler work: a receiver-only process neither follows nor takes
        # the lease from the process that does.
        follower = follower_of(s, storage) if s.scheduler else None
        if follower is not None:
            self._scheduler.add_job(
                lambda: follower.run_once(_ago(timedelta(0))) if self._holds() else 0,
                "interval",
                seconds=s.storage.clickhouse.follow_interval_seconds,
                id="follow_otel_traces",
                next_run_time=datetime.now(UTC),
            )
        self._scheduler.start()
        # Its own thread rather than a scheduler job: one hanging target must not hold up the next round.
        self._scraper = scraper(s, storage, registry=self.registry, ingest_metrics=ingest_metrics)
        if self._scraper is not None:
            self._scraper.start()
        self._ready = True
        # Decoder processes start in the background so the ports answer at once.
        asyncio.get_running_loop().run_in_executor(None, self._pipeline.warm_up)
        log.info(
            "tailwatch serving: OTLP/gRPC %s:%d, OTLP/HTTP %s:%d, API %s:%d, %s, detectors %s (%.1fs)",
            s.host, self.grpc_port, s.host, self.http_port, s.host, self.api_port, _store(s),
            ", ".join(detectors) or "none", time.perf_counter() - started,
        )  # fmt: skip

    @property
    def _gate(self) -> Callable[[], bool] | None:
        """Processes sharing one store take turns at the scheduler's jobs by its lease; a store one process owns
        has none."""
        lease = self._storage.lease if self._storage is not None else None
        return lease.hold if lease is not None else None

    def _holds(self) -> bool:
        gate = self._gate
        return gate is None or gate()

    def _schedule_upkeep(self, scheduler: BackgroundScheduler) -> None:
        s = self.settings
        scheduler.add_job(
            lambda: self.enforce_retention() if self._holds() else 0,
            "interval",
            seconds=s.storage.retention_interval_seconds,
            id="retention",
            next_run_time=datetime.now(UTC),
        )
        scheduler.add_job(
            lambda: self.settle_engine_facts() if self._holds() else 0,
            "interval",
            seconds=s.metrics.settle_interval_seconds,
            id="engine_facts",
            next_run_time=datetime.now(UTC),
        )

    async def _serve(
        self, app: web.Application, port: int, name: str, tls: ssl.SSLContext | None = None
    ) -> tuple[web.AppRunner, int]:
        ingest = self.settings.ingest
        guard = ConnectionGuard(
            name,
            idle_seconds=ingest.http_idle_timeout_seconds,
            max_connections=ingest.http_max_connections,
            metrics=self._connection_metrics,
        )
        app.middlewares.append(guard.middleware)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self.settings.shutdown_grace_seconds
        )
        await runner.setup()
        if runner.server is None:
            raise RuntimeError(f"the {name} port's runner has no server after setup")
        guard.watch(runner.server)
        guard.start()
        self._guards.append(guard)
        site = web.TCPSite(runner, self.settings.host, port, reuse_port=False, ssl_context=tls)
        await site.start()
        _host, bound = runner.addresses[0][:2]
        return runner, int(bound)

    def enforce_retention(self) -> int:
        """Delete spans past the retention age, through the writer; returns how many."""
        cutoff = _ago(timedelta(days=self.settings.storage.retention_days))
        deleted = self.storage.retention.delete_ended_before(cutoff)
        if deleted:
            log.info("retention: deleted %d spans that ended before %s", deleted, cutoff.isoformat())
        return deleted

    def settle_engine_facts(self) -> int:
        """Store the engine facts of requests whose engine metrics have arrived; returns how many spans."""
        until = _ago(timedelta(seconds=self.settings.metrics.settle_after_seconds))
        settled = self.storage.engine_facts.settle(until)
        if settled:
            log.debug("engine facts: settled %d spans that ended before %s", settled, until.isoformat())
        return settled

    async def shutdown(self) -> None:
        """Stop intake, answer what is in flight, commit everything queued, close the database. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._ready = False
        grace = self.settings.shutdown_grace_seconds
        loop = asyncio.get_running_loop()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
        lease = self._storage.lease if self._storage is not None else None
        if lease is not None and self.settings.scheduler:
            await loop.run_in_executor(None, lease.release)
        if self._scraper is not None:
            await loop.run_in_executor(None, self._scraper.stop)
        # Close both OTLP ports first; requests already inside get `grace` seconds to be answered.
        stops: list[Awaitable[None]] = [self._grpc.stop(grace)] if self._grpc else []
        if self._http_runner is not None:
            stops.append(self._http_runner.cleanup())
        await asyncio.gather(*stops)
        if self._pipeline is not None:
            await loop.run_in_executor(None, self._pipeline.close, grace)
        if self._storage is not None:
            await loop.run_in_executor(None, self._storage.stop_writes)
        if self._api_runner is not None:
            await self._api_runner.cleanup()
        for guard in self._guards:
            await guard.stop()
        logging.getLogger("aiohttp.server").removeFilter(self._malformed_filter)
        if self._notifier is not None:
            await loop.run_in_executor(None, self._notifier.flush, 5.0)
            self._notifier.close()
        if self._storage is not None:
            self._storage.close()
        log.info("tailwatch stopped")


def _store(s: Settings) -> str:
    if s.storage.backend == "clickhouse":
        return f"ClickHouse ({s.storage.clickhouse.otel_traces} {s.storage.clickhouse.otel_table})"
    return f"database {s.db}"


def _ago(age: timedelta) -> datetime:
    """Now minus `age`, as the naive UTC time the storage compares span and point times with."""
    return (datetime.now(UTC) - age).replace(tzinfo=None)
