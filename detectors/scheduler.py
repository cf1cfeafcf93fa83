"""Scheduling the detection pass inside `tailwatch serve`: one APScheduler job, on the interval grid.

The job ticks every `tick_seconds` (the greatest common divisor of the enabled detectors' intervals)
and runs one pass over the detectors due at that grid time, evaluated as of the grid time, not the
moment the thread got to it, so a late run covers the same windows `detect --once --at` would.
Coalescing and one instance mean a slow or missed tick never piles up.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.interval import IntervalTrigger

from detectors.detection import DetectionPass, RunResult, grid_time

JOB_ID = "detection"


def schedule(
    scheduler: BaseScheduler,
    detection: DetectionPass,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC).replace(tzinfo=None),
    gate: Callable[[], bool] | None = None,
) -> list[str]:
    """Add the pass's job; returns the keys of the detectors it runs. With `gate`, a tick runs only while it
    says yes (the scheduler lease of processes sharing one store)."""
    keys = detection.keys()
    if not keys:
        return []
    tick = detection.tick_seconds
    first = grid_time(clock(), tick) + timedelta(seconds=tick)
    scheduler.add_job(
        scheduled_pass,
        IntervalTrigger(seconds=tick, start_date=first.replace(tzinfo=UTC), timezone=UTC),
        args=[detection, clock, gate],
        id=JOB_ID,
        name="detection pass",
        coalesce=True,
        max_instances=1,
        misfire_grace_time=tick,
        replace_existing=True,
    )
    return keys


def scheduled_pass(
    detection: DetectionPass, clock: Callable[[], datetime], gate: Callable[[], bool] | None = None
) -> list[RunResult]:
    """One tick: the detectors due at the grid time, evaluated as of it."""
    if gate is not None and not gate():
        return []
    at = grid_time(clock(), detection.tick_seconds)
    due = detection.due(at)
    return detection.run(at, due) if due else []
