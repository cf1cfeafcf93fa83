"""Scheduling the detection pass inside `tailwatch serve`: one APScheduler job, on the interval grid.

The job ticks every `tick_seconds` (the greatest common divisor of the enabled detectors' intervals)
and runs one pass over the detectors due at that grid time, evaluated as of the grid time, not the
moment the thread got to it, so a late run covers the same windows `detect --once --at` would.
Coalescing and one instance mean a slow or missed tick never piles up. After its own windows, a tick
evaluates windows missed before it (detectors/catch_up.py) for a bounded share of the tick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.interval import IntervalTrigger

from detectors.catch_up import Config as CatchUp
from detectors.catch_up import catch_up as catch_up_on
from detectors.detection import DetectionPass, RunResult
from detectors.grid import grid_time

JOB_ID = "detection"


def schedule(
    scheduler: BaseScheduler,
    detection: DetectionPass,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC).replace(tzinfo=None),
    gate: Callable[[], bool] | None = None,
    catch_up: CatchUp | None = None,
) -> list[str]:
    """Add the pass's job; returns the keys of the detectors it runs. With `gate`, a tick runs only while it
    says yes (the scheduler lease of processes sharing one store); with `catch_up`, each tick then evaluates
    windows it missed (detectors/catch_up.py)."""
    keys = detection.keys()
    if not keys:
        return []
    tick = detection.tick_seconds
    first = grid_time(clock(), tick) + timedelta(seconds=tick)
    scheduler.add_job(
        scheduled_pass,
        IntervalTrigger(seconds=tick, start_date=first.replace(tzinfo=UTC), timezone=UTC),
        args=[detection, clock, gate, catch_up],
        id=JOB_ID,
        name="detection pass",
        coalesce=True,
        max_instances=1,
        misfire_grace_time=tick,
        replace_existing=True,
    )
    return keys


def scheduled_pass(
    detection: DetectionPass,
    clock: Callable[[], datetime],
    gate: Callable[[], bool] | None = None,
    catch_up: CatchUp | None = None,
    timer: Callable[[], float] = time.monotonic,
) -> list[RunResult]:
    """One tick: the detectors due at the grid time, evaluated as of it; then, within the tick's share for
    it, windows missed before it."""
    if gate is not None and not gate():
        return []
    started = timer()
    at = grid_time(clock(), detection.tick_seconds)
    due = detection.due(at)
    results = detection.run(at, due) if due else []
    if catch_up is not None:
        deadline = started + detection.tick_seconds * catch_up.share_of_tick
        results += catch_up_on(detection, at, catch_up, deadline, timer)
    return results
