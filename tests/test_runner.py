"""The detection pass: failure isolation (a detector that raises is recorded and counted, and the pass
goes on), firing alerts carried across runs, the run's timing and metrics, and reads shared within a pass."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from conftest import service_settings
from prometheus_client import CollectorRegistry
from waiting import HANG_GUARD

from detectors import clusters
from detectors.alerts import Evaluation, fingerprint
from detectors.base import Condition, Detection, DetectorConfig, Window
from detectors.clusters import EPISODE_COLUMNS
from detectors.detection import DetectionPass, DetectorMetrics
from detectors.incidents import Config as IncidentsConfig
from detectors.incidents import IncidentPass, Transition
from detectors.registry import REGISTRY, get
from storage.duckdb.backend import DuckDBStorage
from storage.duckdb.sql_reader import Reader
from storage.duckdb.writer import Writer
from storage.ports import (
    Episode,
    FiringAlerts,
    FrameBudget,
    Incident,
    Read,
    Requests,
    RequestSummary,
    Scores,
    SloCounts,
    WindowSource,
)

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

    storage: DuckDBStorage
    reader: Reader
    writer: Writer
    detection: DetectionPass
    metrics: CollectorRegistry
    configs: Mapping[str, DetectorConfig]

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
        yield Store(storage, storage.reader, storage.writer, detection, metrics, configs)
    finally:
        storage.close()


def plant_firing_alert(store: Store) -> None:
    def plant(con: Any) -> None:
        con.execute(
            """INSERT INTO alerts VALUES ('a1', 'token_latency', 'fp1', 'critical', 'firing',
               '{"deployment": "vllm-a", "model": "llama"}', 'tpot p99 is 3.1x the baseline', 3.1, 2.0,
               '2026-11-20 11:49:30', '2026-11-20 11:54:30', '2026-11-20 11:55', NULL, '2026-11-20 11:55', NULL)"""
        )
        con.execute("INSERT INTO alert_conditions VALUES ('fp1', 'token_latency', 1, '2026-11-20 11:55')")

    store.writer.submit(plant).result(timeout=HANG_GUARD)


def test_a_detector_that_raises_is_recorded_and_counted_and_the_rest_of_the_pass_still_runs(
    store: Store, failing_token_latency: None
) -> None:
    before = time.perf_counter()
    results = store.detection.run(AT)
    took = time.perf_counter() - before

    assert [r.detector for r in results] == list(REGISTRY)  # the whole pass ran, in registry order
    failed = results[0]
    assert (failed.detector, failed.outcome, failed.window) == ("token_latency", "error", WINDOW)
    assert 0 <= failed.seconds <= took
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


class RecordingSink:
    """An alert sink that keeps what each run published."""

    def __init__(self) -> None:
        self.published: list[tuple[str, Evaluation]] = []
        self.intervals: list[int] = []
        self.incidents: dict[str, str] = {}  # the incident each published alert is in
        self.transitions: list[tuple[Transition, str]] = []

    def publish(
        self, detector: str, evaluation: Evaluation, interval_seconds: int, incidents: Mapping[str, Incident]
    ) -> None:
        self.published.append((detector, evaluation))
        self.intervals.append(interval_seconds)
        self.incidents.update({a: i.incident_id for a, i in incidents.items()})

    def publish_incident(self, transition: Transition, incident: Incident) -> None:
        self.transitions.append((transition, incident.incident_id))


def test_a_firing_alert_whose_condition_has_cleared_is_resolved_by_the_next_run_with_its_stored_labels(
    store: Store,
) -> None:
    """The run reads the detector's firing alerts back from storage: an empty window finds no breach, so the
    alert planted by an earlier run resolves, and the notification names the group by the labels stored."""
    labels = {"signal": "latency_p99", "tenant_id": "smallco"}
    fp = fingerprint("tenant_fairness", labels)

    def plant(con: Any) -> None:
        con.execute(
            """INSERT INTO alerts VALUES ('a2', 'tenant_fairness', ?, 'warning', 'firing', ?,
               'tenant smallco: p99 latency 3.5 s is 2.9x the aggregate', 2.9, 1.5, '2026-11-20 11:49:30',
               '2026-11-20 11:54:30', '2026-11-20 11:55', NULL, '2026-11-20 11:55', NULL)""",
            [fp, '{"signal": "latency_p99", "tenant_id": "smallco"}'],
        )
        con.execute("INSERT INTO alert_conditions VALUES (?, 'tenant_fairness', 1, '2026-11-20 11:55')", [fp])

    store.writer.submit(plant).result(timeout=HANG_GUARD)
    sink = RecordingSink()
    detection = DetectionPass(store.storage.windows, store.storage.detector_store, store.configs, sink=sink)
    [result] = detection.run(AT, ["tenant_fairness"])

    assert (result.outcome, result.error, result.firing) == ("ok", None, [])
    assert store.rows("SELECT alert_id, state, resolved_at, updated_at FROM alerts") == [("a2", "resolved", AT, AT)]
    assert store.rows("SELECT * FROM alert_conditions") == []
    [(detector, evaluation)] = sink.published
    assert sink.intervals == [store.configs["tenant_fairness"].interval_seconds]  # the notifier's endsAt
    assert detector == "tenant_fairness"
    assert (evaluation.fired, evaluation.updated) == ([], [])
    [resolved] = evaluation.resolved
    assert (resolved.alert_id, resolved.fingerprint, resolved.labels) == ("a2", fp, labels)
    assert (resolved.state, resolved.resolved_at, resolved.started_at) == (
        "resolved",
        AT,
        datetime(2026, 11, 20, 11, 55),
    )


def test_alerts_are_published_after_the_pass_with_the_incident_each_is_in_and_its_transition(store: Store) -> None:
    labels = {"signal": "latency_p99", "tenant_id": "smallco"}
    fp = fingerprint("tenant_fairness", labels)

    def plant(con: Any) -> None:
        con.execute(
            """INSERT INTO alerts VALUES ('a4', 'tenant_fairness', ?, 'warning', 'firing', ?, 'tenant smallco is slow',
               2.9, 1.5, '2026-11-20 11:49:30', '2026-11-20 11:54:30', '2026-11-20 11:55', NULL, '2026-11-20 11:55',
               NULL)""",
            [fp, json.dumps(labels)],
        )

    store.writer.submit(plant).result(timeout=HANG_GUARD)
    sink = RecordingSink()
    incidents = IncidentPass(store.storage.incident_store, IncidentsConfig())
    detection = DetectionPass(
        store.storage.windows, store.storage.detector_store, store.configs, sink=sink, incidents=incidents
    )
    detection.run(AT, ["tenant_fairness"])  # the window is empty: the alert resolves, within the hold-off
    [(incident_id, state)] = store.rows("SELECT incident_id, state FROM incidents")
    assert state == "open"
    assert sink.incidents == {"a4": incident_id}
    assert sink.transitions == [("opened", incident_id)]
    detection.run(AT + timedelta(seconds=IncidentsConfig().hold_off_seconds), ["tenant_fairness"])
    assert sink.transitions == [("opened", incident_id), ("resolved", incident_id)]


def test_what_clusters_says_of_a_firing_alert_is_stored_on_the_alert(store: Store) -> None:
    """The clusters pass explains another detector's firing alert; the pass writes it to `alerts.explanation`."""
    labels = {"signal": "latency_p99", "tenant_id": "smallco"}

    def plant(con: Any) -> None:
        con.execute(
            """INSERT INTO alerts VALUES ('a3', 'tenant_fairness', ?, 'warning', 'firing', ?, 'tenant smallco is slow',
               2.9, 1.5, '2026-11-20 11:49:30', '2026-11-20 11:54:30', '2026-11-20 11:55', NULL, '2026-11-20 11:55',
               NULL)""",
            [fingerprint("tenant_fairness", labels), '{"signal": "latency_p99", "tenant_id": "smallco"}'],
        )

    store.writer.submit(plant).result(timeout=HANG_GUARD)
    [result] = store.detection.run(AT, ["clusters"])
    assert result.outcome == "ok", result.error
    [(explanation,)] = store.rows("SELECT explanation FROM alerts WHERE alert_id = 'a3'")
    assert explanation == (
        "no cluster: tenant_id=smallco did not pass the evidence test on latency_tail since 11:54:30 UTC: 0 of its 0 "
        "requests had an e2e or TTFT above the window p99 (0 %) against 0 % for the rest, risk ratio 0.00, p = 1 (bar "
        "0.01: Holm over the pass's 1 alert hypothesis); no request was bad"
    )


def test_a_runs_reported_and_observed_seconds_are_the_time_the_run_took(store: Store) -> None:
    """At least the fetch-detect-persist time it logged, at most the time the call took from outside."""
    before = time.perf_counter()
    [result] = store.detection.run(AT, ["tenant_fairness"])
    took = time.perf_counter() - before
    [(logged,)] = store.rows("SELECT seconds FROM detector_runs WHERE detector = 'tenant_fairness'")
    assert result.outcome == "ok"
    assert 0 < logged <= result.seconds <= took
    observed = store.metrics.get_sample_value("tailwatch_detector_run_seconds_sum", {"detector": "tenant_fairness"})
    assert observed == result.seconds


def test_the_run_seconds_histogram_has_buckets_from_fifty_milliseconds_to_a_minute(store: Store) -> None:
    [result] = store.detection.run(AT, ["tenant_fairness"])
    [family] = [m for m in store.metrics.collect() if m.name == "tailwatch_detector_run_seconds"]
    buckets = [(s.labels["le"], s.value) for s in family.samples if s.name.endswith("_bucket")]
    bounds = ["0.05", "0.1", "0.25", "0.5", "1.0", "2.0", "5.0", "10.0", "30.0", "60.0", "+Inf"]
    assert [le for le, _ in buckets] == bounds
    # Cumulative: the one run counts in every bucket from the first bound at or above its time.
    assert [count for _, count in buckets] == [float(result.seconds <= float(le)) for le in bounds]


class WatchingSource:
    """The store's window source, noting at each read which of the tables it returned earlier someone still holds."""

    def __init__(self, source: WindowSource) -> None:
        self._source = source
        self._returned: list[tuple[Read, weakref.ref[pa.Table]]] = []
        self.reads: list[tuple[Read, set[Read]]] = []  # (the read, the earlier reads whose tables are still held)

    def _watch(self, read: Read, fetch: Callable[[], pa.Table]) -> pa.Table:
        gc.collect()
        self.reads.append((read, {r for r, ref in self._returned if ref() is not None}))
        table = fetch()
        self._returned.append((read, weakref.ref(table)))
        return table

    def requests(self, read: Requests, budget: FrameBudget | None = None) -> pa.Table:
        return self._watch(read, lambda: self._source.requests(read, budget))

    def scores(self, read: Scores, budget: FrameBudget | None = None) -> pa.Table:
        return self._watch(read, lambda: self._source.scores(read, budget))

    def request_summary(self, read: RequestSummary) -> pa.Table:
        return self._watch(read, lambda: self._source.request_summary(read))

    def firing_alerts(self) -> pa.Table:
        return self._watch(FiringAlerts(), self._source.firing_alerts)

    def slo_counts(self, read: SloCounts) -> pa.Table:
        return self._watch(read, lambda: self._source.slo_counts(read))


def test_a_pass_reads_what_two_detectors_share_once_and_lets_go_of_each_read_after_its_last_use(
    store: Store,
) -> None:
    """cache_curve and tenant_fairness read the same scores and each its own requests; token_latency reads
    neither. Over a day-long window these frames are gigabytes: none may be held past its last use in the pass."""
    source = WatchingSource(store.storage.windows)
    detection = DetectionPass(source, store.storage.detector_store, store.configs)

    def reads(key: str) -> dict[str, Read]:
        config = store.configs[key]
        return get(key).inputs(config, config.window(AT))

    cache_curve, tenant_fairness, token_latency = reads("cache_curve"), reads("tenant_fairness"), reads("token_latency")
    scores = cache_curve["scores"]
    assert scores == tenant_fairness["scores"] and scores not in token_latency.values()
    results = detection.run(AT, only=["cache_curve", "tenant_fairness", "token_latency"])

    assert [(r.detector, r.outcome) for r in results] == [
        ("token_latency", "ok"), ("cache_curve", "ok"), ("tenant_fairness", "ok"),
    ]  # fmt: skip
    # In registry order, each read with the earlier reads' tables still held at that moment: the scores read
    # once and held from cache_curve's read to tenant_fairness's use, and token_latency's baseline kept for
    # the passes of the next hour (it lies wholly in the past); nothing else past its one use.
    baseline = token_latency["baseline"]
    assert baseline.cacheable
    assert source.reads == [
        (token_latency["window"], set()),
        (baseline, set()),
        (cache_curve["requests"], {baseline}),
        (scores, {baseline}),
        (tenant_fairness["requests"], {scores, baseline}),
    ]


def test_a_detector_whose_inputs_raise_is_a_failed_run_and_the_detectors_after_it_still_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_inputs(config: Any, window: Window) -> dict[str, Read]:
        raise ValueError("no such column in the request model")

    monkeypatch.setitem(REGISTRY, "cache_curve", dataclasses.replace(REGISTRY["cache_curve"], inputs=broken_inputs))
    results = store.detection.run(AT, only=["token_latency", "cache_curve", "tenant_fairness"])
    assert [(r.detector, r.outcome, r.error) for r in results] == [
        ("token_latency", "ok", None),
        ("cache_curve", "error", "ValueError: no such column in the request model"),
        ("tenant_fairness", "ok", None),
    ]
    assert store.rows("SELECT detector, outcome FROM detector_runs ORDER BY detector") == [
        ("cache_curve", "error"), ("tenant_fairness", "ok"), ("token_latency", "ok"),
    ]  # fmt: skip
    assert store.detection.waiting == 0


def test_a_condition_without_a_severity_fires_with_the_configured_one_and_the_run_log_counts_rows_and_conditions(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = REGISTRY["tenant_fairness"].detect

    def one_condition(frames: dict[str, pl.DataFrame], config: Any, window: Window) -> Detection:
        detection = real(frames, config, window)
        condition = Condition({"tenant_id": "smallco", "signal": "latency_p99"}, 2.9, 1.5, "smallco is slow")
        return Detection(detection.figures, [condition], detection.extra_tables)

    monkeypatch.setitem(
        REGISTRY, "tenant_fairness", dataclasses.replace(REGISTRY["tenant_fairness"], detect=one_condition)
    )
    configs = service_settings(db_path, detectors={"tenant_fairness": {"severity": "info"}}).detector_configs()
    storage = DuckDBStorage.open(db_path)
    metrics = CollectorRegistry()
    try:
        detection = DetectionPass(storage.windows, storage.detector_store, configs, metrics=DetectorMetrics(metrics))
        [result] = detection.run(AT, ["tenant_fairness"])
        assert [a.severity for a in result.firing] == ["info"]
        assert (result.rows, result.conditions) == (0, 1)
        assert metrics.get_sample_value("tailwatch_alerts_firing", {"detector": "tenant_fairness"}) == 1
        assert storage.reader.rows("SELECT severity, state FROM alerts") == [("info", "firing")]
        assert storage.reader.rows("SELECT rows, conditions FROM detector_runs") == [(0, 1)]
    finally:
        storage.close()


def test_a_shared_read_is_let_go_once_its_last_reader_is_done_before_the_rest_of_the_pass(store: Store) -> None:
    """Clusters, last, reads a longer window here, so nothing it reads is the scores the others shared."""
    configs = {**store.configs, "clusters": store.configs["clusters"].model_copy(update={"window_seconds": 600})}
    source = WatchingSource(store.storage.windows)
    detection = DetectionPass(source, store.storage.detector_store, configs)
    scores = get("cache_curve").inputs(configs["cache_curve"], configs["cache_curve"].window(AT))["scores"]
    results = detection.run(AT, only=["cache_curve", "tenant_fairness", "clusters"])
    assert [r.outcome for r in results] == ["ok", "ok", "ok"]
    clusters_reads = [held for read, held in source.reads if isinstance(read, Requests | Scores | FiringAlerts)][-3:]
    assert all(scores not in held for held in clusters_reads), source.reads


def plant_alert(store: Store, alert_id: str, detector: str, labels: dict[str, str], started_at: datetime) -> None:
    def plant(con: Any) -> None:
        con.execute(
            "INSERT INTO alerts VALUES (?, ?, ?, 'warning', 'firing', ?, 'planted', 1.0, 1.0, ?, ?, ?, NULL, ?, NULL)",
            [alert_id, detector, fingerprint(detector, labels), json.dumps(labels), WINDOW.start, WINDOW.end,
             started_at, started_at],
        )  # fmt: skip

    store.writer.submit(plant).result(timeout=HANG_GUARD)


def episode_windows(source: WatchingSource) -> list[Window]:
    """The windows of the requests clusters read for alert episodes, in the order read."""
    return [read.window for read, _ in source.reads if isinstance(read, Requests) and read.columns == EPISODE_COLUMNS]


def test_clusters_reads_an_episode_only_while_an_alert_it_explains_fires_from_its_first_window_up_to_an_hour(
    store: Store,
) -> None:
    """The pass at 12:00 evaluates 11:54:30-11:59:30. An alert replica_skew started firing at 11:45 began with that
    pass's window, 11:39:30-11:44:30: the earlier requests are read from there to the window. Firing since 09:00,
    at most episode_seconds (an hour) back. No alert, or only ones clusters does not test: nothing before."""
    source = WatchingSource(store.storage.windows)
    detection = DetectionPass(source, store.storage.detector_store, store.configs)

    def read_back() -> Window:
        source.reads.clear()
        [result] = detection.run(AT, ["clusters"])
        assert result.outcome == "ok", result.error
        [window] = episode_windows(source)
        return window

    assert read_back() == Window(WINDOW.start, WINDOW.start)
    plant_alert(store, "a1", "token_latency", {"deployment": "vllm", "model": "llama"}, datetime(2026, 11, 20, 9, 0))
    assert read_back() == Window(WINDOW.start, WINDOW.start)
    plant_alert(
        store, "a2", "replica_skew", {"replica_id": "r3", "signal": "json_adherence"}, datetime(2026, 11, 20, 11, 45)
    )
    assert read_back() == Window(datetime(2026, 11, 20, 11, 39, 30), WINDOW.start)
    plant_alert(store, "a3", "cache_curve", {"bucket": "low", "signal": "groundedness"}, datetime(2026, 11, 20, 9, 0))
    assert read_back() == Window(WINDOW.start - timedelta(hours=1), WINDOW.start)


def test_an_episode_too_large_for_the_frame_budget_is_not_read_and_leaves_the_budget_as_it_was(store: Store) -> None:
    """400 requests ended in the alert's episode before the window. Within the budget they are read; past it the
    episode is empty, the window is judged alone, and what the pass holds is charged as before."""

    def plant(con: Any) -> None:
        con.execute(
            """
            INSERT INTO span_rows (trace_id, span_id, name, kind, start_time, end_time, duration_ms, status_code,
                                   is_llm, llm_role, e2e_ms, ingested_at)
            SELECT 't' || i, 's', 'llm_request', 'SERVER', e - INTERVAL 1 SECOND, e, 1000, 'OK', true, 'server',
                   1000.0, e
            FROM range(400) AS r(i), LATERAL (SELECT ?::TIMESTAMP + to_milliseconds(i * 500) AS e)
            """,
            [WINDOW.start - timedelta(minutes=4)],
        )

    store.writer.submit(plant).result(timeout=HANG_GUARD)
    plant_alert(
        store, "a1", "replica_skew", {"replica_id": "r3", "signal": "json_adherence"}, datetime(2026, 11, 20, 11, 50)
    )
    episode = clusters.inputs(clusters.Config(), WINDOW)["episode_requests"]
    assert isinstance(episode, Episode)
    assert episode.fetch(store.storage.windows).num_rows == 400
    budget = FrameBudget(limit=4096, used=100)
    assert episode.fetch(store.storage.windows, budget).num_rows == 0
    assert budget.used == 100
