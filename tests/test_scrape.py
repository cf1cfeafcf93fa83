"""Scrape mode: engines' Prometheus pages read by Tailwatch itself, over real HTTP on loopback, into a real DuckDB file.

The scraper is driven a round at a time (`scrape_once`) with an injected clock; servers report what they
saw, so concurrency is asserted on the order of events, never on how long anything took.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import RunningService, service_settings
from prometheus_client import CollectorRegistry
from test_engine_join import DEPLOYMENT, request_span, store_spans
from test_thread_names import kernel_names
from waiting import HANG_GUARD, WriterHold, join, wait_until

from collector.engine_names import VLLM_METRICS, Kind
from collector.metrics import IngestMetrics
from collector.normalize import NormalizeConfig, build_plan
from collector.scrape import Failure, ScrapeMetrics, Scraper
from storage.duckdb.backend import DuckDBStorage
from storage.ports import Requests, TargetHealth, Window
from tailwatch.settings import MetricsSettings, ScrapeTarget

DOCS = Path(__file__).resolve().parent.parent / "docs"
NOW = 1_767_225_600.0  # 2026-01-01 00:00 UTC
AT = datetime(2026, 1, 1)
CREATED = 1_767_225_000.0  # ten minutes earlier
STARTED = datetime(2025, 12, 31, 23, 50)

# What vLLM's prometheus_client exposes: `_created` comes as a gauge of its own in the text format.
VLLM_PAGE = f"""\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} 1000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{{engine="0",model_name="m"}} {CREATED}
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{{engine="0",le="1.0",model_name="m"}} 0.0
vllm:iteration_tokens_total_bucket{{engine="0",le="8.0",model_name="m"}} 1.0
vllm:iteration_tokens_total_bucket{{engine="0",le="16.0",model_name="m"}} 2.0
vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="m"}} 2.0
vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} 2.0
vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} 17.0
# HELP vllm:iteration_tokens_total_created Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total_created gauge
vllm:iteration_tokens_total_created{{engine="0",model_name="m"}} {CREATED}
"""
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'


class Endpoint:
    """A real HTTP server on loopback answering every GET with `status` and `body`; both may change."""

    def __init__(self, body: str = WAITING, status: int = 200) -> None:
        self.body = body
        self.status = status
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                payload = endpoint.body.encode()
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Held:
    """An engine that takes a request and answers only once released (with `page`), or never (page None)."""

    def __init__(self, page: str | None = None) -> None:
        self.page = page
        self.release = threading.Event()
        self.hung_up = threading.Event()  # the scraper closed a connection this server never answered
        self._lock = threading.Lock()
        self._requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/metrics"

    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                with self._lock:
                    self._requests += 1
                if self.page is None:
                    while conn.recv(4096):
                        pass
                    self.hung_up.set()
                    return
                self.release.wait(2 * HANG_GUARD)
                body = self.page.encode()
                head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
                conn.sendall(head.encode() + body)
            except OSError:
                return

    def close(self) -> None:
        self.release.set()
        self._sock.close()


def refused_url() -> str:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[DuckDBStorage]:
    s = DuckDBStorage.open(tmp_path / "scrape.duckdb", max_queued_spans=10_000)
    yield s
    s.close()


@pytest.fixture
def servers() -> Iterator[Callable[[Any], Any]]:
    opened: list[Endpoint | Held] = []

    def server(s: Any) -> Any:
        opened.append(s)
        return s

    yield server
    for s in opened:
        s.close()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


ScraperFactory = Callable[..., Scraper]


@pytest.fixture
def scraper(storage: DuckDBStorage, registry: CollectorRegistry) -> Iterator[ScraperFactory]:
    started: list[Scraper] = []

    def make(targets: list[ScrapeTarget], *, timeout: float = HANG_GUARD, clock: Clock | None = None) -> Scraper:
        s = Scraper(
            targets,
            names=MetricsSettings().engine_names(),
            plan=build_plan(NormalizeConfig()),
            sink=storage.sink,
            health=storage.scrape_health,
            timeout_seconds=timeout,
            registry=registry,
            ingest_metrics=IngestMetrics(registry),
            clock=clock or Clock(),
        )
        s.start(rounds=False)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def settled(storage: DuckDBStorage) -> None:
    """Wait until everything handed to the writer so far is committed (it works in order)."""
    storage.writer.submit(lambda _con: None).result(HANG_GUARD)


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def target_rows(storage: DuckDBStorage) -> dict[str, tuple[Any, ...]]:
    rows = storage.reader.rows(
        "SELECT url, replica_id, deployment, up, last_scrape, last_success, last_error, points FROM scrape_targets"
    )
    return {r[0]: r[1:] for r in rows}


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_vllm_page_lands_in_engine_metrics_under_canonical_names(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    engine = servers(Endpoint(VLLM_PAGE))
    s = scraper([ScrapeTarget(url=engine.url, replica="pod-a", deployment="llama")])
    [health] = s.scrape_once()
    settled(storage)
    rows = storage.reader.rows(
        "SELECT name, metric, kind, value, time, start_time, replica_id, deployment, model, engine, source, "
        "interval_s FROM engine_metrics ORDER BY name"
    )
    shared = ("pod-a", "llama", "m", "0", "scrape", 5.0)
    assert rows == [
        ("vllm:iteration_tokens_total_count", "step_tokens_count", "cumulative", 2.0, AT, STARTED, *shared),
        ("vllm:iteration_tokens_total_sum", "step_tokens_sum", "cumulative", 17.0, AT, STARTED, *shared),
        ("vllm:kv_cache_usage_perc", "kv_cache_usage", "gauge", 0.25, AT, None, *shared),
        ("vllm:num_requests_waiting", "requests_waiting", "gauge", 3.0, AT, None, *shared),
        ("vllm:prefix_cache_queries_total", "prefix_cache_queries", "cumulative", 1000.0, AT, STARTED, *shared),
    ]
    port = engine.url.split(":")[2].split("/")[0]
    [(resource,)] = storage.reader.rows("SELECT DISTINCT resource FROM engine_metrics")
    assert json.loads(resource) == {
        "service.name": "llama",
        "service.instance.id": f"127.0.0.1:{port}",
        "server.address": "127.0.0.1",
        "server.port": int(port),
    }
    assert health == TargetHealth(engine.url, "pod-a", "llama", True, AT, None, 4, health.seconds)
    assert target_rows(storage) == {engine.url: ("pod-a", "llama", True, AT, AT, None, 4)}


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone five and a half hours from UTC, for the test's length."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_scrape_is_stamped_in_utc_whatever_the_host_s_time_zone(
    far_from_utc: None, storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    engine = servers(Endpoint(VLLM_PAGE))
    [health] = scraper([ScrapeTarget(url=engine.url, replica="pod-a", deployment="llama")]).scrape_once()
    assert health.scraped_at == AT
    settled(storage)
    assert target_rows(storage)[engine.url][3:5] == (AT, AT)


# What a real vLLM 0.32.0 answered while a burst queued (tests/data/vllm-0.32.0/README.md).
VLLM_032_PAGE = (Path(__file__).parent / "data" / "vllm-0.32.0" / "metrics-during-burst.txt").read_text()


def test_a_real_vllm_0_32_page_yields_its_canonical_points_with_waiting_kept_by_reason(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    engine = servers(Endpoint(VLLM_032_PAGE))
    scraper([ScrapeTarget(url=engine.url, replica="pod-a", deployment="llama")]).scrape_once()
    settled(storage)
    rows = storage.reader.rows(
        "SELECT metric, attributes->>'reason', value, kind FROM engine_metrics WHERE metric IS NOT NULL "
        "ORDER BY metric, attributes->>'reason'"
    )
    assert rows == [
        ("kv_cache_usage", None, 0.3492063492063492, "gauge"),
        ("preemptions", None, 0.0, "cumulative"),
        ("prefix_cache_hits", None, 0.0, "cumulative"),
        ("prefix_cache_queries", None, 6258.0, "cumulative"),
        ("prompt_tokens", None, 6258.0, "cumulative"),
        ("prompt_tokens_cached", None, 0.0, "cumulative"),
        ("queue_time_count", None, 12.0, "cumulative"),
        ("queue_time_sum", None, 0.0003848289998131804, "cumulative"),
        ("requests_running", None, 3.0, "gauge"),
        ("requests_waiting", None, 16.0, "gauge"),
        ("requests_waiting_by_reason", "capacity", 16.0, "gauge"),
        ("requests_waiting_by_reason", "deferred", 0.0, "gauge"),
        ("step_tokens_count", None, 792.0, "cumulative"),
        ("step_tokens_sum", None, 7815.0, "cumulative"),
    ]
    # Every point of the page is one row, whether Tailwatch joins its name or not.
    labels = "SELECT DISTINCT model, engine, replica_id FROM engine_metrics WHERE metric IS NOT NULL"
    assert storage.reader.rows(labels) == [("tiny-llama", "0", "pod-a")]


def test_waiting_by_reason_is_not_added_into_the_queue_depth_of_a_request(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    # The page's reasons sum to its 16 waiting requests: the request that arrived after it met 16, not 32.
    engine = servers(Endpoint(VLLM_032_PAGE))
    scraper([ScrapeTarget(url=engine.url, replica="pod-a", deployment=DEPLOYMENT)]).scrape_once()
    store_spans(storage, [request_span(1, "pod-a", AT + timedelta(seconds=2), AT + timedelta(seconds=4))])
    window = Window(AT - timedelta(minutes=5), AT + timedelta(minutes=5))
    table = storage.windows.requests(Requests(window, ("queue_depth", "running_requests", "kv_cache_usage")))
    assert table.select(["queue_depth", "running_requests", "kv_cache_usage"]).to_pylist() == [
        {"queue_depth": 16, "running_requests": 3, "kv_cache_usage": 0.3492063492063492}
    ]


def test_every_family_of_a_real_vllm_0_32_page_is_in_the_vllm_table_with_its_kind() -> None:
    # The table the Grafana dashboard and the names table are held to, against what vLLM itself registers.
    kinds = {"gauge": Kind.GAUGE, "counter": Kind.COUNTER, "histogram": Kind.HISTOGRAM}
    families: dict[str, Kind] = {}
    for line in VLLM_032_PAGE.splitlines():
        if line.startswith("# TYPE vllm:") and not line.split()[2].endswith("_created"):
            _, _, name, kind = line.split()
            families[name.removesuffix("_total") if kind == "counter" else name] = kinds[kind]
    assert len(families) == 39
    deprecated = {"vllm:gpu_cache_usage_perc": Kind.GAUGE}  # gone from 0.32's page, still sent by older engines
    assert families == {k: v for k, v in VLLM_METRICS.items() if k not in deprecated}


def test_an_unnamed_target_is_named_by_its_address(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    engine = servers(Endpoint())
    scraper([ScrapeTarget(url=engine.url)]).scrape_once()
    settled(storage)
    address = engine.url.removeprefix("http://").removesuffix("/metrics")
    assert storage.reader.rows("SELECT replica_id, deployment FROM engine_metrics") == [(address, "127.0.0.1")]
    assert target_rows(storage)[engine.url][:2] == (address, "127.0.0.1")


def test_a_sample_timestamp_wins_over_the_scrape_time(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    page = 'vllm:num_requests_running{engine="0"} 2 1767225590000\nvllm:num_requests_waiting{engine="0"} 1\n'
    engine = servers(Endpoint(page))
    scraper([ScrapeTarget(url=engine.url)]).scrape_once()
    settled(storage)
    assert storage.reader.rows("SELECT metric, time FROM engine_metrics ORDER BY metric") == [
        ("requests_running", datetime(2025, 12, 31, 23, 59, 50)),
        ("requests_waiting", AT),
    ]


def test_a_counter_s_a_gauge_s_and_a_histogram_s_own_timestamps_win_over_the_scrape_time(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    # Each kind is fed by its own branch; each stamps its sample 10, 20 and 30 s before the scrape. The
    # preemptions counter carries none and takes the scrape time.
    page = """\
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0"} 42 1767225590000
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.5 1767225580000
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf"} 2.0 1767225570000
vllm:iteration_tokens_total_count{engine="0"} 2.0 1767225570000
vllm:iteration_tokens_total_sum{engine="0"} 17.0 1767225570000
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0"} 1
"""
    engine = servers(Endpoint(page))
    scraper([ScrapeTarget(url=engine.url)]).scrape_once()
    settled(storage)
    assert storage.reader.rows("SELECT name, time FROM engine_metrics ORDER BY name") == [
        ("vllm:iteration_tokens_total_count", datetime(2025, 12, 31, 23, 59, 30)),
        ("vllm:iteration_tokens_total_sum", datetime(2025, 12, 31, 23, 59, 30)),
        ("vllm:kv_cache_usage_perc", datetime(2025, 12, 31, 23, 59, 40)),
        ("vllm:num_preemptions_total", AT),
        ("vllm:prompt_tokens_total", datetime(2025, 12, 31, 23, 59, 50)),
    ]


def test_non_finite_values_are_rejected_and_counted_and_the_rest_of_the_page_stored(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any], registry: CollectorRegistry
) -> None:
    page = (
        'vllm:num_requests_waiting{engine="0"} NaN\n'
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0"} +Inf\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
        "# TYPE rpc_seconds summary\n"
        'rpc_seconds{quantile="0.5"} 0.1\nrpc_seconds{quantile="0.9"} 0.3\nrpc_seconds_sum 4\nrpc_seconds_count 20\n'
    )
    engine = servers(Endpoint(page))
    [health] = scraper([ScrapeTarget(url=engine.url)]).scrape_once()
    settled(storage)
    assert storage.reader.rows("SELECT metric, value FROM engine_metrics") == [("kv_cache_usage", 0.5)]
    assert (health.up, health.error, health.points) == (True, None, 1)
    assert sample(registry, "tailwatch_metric_points_rejected_total", reason="non_finite_value") == 2
    assert sample(registry, "tailwatch_metric_points_ignored_total") == 1
    assert sample(registry, "tailwatch_metric_points_received_total", transport="scrape") == 4
    assert sample(registry, "tailwatch_scrape_points_total", target=engine.url) == 1


def test_bad_targets_are_down_with_their_reason_while_the_good_one_lands(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any], registry: CollectorRegistry
) -> None:
    good = servers(Endpoint())
    hanging = servers(Held())
    garbage = servers(Endpoint("<html><body>502 Bad Gateway</body></html>"))
    failing = servers(Endpoint("internal error", status=500))
    refused = refused_url()
    urls = [good.url, hanging.url, garbage.url, failing.url, refused]
    s = scraper([ScrapeTarget(url=u, replica=f"pod-{i}") for i, u in enumerate(urls)], timeout=5.0)
    thread, out = in_background(s.scrape_once)

    wait_until(lambda: storage.reader.rows("SELECT count(*) FROM engine_metrics")[0][0], "the good target's points")
    # The good target's points are stored while the hanging one is still in flight, not after its timeout.
    assert hanging.requests == 1
    assert not hanging.hung_up.is_set()
    join(thread, "the round to end at the hanging target's timeout")
    wait_until(hanging.hung_up.is_set, "the scraper to hang up on the hanging target")

    errors = {"pod-0": None, "pod-1": "timeout", "pod-2": "parse_error", "pod-3": "http_500", "pod-4": "connection"}
    assert {h.replica_id: (h.up, h.error) for h in out[0]} == {r: (e is None, e) for r, e in errors.items()}
    settled(storage)
    rows = target_rows(storage)
    for i, url in enumerate(urls):
        error = errors[f"pod-{i}"]
        up, last_success = error is None, AT if error is None else None
        assert rows[url] == (f"pod-{i}", "127.0.0.1", up, AT, last_success, error, 1 if up else 0), url
        assert sample(registry, "tailwatch_scrape_target_up", target=url) == (1 if up else 0)
        assert sample(registry, "tailwatch_scrapes_total", target=url, outcome=error or "ok") == 1
    assert storage.reader.rows("SELECT DISTINCT replica_id FROM engine_metrics") == [("pod-0",)]


def test_targets_are_scraped_at_the_same_time(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    first, second = servers(Held(WAITING)), servers(Held(WAITING))
    s = scraper([ScrapeTarget(url=first.url), ScrapeTarget(url=second.url)])
    thread, out = in_background(s.scrape_once)
    # One after the other, the second would get no request while the first is held.
    wait_until(lambda: first.requests == 1 and second.requests == 1, "both targets to be asked at once")
    first.release.set()
    second.release.set()
    join(thread, "the round")
    assert [(h.up, h.error, h.points) for h in out[0]] == [(True, None, 1), (True, None, 1)]


def test_a_target_still_in_flight_is_skipped_by_the_next_round_and_the_others_go_on(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any], registry: CollectorRegistry
) -> None:
    slow, fast = servers(Held(WAITING)), servers(Endpoint())
    s = scraper([ScrapeTarget(url=slow.url), ScrapeTarget(url=fast.url)])
    thread, out = in_background(s.scrape_once)
    wait_until(lambda: slow.requests == 1, "the slow target to be asked")
    # The fast target's first answer must be in too: a slow machine may still have it in flight as well.
    wait_until(
        lambda: sample(registry, "tailwatch_scrapes_total", target=fast.url, outcome="ok") == 1,
        "the fast target's first answer",
    )

    assert [h.url for h in s.scrape_once()] == [fast.url]
    assert sample(registry, "tailwatch_scrapes_total", target=slow.url, outcome="skipped") == 1
    assert slow.requests == 1
    slow.release.set()
    join(thread, "the first round")
    assert [(h.url, h.error) for h in out[0]] == [(slow.url, None), (fast.url, None)]
    assert sample(registry, "tailwatch_scrapes_total", target=fast.url, outcome="ok") == 2


def test_a_target_that_goes_down_keeps_its_last_success(
    storage: DuckDBStorage, scraper: ScraperFactory, servers: Callable[[Any], Any]
) -> None:
    engine = servers(Endpoint())
    clock = Clock()
    s = scraper([ScrapeTarget(url=engine.url, replica="pod-a")], clock=clock)
    s.scrape_once()
    engine.status = 503
    clock.now = NOW + 5
    s.scrape_once()
    settled(storage)
    later = datetime(2026, 1, 1, 0, 0, 5)
    assert target_rows(storage) == {engine.url: ("pod-a", "127.0.0.1", False, later, AT, "http_503", 0)}
    engine.status = 200
    clock.now = NOW + 10
    s.scrape_once()
    settled(storage)
    then = datetime(2026, 1, 1, 0, 0, 10)
    assert target_rows(storage)[engine.url] == ("pod-a", "127.0.0.1", True, then, then, None, 1)


def test_a_scrape_the_writer_cannot_take_is_dropped_and_counted(
    tmp_path: Path, servers: Callable[[Any], Any], registry: CollectorRegistry
) -> None:
    engine = servers(Endpoint())
    storage = DuckDBStorage.open(tmp_path / "full.duckdb", max_queued_spans=1)
    s = Scraper(
        [ScrapeTarget(url=engine.url)],
        names=MetricsSettings().engine_names(),
        plan=build_plan(NormalizeConfig()),
        sink=storage.sink,
        health=storage.scrape_health,
        timeout_seconds=HANG_GUARD,
        registry=registry,
        clock=Clock(),
    )
    s.start(rounds=False)
    try:
        with WriterHold(storage.writer):
            first = s.scrape_once()  # queued behind the held job: the queue is now full
            second = s.scrape_once()
        settled(storage)
        assert [(h.up, h.error, h.points) for h in (*first, *second)] == [(True, None, 1), (True, "overloaded", 0)]
        assert sample(registry, "tailwatch_scrapes_total", target=engine.url, outcome="overloaded") == 1
        assert storage.reader.rows("SELECT count(*) FROM engine_metrics") == [(1,)]
        assert target_rows(storage)[engine.url][2:] == (True, AT, AT, "overloaded", 0)
    finally:
        s.stop()
        storage.close()


def test_the_service_scrapes_its_targets_until_it_stops(db_path: Path, servers: Callable[[Any], Any]) -> None:
    engine = servers(Endpoint(VLLM_PAGE))
    refused = refused_url()
    scrape = {"targets": [{"url": engine.url, "replica": "pod-a", "deployment": "llama"}, {"url": refused}]}
    settings = service_settings(db_path, metrics={"interval_seconds": 0.2, "scrape": {"timeout_seconds": 5, **scrape}})
    with RunningService(settings) as svc:
        wait_until(lambda: len(svc.rows("SELECT url FROM scrape_targets")) == 2, "a round of both targets")
        wait_until(
            lambda: svc.rows("SELECT count(DISTINCT time) FROM engine_metrics WHERE replica_id = 'pod-a'")[0][0] >= 2,
            "a second round",
        )
        with urllib.request.urlopen(f"{svc.api_url}/metrics", timeout=HANG_GUARD) as response:
            text = response.read().decode()
        assert f'tailwatch_scrape_target_up{{target="{engine.url}"}} 1.0' in text
        assert f'tailwatch_scrape_target_up{{target="{refused}"}} 0.0' in text
        assert svc.rows("SELECT url, up, last_error FROM scrape_targets ORDER BY up") == [
            (refused, False, "connection"),
            (engine.url, True, None),
        ]
        assert svc.rows("SELECT DISTINCT source, deployment, interval_s FROM engine_metrics") == [
            ("scrape", "llama", 0.2)
        ]


def test_the_scrapers_thread_is_named_for_top(scraper: ScraperFactory, servers: Callable[[Any], Any]) -> None:
    scraper([ScrapeTarget(url=servers(Endpoint()).url)])
    assert "tw-scraper" in kernel_names(os.getpid())


def test_every_scrape_metric_and_outcome_is_documented() -> None:
    registry = CollectorRegistry()
    ScrapeMetrics(registry, ["http://engine:8000/metrics"])
    text = (DOCS / "engine-metrics.md").read_text()
    for metric in registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        assert f"`{name}`" in text, name
    for failure in (*Failure, "http_<status>"):
        assert f"`{failure}`" in text, failure
