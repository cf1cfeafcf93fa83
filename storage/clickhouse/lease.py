"""Which process runs the scheduler's jobs when several share one ClickHouse: a lease, renewed while held.

Every process started with `scheduler: true` asks before each job; the holder renews the lease each time it
asks, so a holder that dies or hangs loses it once `seconds` pass without a renewal and another takes over.
The lease is one row per name in a ReplacingMergeTree read with `final`: the newest write wins. Two
processes that find it free at the same moment both write; each then reads back who holds it, and the one
that lost sees so at its next ask. So two schedulers overlap by at most one job each, never for longer.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from storage.clickhouse.client import ClickHouse
from storage.clickhouse.schema import create_replaced, versioned

TABLE = "tailwatch_lease"


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class ClickHouseLease:
    def __init__(
        self,
        client: ClickHouse,
        *,
        name: str = "scheduler",
        seconds: float = 60,
        holder: str | None = None,
        clock: Callable[[], datetime] = _now,
        cluster: str | None = None,
    ) -> None:
        self._client = client
        self.name = name
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._ttl = timedelta(seconds=seconds)
        self._clock = clock
        client.command(
            create_replaced(TABLE, "name String, holder String, expires_at DateTime64(6, 'UTC')", "name", cluster)
        )

    def current(self) -> tuple[str, datetime] | None:
        """The holder and when its lease ends, or None when nobody ever held it."""
        rows = self._client.arrow(
            f"SELECT holder, expires_at FROM {TABLE} WHERE name = {{n:String}}", {"n": self.name}
        ).to_pylist()
        return (rows[0]["holder"], rows[0]["expires_at"]) if rows else None

    def hold(self) -> bool:
        """Take or renew the lease; whether this process holds it now."""
        now = self._clock()
        current = self.current()
        if current is not None and current[0] != self.holder and current[1] > now:
            return False
        self._write(now + self._ttl)
        after = self.current()
        return after is not None and after[0] == self.holder

    def release(self) -> None:
        """Give the lease up at shutdown, so a successor need not wait for it to run out."""
        current = self.current()
        if current is not None and current[0] == self.holder:
            self._write(self._clock())

    def _write(self, expires_at: datetime) -> None:
        row = {"name": [self.name], "holder": [self.holder], "expires_at": pa.array([expires_at], pa.timestamp("us"))}
        self._client.insert(TABLE, versioned(pa.table(row)))
