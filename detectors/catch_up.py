"""Windows the scheduler missed, found and evaluated oldest first.

A window nobody evaluated (the service was down, or started after its spans arrived, as after a backfill)
would stay a hole in every figure and in the SLO minutes for good. After each tick's own windows, the
scheduler evaluates the windows missed within `hours` before it, oldest first, for at most `share_of_tick`
of the tick, so the current window is never delayed; what is left waits for the next tick.

A caught-up window is history: its figures, SLO minutes and run log are stored as an evaluation on time
would have stored them, but alerts are judged on the present alone. Firing state is a sequence in time,
and judging an hour-old window after the current one would resolve and re-fire what is firing now; nor
does anyone want to be paged for a fault that ended while the service was down. `tailwatch detect --from
--to` evaluates a range the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from functools import partial

from pydantic import BaseModel, ConfigDict, Field

from detectors.base import DetectorConfig
from detectors.detection import DetectionPass, RunResult
from detectors.grid import grid_times


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hours: float = Field(
        24.0, ge=0, description="Windows missed up to this long before each tick are evaluated later, oldest "
        "first (0: none)."
    )  # fmt: skip
    share_of_tick: float = Field(
        0.5, gt=0, le=1, description="The part of each tick catching up may take, after the tick's own windows."
    )


def missed(
    configs: Mapping[str, DetectorConfig],
    since: datetime,
    until: datetime,
    evaluated: Callable[[str], set[datetime]],
    data_from: datetime | None,
) -> list[tuple[datetime, list[str]]]:
    """The grid times in [since, until) at which the detectors of `configs` have no evaluation logged, oldest
    first, with the detectors missing each. A window ending before the first span (`data_from`; None: no spans)
    holds nothing and is not missed."""
    if data_from is None:
        return []
    return _by_time(
        (key, at)
        for key, config in configs.items()
        for done in [evaluated(key)]
        for at in grid_times(since, until, config.interval_seconds)
        if at not in done and config.window(at).end > data_from
    )


def in_range(configs: Mapping[str, DetectorConfig], start: datetime, end: datetime) -> list[tuple[datetime, list[str]]]:
    """The grid times in [start, end], oldest first, with the detectors due at each: what `detect --from --to`
    evaluates."""
    until = end + timedelta(microseconds=1)
    return _by_time((key, at) for key, c in configs.items() for at in grid_times(start, until, c.interval_seconds))


def _by_time(due: Iterable[tuple[str, datetime]]) -> list[tuple[datetime, list[str]]]:
    """(detector, grid time) pairs as the detectors due at each time, oldest first, in the order given."""
    by_time: dict[datetime, list[str]] = {}
    for key, at in due:
        by_time.setdefault(at, []).append(key)
    return sorted(by_time.items())


def catch_up(
    detection: DetectionPass, at: datetime, config: Config, deadline: float, timer: Callable[[], float]
) -> list[RunResult]:
    """Evaluate the windows missed before the grid time `at`, oldest first, until `timer()` passes `deadline`."""
    if config.hours <= 0:
        return []
    since = at - timedelta(hours=config.hours)
    configs = _history(detection)
    if not configs:
        return []
    # A window evaluated at `since` reaches back before it (its length and settle time): so does the data.
    data_from = detection.data_from(min(c.window(since).start for c in configs.values()))
    done = partial(detection.evaluated, since=since)
    results: list[RunResult] = []
    for when, keys in missed(configs, since, at, done, data_from):
        if timer() >= deadline:
            break
        results += detection.run(when, keys, judge=False)
    return results


def backfill(
    detection: DetectionPass, start: datetime, end: datetime, only: Iterable[str] | None = None
) -> list[RunResult]:
    """Evaluate every window of [start, end] as history, oldest first: `tailwatch detect --from --to`."""
    results: list[RunResult] = []
    for at, keys in in_range(_history(detection, only), start, end):
        results += detection.run(at, keys, judge=False)
    return results


def _history(detection: DetectionPass, only: Iterable[str] | None = None) -> dict[str, DetectorConfig]:
    return {key: detection.config(key) for key in detection.history_keys(only)}
