"""The pass's failure isolation: a detector that raises is recorded and counted, and the pass goes on."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import service_settings
from prometheus_client import CollectorRegistry
from waiting import HANG_GUARD

from detectors.base import Detection, Window
from detectors.detection import DetectionPass, DetectorMetrics
from detectors.registry import REGISTRY
from storage.duckdb.backend import DuckDBStorage
from storage.duckdb.readers import Reader
from storage.duckdb.writer import Writer

AT = datetime(2026, 11, 20, 12, 0)
WINDOW = Window(
    datetime(2026, 11, 20, 11, 54, 30), datetime(2026, 11, 20, 11, 59, 30)
)  # the default 5 min, 30 s settle


def explode(frames: dict[str, pl.DataFrame], config: Any, window: Window) -> Detection:
    raise RuntimeError("the decode figures are inconsistent")


@pytest.fixture
def failing_token_latency(monkeypatch: pytest.MonkeyPatch) -> None:
    """token_latency, first in every pass, with a detect that raises: same key, inputs, config and table."""
    monkeypatch.setitem(REGISTRY, "token_latency", dataclasses.replace(REGISTRY["token_latency"], detect=explode))


@dataclass
class Store:
    """A migrated database with its one writer, and a pass over it with the default detector configs."""

    reader: Reader
    writer: Writer
    detection: DetectionPass
    metrics: CollectorRegistry

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.reader.rows(sql, params)

    def runs(self, detector: str, outcome: str) -> float:
        value = self.metrics.get_sample_value(
            "tailwatch_detector_runs_total", {"detector": detector, "outcome": outcome}
        )
        return 0.0 if value is None else value


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    # No service: its scheduler would add evaluations of its own to the counts these tests check.
    storage = DuckDBStorage.open(db_path)
    metrics = CollectorRegistry()
    configs = service_settings(db_path).detector_configs()
    detection = DetectionPass(storage.windows, storage.detector_store, configs, metrics=DetectorMetrics(metrics))
    try:
        yield Store(storage.reader, storage.writer, detection, metrics)
    finally:
        storage.close()


def plant_firing_alert(store: Store) -> None:
    def plant(con: Any) -> None:
        con.execute(
            """INSERT INTO alerts VALUES ('a1', 'token_latency', 'fp1', 'critical', 'firing',
               '{"deployment": "vllm-a", "model": "llama"}', 'tpot p99 is 3.1x the baseline', 3.1, 2.0,
               '2026-11-20 11:49:30', '2026-11-20 11:54:30', '2026-11-20 11:55', NULL, '2026-11-20 11:55')"""
        )
        con.execute("INSERT INTO alert_conditions VALUES ('fp1', 'token_latency', 1, '2026-11-20 11:55')")

    store.writer.submit(plant).result(timeout=HANG_GUARD)


def test_a_detector_that_raises_is_recorded_and_counted_and_the_rest_of_the_pass_still_runs(
    store: Store, failing_token_latency: None
) -> None:
    results = store.detection.run(AT)

    assert [r.detector for r in results] == list(REGISTRY)  # the whole pass ran, in registry order
    failed = results[0]
    assert (failed.detector, failed.outcome, failed.window) == ("token_latency", "error", WINDOW)
    assert failed.error == "RuntimeError: the decode figures are inconsistent"
    assert [r.detector for r in results if r.outcome != "ok"] == ["token_latency"], [r.error for r in results]

    [run] = store.rows(
        """SELECT evaluated_at, window_start, window_end, outcome, seconds, rows, conditions, error
           FROM detector_runs WHERE detector = 'token_latency' AND evaluated_at = ?""",
        [AT],
    )
    evaluated_at, start, end, outcome, seconds, rows, conditions, error = run
    assert (evaluated_at, start, end, outcome) == (AT, WINDOW.start, WINDOW.end, "error")
    assert seconds == pytest.approx(failed.seconds)
    assert (rows, conditions, error) == (None, None, "RuntimeError: the decode figures are inconsistent")
    others = store.rows(
        "SELECT DISTINCT outcome FROM detector_runs WHERE detector <> 'token_latency' AND evaluated_at = ?", [AT]
    )
    assert others == [("ok",)]

    assert store.runs("token_latency", "error") == 1
    assert store.runs("token_latency", "ok") == 0
    assert store.runs("cache_curve", "ok") == 1
    assert store.runs("cache_curve", "error") == 0


def test_a_failed_evaluation_leaves_the_detectors_firing_alerts_firing(
    store: Store, failing_token_latency: None
) -> None:
    """No data in the window would resolve the alert; a detector that could not evaluate must not."""
    plant_firing_alert(store)
    [result] = store.detection.run(AT, ["token_latency"])
    assert result.outcome == "error"
    assert store.rows("SELECT alert_id, state, resolved_at, updated_at FROM alerts") == [
        ("a1", "firing", None, datetime(2026, 11, 20, 11, 55))
    ]
    assert store.rows("SELECT fingerprint, breaches FROM alert_conditions") == [("fp1", 1)]


def test_a_failed_run_that_cannot_be_recorded_is_logged_and_the_pass_still_returns(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store.writer.close()  # as at shutdown: nothing more can be persisted
    with caplog.at_level(logging.WARNING, logger="detectors.detection"):
        results = store.detection.run(AT, only=["token_latency", "cache_curve"])
    assert [(r.detector, r.outcome, r.error) for r in results] == [
        ("token_latency", "error", "RuntimeError: the writer is closed"),
        ("cache_curve", "error", "RuntimeError: the writer is closed"),
    ]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == [
        "could not record the failed run of token_latency",
        "could not record the failed run of cache_curve",
    ]
    assert store.runs("token_latency", "error") == 1
