"""The scheduler: one job for the detection pass, on the interval grid, evaluated as of the grid time."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler
from conftest import RunningService, service_settings
from waiting import HANG_GUARD

from detectors.detection import DetectionPass
from detectors.grid import grid_time
from detectors.registry import REGISTRY
from detectors.scheduler import JOB_ID, schedule, scheduled_pass
from storage.duckdb.backend import DuckDBStorage


def test_grid_time_rounds_down_to_the_interval() -> None:
    assert grid_time(datetime(2026, 11, 20, 12, 7, 31), 300) == datetime(2026, 11, 20, 12, 5)
    assert grid_time(datetime(2026, 11, 20, 12, 5), 300) == datetime(2026, 11, 20, 12, 5)


def test_one_aligned_job_runs_the_pass_over_every_enabled_detector_at_the_grid_time(service: RunningService) -> None:
    detection = service.service.detection
    assert detection is not None
    scheduler = BackgroundScheduler(timezone="UTC")  # not started: the job is run by hand, no waiting
    late = datetime(2026, 11, 20, 12, 7, 31)  # a run that started 2.5 minutes after its slot
    keys = schedule(scheduler, detection, clock=lambda: late)
    assert keys == list(REGISTRY)
    [job] = scheduler.get_jobs()
    assert job.id == JOB_ID
    assert job.trigger.start_date == datetime(2026, 11, 20, 12, 10, tzinfo=UTC)
    assert job.trigger.interval == timedelta(seconds=300)
    assert (job.coalesce, job.max_instances) == (True, 1)
    job.func(*job.args)
    assert service.rows("SELECT detector, evaluated_at, outcome FROM detector_runs ORDER BY detector") == [
        (key, datetime(2026, 11, 20, 12, 5), "ok") for key in sorted(REGISTRY)
    ]


def test_the_job_ticks_at_the_common_divisor_and_runs_each_detector_on_its_own_grid(db_path: Path) -> None:
    settings = service_settings(
        db_path, detectors={"token_latency": {"interval_seconds": 60}, "clusters": {"interval_seconds": 600}}
    )
    storage = DuckDBStorage.open(db_path)
    try:
        detection = DetectionPass(storage.windows, storage.detector_store, settings.detector_configs())
        assert detection.tick_seconds == 60
        assert detection.due(datetime(2026, 11, 20, 12, 1)) == ["token_latency"]
        assert detection.due(datetime(2026, 11, 20, 12, 5)) == [k for k in REGISTRY if k != "clusters"]
        assert detection.due(datetime(2026, 11, 20, 12, 10)) == list(REGISTRY)
        results = scheduled_pass(detection, clock=lambda: datetime(2026, 11, 20, 12, 1, 59))
        assert [(r.detector, r.outcome) for r in results] == [("token_latency", "ok")]
        assert storage.reader.rows("SELECT detector, evaluated_at FROM detector_runs") == [
            ("token_latency", datetime(2026, 11, 20, 12, 1))
        ]
    finally:
        storage.close()


def test_the_job_comes_back_every_tick_and_each_detector_runs_on_its_own_interval(
    service: RunningService, db_path: Path
) -> None:
    scheduler = BackgroundScheduler(timezone="UTC")  # not started: the trigger is asked for its times
    configs = service_settings(db_path, detectors={"cache_curve": {"interval_seconds": 600}}).detector_configs()
    detection = DetectionPass(service.service.storage.windows, service.service.storage.detector_store, configs)
    schedule(scheduler, detection, clock=lambda: datetime(2026, 11, 20, 12, 7, 31))
    trigger = scheduler.get_job(JOB_ID).trigger
    times: list[datetime] = []
    previous, now = None, trigger.start_date
    for _ in range(3):
        previous = now = trigger.get_next_fire_time(previous, now)
        times.append(now)
    assert times == [datetime(2026, 11, 20, 12, m, tzinfo=UTC) for m in (10, 15, 20)]
    due = [
        (
            "cache_curve" in detection.due(t.replace(tzinfo=None)),
            "token_latency" in detection.due(t.replace(tzinfo=None)),
        )
        for t in times
    ]
    assert due == [(True, True), (False, True), (True, True)]


def test_alerts_endpoint_lists_alerts_with_filters(service: RunningService) -> None:
    service.service.writer.submit(
        lambda con: con.execute(
            """INSERT INTO alerts VALUES ('a1', 'tenant_fairness', 'fp', 'warning', 'firing', '{"tenant_id": "x"}',
               'tenant x is slow', 2.0, 1.5, '2026-11-20 12:00', '2026-11-20 12:05', '2026-11-20 12:05', NULL,
               '2026-11-20 12:05', NULL)"""
        )
    ).result(timeout=HANG_GUARD)
    with urllib.request.urlopen(f"{service.api_url}/v1/alerts?state=firing", timeout=5) as resp:
        body = json.loads(resp.read())
    assert [(a["alert_id"], a["labels"], a["started_at"]) for a in body["alerts"]] == [
        ("a1", {"tenant_id": "x"}, "2026-11-20T12:05:00Z")
    ]
    with urllib.request.urlopen(f"{service.api_url}/v1/alerts?state=resolved", timeout=5) as resp:
        assert json.loads(resp.read()) == {"alerts": []}
