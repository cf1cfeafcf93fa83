"""The evaluation grid: every interval at whole multiples of it since the epoch (:00, :05, … for 300 s)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def grid_time(now: datetime, interval_seconds: int) -> datetime:
    """`now` (naive UTC) rounded down to the interval grid (every 5 minutes at :00, :05, … for 300)."""
    epoch = now.replace(tzinfo=UTC).timestamp()
    return datetime.fromtimestamp(epoch - epoch % interval_seconds, UTC).replace(tzinfo=None)


def grid_times(since: datetime, until: datetime, interval_seconds: int) -> list[datetime]:
    """The grid points in [since, until), oldest first."""
    step = timedelta(seconds=interval_seconds)
    at = grid_time(since, interval_seconds)
    if at < since:
        at += step
    out = []
    while at < until:
        out.append(at)
        at += step
    return out
