"""Scrape mode: Tailwatch reads the engines' Prometheus endpoints itself, for fleets without a Collector.

Every `metrics.interval_seconds` each configured target is fetched, all of them at once, on one event
loop in a thread of its own. A scheduler job per round (APScheduler, max_instances=1) would let one
hanging target hold the job and so skip the next round for every target; here each target's scrape is
its own task under its own timeout, a round never waits for a slow target to start the others, and
only a target still in flight when its next round comes is skipped for that round.

A page is parsed by prometheus_client's parser and fed to `PointColumns`, the same rules the OTLP
decoder follows; its batch goes to the sink as soon as that target is done. After each round one row
per scraped target goes to `ScrapeHealth`. A target that fails is down for the round with a short
reason; nothing else is affected.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from collector.decode import Decoded, Signal
from collector.engine_names import EngineNames, Kind
from collector.engine_points import Origin, Point, PointColumns, Temporality
from collector.metrics import IngestMetrics
from collector.normalize import Plan
from collector.scores import score_table
from model.columns import MAX_TIME_NS
from model.thread_names import name_this_thread
from storage.ports import ScrapeHealth, SpanSink, TargetHealth

log = logging.getLogger(__name__)
T = TypeVar("T")

SOURCE = "scrape"
OK = "ok"
# The Prometheus text format, the one the parser reads; engines built on prometheus_client answer
# OpenMetrics only when asked for it.
_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
_CREATED = "_created"
# Series labels that name a bucket or a quantile, not the series.
_PART_LABELS = frozenset(("le", "quantile"))
# OpenMetrics types with nothing to store; counted as ignored, like OTLP summaries.
_IGNORED_TYPES = frozenset(("summary", "info", "stateset", "gaugehistogram"))
_GAUGE_TYPES = frozenset(("gauge", "unknown", "untyped"))


class Failure(StrEnum):
    """Why a scrape stored nothing (besides `http_<status>`); the `outcome` label and `last_error`."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    PARSE_ERROR = "parse_error"
    OVERLOADED = "overloaded"
    SKIPPED = "skipped"  # still in flight from the round before; counted, no row


class Target(Protocol):
    """One configured target (tailwatch.settings.ScrapeTarget)."""

    @property
    def url(self) -> str: ...
    @property
    def replica(self) -> str | None: ...
    @property
    def deployment(self) -> str | None: ...


class ScrapeMetrics:
    def __init__(self, registry: CollectorRegistry, urls: Iterable[str]) -> None:
        self.up = Gauge(
            "tailwatch_scrape_target_up",
            "1 if the target's last scrape answered with a page, else 0.",
            ["target"],
            registry=registry,
        )
        self.scrapes = Counter(
            "tailwatch_scrapes",
            "Scrapes by target and outcome: ok, or why nothing was stored (timeout, http_<status>, ...).",
            ["target", "outcome"],
            registry=registry,
        )
        self.seconds = Gauge(
            "tailwatch_scrape_duration_seconds",
            "How long the target's last scrape took, fetch and parse.",
            ["target"],
            registry=registry,
        )
        self.points = Counter(
            "tailwatch_scrape_points",
            "Metric data points scraped from the target and handed to storage.",
            ["target"],
            registry=registry,
        )
        for url in urls:
            self.points.labels(url)
            for outcome in (OK, *Failure):
                self.scrapes.labels(url, outcome)


def resource(url: str, deployment: str | None) -> dict[str, Any]:
    """The resource a target's points carry: named by its address, as a Collector's scrape would."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {
        "service.name": deployment or host,
        "service.instance.id": address,
        "server.address": host,
        "server.port": port,
    }


def _ns(seconds: float) -> int:
    # A time no timestamp can hold is passed on as one, for PointColumns to reject as invalid_time.
    if not math.isfinite(seconds) or seconds * 1e9 > MAX_TIME_NS:
        return MAX_TIME_NS + 1
    return round(seconds * 1e9)


def _series(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k not in _PART_LABELS)


def feed_page(families: Sequence[Metric], points: PointColumns, origin: Origin, now: float) -> int:
    """Feed a parsed page to `points`; returns how many series were ignored.

    A sample's own timestamp wins over `now` (the scrape time). `<name>_created` samples are start times
    of the counter or histogram `<name>`, whether inside its family or (Prometheus text) a gauge of their
    own; they are not stored as points.
    """
    with_start = {f.name for f in families if f.type in ("counter", "histogram")}
    starts: dict[tuple[str, frozenset[tuple[str, str]]], int] = {}
    for f in families:
        for s in f.samples:
            base = s.name.removesuffix(_CREATED)
            if base != s.name and base in with_start and math.isfinite(s.value):
                starts[(base, _series(s.labels))] = _ns(s.value)
    ignored = 0
    for f in families:
        if f.type == "counter":
            # The parser drops `_total` from a counter's family name; the sample keeps the exposed name.
            for s in f.samples:
                if s.name == f.name + "_total":
                    start = starts.get((f.name, _series(s.labels)), 0)
                    time_ns = _ns(now if s.timestamp is None else float(s.timestamp))
                    point = Point(s.name, Kind.COUNTER, Temporality.CUMULATIVE, time_ns, start, dict(s.labels),
                                  float(s.value))  # fmt: skip
                    points.add(origin, point)
        elif f.type == "histogram":
            _histogram(f, points, origin, now, starts)
        elif f.type in _GAUGE_TYPES:
            if f.name.endswith(_CREATED) and f.name.removesuffix(_CREATED) in with_start:
                continue
            for s in f.samples:
                time_ns = _ns(now if s.timestamp is None else float(s.timestamp))
                point = Point(s.name, Kind.GAUGE, Temporality.GAUGE, time_ns, 0, dict(s.labels), float(s.value))
                points.add(origin, point)
        elif f.type in _IGNORED_TYPES:
            ignored += len({_series(s.labels) for s in f.samples})
    return ignored


def _histogram(
    f: Metric,
    points: PointColumns,
    origin: Origin,
    now: float,
    starts: dict[tuple[str, frozenset[tuple[str, str]]], int],
) -> None:
    """One point per series from its `_sum` and `_count`; buckets are not stored."""
    series: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}
    for s in f.samples:
        part = s.name.removeprefix(f.name)
        if part not in ("_sum", "_count"):
            continue
        key = _series(s.labels)
        one = series.setdefault(key, {"labels": {k: v for k, v in s.labels.items() if k not in _PART_LABELS}})
        one[part] = float(s.value)
        if s.timestamp is not None:
            one.setdefault("time", float(s.timestamp))
    for key, one in series.items():
        time_ns = _ns(one.get("time", now))
        start = starts.get((f.name, key), 0)
        point = Point(f.name, Kind.HISTOGRAM, Temporality.CUMULATIVE, time_ns, start, one["labels"],
                      one.get("_sum", math.nan), one.get("_count"))  # fmt: skip
        points.add(origin, point)


class Scraper:
    """Scrapes `targets` every `names.interval_seconds` on its own thread; `stop` ends it."""

    def __init__(
        self,
        targets: Sequence[Target],
        *,
        names: EngineNames,
        plan: Plan,
        sink: SpanSink,
        health: ScrapeHealth,
        timeout_seconds: float,
        registry: CollectorRegistry | None = None,
        ingest_metrics: IngestMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._targets = list(targets)
        self._resources = [resource(t.url, t.deployment) for t in self._targets]
        self._names = names
        self._plan = plan
        self._sink = sink
        self._health = health
        self._timeout = timeout_seconds
        self._metrics = ScrapeMetrics(registry, (t.url for t in self._targets)) if registry is not None else None
        self._ingest = ingest_metrics
        self._clock = clock
        self._in_flight: set[int] = set()  # target indexes; touched on the loop only
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="tailwatch-scraper", daemon=True)

    def _run_loop(self) -> None:
        name_this_thread()
        self._loop.run_forever()

    def start(self, *, rounds: bool = True) -> None:
        """Start the scraper's thread; with `rounds`, a round now and every interval after."""
        self._thread.start()
        self._call(self._open(rounds))

    def scrape_once(self) -> list[TargetHealth]:
        """Run one round now and wait for it: the rows of the targets scraped (in-flight ones are skipped)."""
        return self._call(self.round())

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel scrapes in flight, close the connections and end the thread. Idempotent."""
        if not self._thread.is_alive():
            return
        self._call(self._close(), timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _open(self, rounds: bool) -> None:
        # No connection limit: a pool shared by all targets would make the hanging ones queue the rest.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), headers={"Accept": _ACCEPT}, trust_env=False
        )
        if rounds:
            self._spawn(self._every_interval())

    async def _close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a scrape round failed", exc_info=task.exception())

    async def _every_interval(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._names.interval_seconds
        next_at = loop.time()
        while True:
            self._spawn(self.round())
            next_at += interval
            now = loop.time()
            # Rounds missed while the loop was held up are skipped, not run back to back.
            next_at = max(next_at, now)
            await asyncio.sleep(next_at - now)

    async def round(self) -> list[TargetHealth]:
        due = []
        for i, target in enumerate(self._targets):
            if i in self._in_flight:
                self._count(target.url, Failure.SKIPPED)
            else:
                due.append(i)
        self._in_flight.update(due)
        rows = list(await asyncio.gather(*(self._scrape(i) for i in due)))
        if rows:
            self._health.record(rows)
        return rows

    async def _scrape(self, i: int) -> TargetHealth:
        target = self._targets[i]
        started = time.perf_counter()
        now = self._clock()
        points = PointColumns(self._names, self._plan, SOURCE)
        origin = points.origin(self._resources[i], replica_id=target.replica, deployment=target.deployment)
        try:
            body = await self._fetch(target.url)
        finally:
            self._in_flight.discard(i)
        if isinstance(body, bytes):
            # Parsed off the loop: a large page must not hold up the other targets' answers and timeouts.
            error = await asyncio.to_thread(self._read, body, points, origin, now)
        else:
            error = body
        up = error is None or error == Failure.OVERLOADED
        stored = points.points if error is None else 0
        seconds = time.perf_counter() - started
        if self._metrics is not None:
            self._metrics.up.labels(target.url).set(1 if up else 0)
            self._metrics.seconds.labels(target.url).set(seconds)
            self._metrics.points.labels(target.url).inc(stored)
        self._count(target.url, error or OK)
        at = datetime.fromtimestamp(now, UTC).replace(tzinfo=None)
        return TargetHealth(target.url, origin.replica_id, origin.deployment, up, at, error, stored, seconds)

    async def _fetch(self, url: str) -> bytes | str:
        """The page, or why there is none."""
        if self._session is None:
            raise RuntimeError("the scraper is not started")
        try:
            async with asyncio.timeout(self._timeout), self._session.get(url) as response:
                if not 200 <= response.status < 300:
                    return f"http_{response.status}"
                return await response.read()
        except TimeoutError:
            return Failure.TIMEOUT.value
        except (aiohttp.ClientError, OSError):
            return Failure.CONNECTION.value

    def _read(self, body: bytes, points: PointColumns, origin: Origin, now: float) -> str | None:
        """Parse the page and hand its points to the sink; why nothing was stored, or None."""
        try:
            families = list(text_string_to_metric_families(body.decode()))
        except Exception:  # noqa: BLE001 - a third-party parser of untrusted text: whatever it raises, the page is unreadable
            return Failure.PARSE_ERROR.value
        ignored = feed_page(families, points, origin, now)
        table = points.table()
        if self._ingest is not None:
            decoded = Decoded(Signal.METRICS, None, score_table([]), points.rejections, ignored, metrics=table,
                              points=points.points, unjoined=points.unjoined)  # fmt: skip
            self._ingest.count_decoded(decoded, SOURCE)
        if table.num_rows and self._sink.try_submit(None, None, table) is None:
            return Failure.OVERLOADED.value
        return None

    def _count(self, url: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.scrapes.labels(url, outcome).inc()
