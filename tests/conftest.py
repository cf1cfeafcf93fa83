"""Shared fixtures: a real Tailwatch service on loopback ports, backed by a real DuckDB file."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from receivers import NATIVE_INSTALL, in_ci, require_or_skip
from waiting import HANG_GUARD, wait_until

import collector.decode
from collector import native_walk
from collector.decode import Decoder
from storage.duckdb import migrate
from storage.duckdb.backend import DuckDBStorage
from storage.duckdb.database import open_database
from tailwatch.service import Service
from tailwatch.settings import Settings, load_settings


class RunningService:
    """A Service started on its own event-loop thread, stopped (and flushed) on exit."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.service = Service(settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> RunningService:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.service.start(), self._loop).result(timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.begin_shutdown().result(timeout=60)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def begin_shutdown(self) -> concurrent.futures.Future[None]:
        """Queue the service's shutdown on its event loop, as SIGTERM does; the future ends with it."""
        return asyncio.run_coroutine_threadsafe(self.service.shutdown(), self._loop)

    def busy_loop(self, seconds: float) -> None:
        """Keep the service's event loop busy for `seconds` (as a loaded one is), from the moment this returns."""
        started = threading.Event()

        def busy() -> None:
            started.set()
            time.sleep(seconds)

        self._loop.call_soon_threadsafe(busy)
        assert started.wait(HANG_GUARD), "the event loop never ran the busy stretch"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.service.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.service.http_port}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.service.api_port}"

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.service.reader().rows(sql, params)

    def wait_committed(self) -> None:
        """Wait until every acknowledged request is committed: one the ingest spool acknowledged (the writer
        behind) is committed moments after its response, so a test reading at once could miss it."""
        wait_until(lambda: self.metric("tailwatch_writer_queued_spans") == 0, "the writer's queue to empty")

    def metric(self, name: str, **labels: str) -> float:
        value = self.service.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value


def pytest_addoption(parser: pytest.Parser) -> None:
    # An option, not an environment variable: a TAILWATCH_* variable would reach every `tailwatch` the tests
    # start, and the settings rightly refuse one they do not know.
    parser.addoption("--slow", action="store_true", help="also run the slow real-component tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow real-component tests run in CI, with `scripts/test --all`, or when their file is named; the
    everyday `scripts/test` leaves them out to stay within its ten minutes."""
    named = config.args_source == pytest.Config.ArgsSource.ARGS
    if named or in_ci() or config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def service_settings(db: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = {"db": str(db), "grpc_port": 0, "http_port": 0, "api_port": 0}
    ingest = {"decode_workers": 0, **overrides.pop("ingest", {})}
    # No reserve file (256 MiB of allocated blocks each) beside every test's database; the full-disk
    # tests that need one ask for it.
    storage = {"reserve_mb": 0, **overrides.pop("storage", {})}
    return load_settings(None, {**base, "ingest": ingest, "storage": storage, **overrides}, environ={})


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "tailwatch.duckdb"


@pytest.fixture
def storage(db_path: Path) -> Iterator[DuckDBStorage]:
    """The embedded storage on a migrated database file, closed after the test (a module may define its own)."""
    opened = DuckDBStorage.open(db_path)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def con(db_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A database file migrated to the newest schema, open read-write."""
    connection = open_database(db_path)
    migrate.upgrade(connection)
    yield connection
    connection.close()


@pytest.fixture
def service(db_path: Path) -> Iterator[RunningService]:
    with RunningService(service_settings(db_path)) as running:
        yield running


@pytest.fixture(params=list(Decoder))
def decoder(request: pytest.FixtureRequest) -> Decoder:
    """Each trace decoder in turn: the compiled one (a skip on a machine without cargo, a failure in CI)
    and the Python reference."""
    if request.param is Decoder.NATIVE and not native_walk.AVAILABLE:
        require_or_skip("the compiled decoder (tailwatch_native) is not installed", NATIVE_INSTALL)
    return Decoder(request.param)


@pytest.fixture
def each_decoder(decoder: Decoder, monkeypatch: pytest.MonkeyPatch) -> Decoder:
    """Run a test once per decoder by making it the default; a module opts in with
    `pytestmark = pytest.mark.usefixtures("each_decoder")`."""
    monkeypatch.setattr(collector.decode, "DEFAULT_DECODER", decoder)
    return decoder
