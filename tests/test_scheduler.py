"""The scheduler: one job per enabled detector, on the interval grid, evaluated as of the grid time."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler
from conftest import RunningService, service_settings
from waiting import HANG_GUARD

from detectors.scheduler import grid_time, schedule


def test_grid_time_rounds_down_to_the_interval() -> None:
    assert grid_time(datetime(2026, 11, 20, 12, 7, 31), 300) == datetime(2026, 11, 20, 12, 5)
    assert grid_time(datetime(2026, 11, 20, 12, 5), 300) == datetime(2026, 11, 20, 12, 5)


def test_each_enabled_detector_gets_an_aligned_job_that_evaluates_at_the_grid_time(service: RunningService) -> None:
    runner = service.service.runner
    assert runner is not None
    scheduler = BackgroundScheduler(timezone="UTC")  # not started: the jobs are run by hand, no waiting
    late = datetime(2026, 11, 20, 12, 7, 31)  # a run that started 2.5 minutes after its slot
    keys = schedule(scheduler, runner, service.settings.detector_configs(), clock=lambda: late)
    assert sorted(keys) == sorted(service.settings.detector_configs())
    job = scheduler.get_job("detector:token_latency")
    assert job.trigger.start_date == datetime(2026, 11, 20, 12, 10, tzinfo=UTC)
    assert (job.coalesce, job.max_instances) == (True, 1)
    job.func(*job.args)
    assert service.rows("SELECT detector, evaluated_at, outcome FROM detector_runs") == [
        ("token_latency", datetime(2026, 11, 20, 12, 5), "ok")
    ]


def test_each_detectors_job_comes_back_every_interval_of_its_own_on_the_grid(
    service: RunningService, db_path: Path
) -> None:
    runner = service.service.runner
    assert runner is not None
    scheduler = BackgroundScheduler(timezone="UTC")  # not started: the trigger is asked for its times
    configs = service_settings(db_path, detectors={"cache_curve": {"interval_seconds": 600}}).detector_configs()
    schedule(scheduler, runner, configs, clock=lambda: datetime(2026, 11, 20, 12, 7, 31))

    def fire_times(key: str, n: int) -> list[datetime]:
        trigger = scheduler.get_job(f"detector:{key}").trigger
        times: list[datetime] = []
        previous, now = None, trigger.start_date
        for _ in range(n):
            previous = now = trigger.get_next_fire_time(previous, now)
            times.append(now)
        return times

    assert fire_times("token_latency", 3) == [datetime(2026, 11, 20, 12, m, tzinfo=UTC) for m in (10, 15, 20)]
    assert fire_times("cache_curve", 3) == [datetime(2026, 11, 20, 12, m, tzinfo=UTC) for m in (10, 20, 30)]


def test_alerts_endpoint_lists_alerts_with_filters(service: RunningService) -> None:
    service.service.writer.submit(
        lambda con: con.execute(
            """INSERT INTO alerts VALUES ('a1', 'tenant_fairness', 'fp', 'warning', 'firing', '{"tenant_id": "x"}',
               'tenant x is slow', 2.0, 1.5, '2026-11-20 12:00', '2026-11-20 12:05', '2026-11-20 12:05', NULL,
               '2026-11-20 12:05')"""
        )
    ).result(timeout=HANG_GUARD)
    with urllib.request.urlopen(f"{service.api_url}/v1/alerts?state=firing", timeout=5) as resp:
        body = json.loads(resp.read())
    assert [(a["alert_id"], a["labels"], a["started_at"]) for a in body["alerts"]] == [
        ("a1", {"tenant_id": "x"}, "2026-11-20T12:05:00Z")
    ]
    with urllib.request.urlopen(f"{service.api_url}/v1/alerts?state=resolved", timeout=5) as resp:
        assert json.loads(resp.read()) == {"alerts": []}
