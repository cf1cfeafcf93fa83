"""Which process runs the scheduler's jobs when several share one ClickHouse: a lease, renewed while held.

Every process started with `scheduler: true` asks before each job; the holder renews the lease each time it
asks, so a holder that dies or hangs loses it once `seconds` pass without a renewal and another takes over.
The lease is one row per name in a ReplacingMergeTree read with `final`: the newest write wins.

Taking it is a conditional write. Each taking starts a new generation, and its insert carries the
deduplication token `name:generation`: of two processes that found the lease free at generation g and both
take g+1, the server keeps the first insert and drops the second as a retry, so the loser reads back the
winner and runs nothing. Only the holder renews, and only while more than a quarter of the lease is left
(MARGIN); nearer its end the holder takes a new generation like anyone else. A renewal and a taking can then
both land only when the clocks of the two processes differ by more than that quarter (15 s by default).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from storage.clickhouse.client import ClickHouse
from storage.clickhouse.schema import create_replaced, on_cluster, versioned

TABLE = "tailwatch_lease"
# The part of the lease's time its holder does not renew in: the clock skew between schedulers it tolerates.
MARGIN = 0.25
# Insert tokens the server remembers for the lease table: a taking's loser writes within a read's time of it.
_TOKENS_KEPT = 100


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
        columns = "name String, holder String, expires_at DateTime64(6, 'UTC'), generation UInt64"
        client.command(create_replaced(TABLE, columns, "name", cluster))
        # A lease table made before generations: the column, and the tokens a plain MergeTree forgets.
        client.command(f"ALTER TABLE {TABLE}{on_cluster(cluster)} ADD COLUMN IF NOT EXISTS generation UInt64")
        if not cluster:  # a Replicated table keeps insert tokens by default
            client.command(f"ALTER TABLE {TABLE} MODIFY SETTING non_replicated_deduplication_window = {_TOKENS_KEPT}")

    def current(self) -> tuple[str, datetime] | None:
        """The holder and when its lease ends, or None when nobody ever held it."""
        seen = self.read()
        return (seen.holder, seen.expires_at) if seen else None

    def read(self) -> Seen | None:
        rows = self._client.arrow(
            f"SELECT holder, expires_at, generation FROM {TABLE} WHERE name = {{n:String}}", {"n": self.name}
        ).to_pylist()
        return Seen(rows[0]["holder"], rows[0]["expires_at"], rows[0]["generation"]) if rows else None

    def hold(self) -> bool:
        """Take or renew the lease; whether this process holds it now."""
        return self.hold_from(self.read())

    def hold_from(self, seen: Seen | None) -> bool:
        """Take or renew the lease as `seen` when it was read (another process may have written since)."""
        now = self._clock()
        if seen is not None and seen.holder != self.holder and seen.expires_at > now:
            return False
        if seen is not None and seen.holder == self.holder and seen.expires_at - self._ttl * MARGIN > now:
            generation = seen.generation
            self._write(now + self._ttl, generation)
        else:  # free, lapsed, or ours near its end: taken anew, at most once per generation
            generation = seen.generation + 1 if seen else 1
            self._write(now + self._ttl, generation, token=f"{TABLE}:{self.name}:{generation}")
        after = self.read()
        return after is not None and after.holder == self.holder and after.generation == generation

    def release(self) -> None:
        """Give the lease up at shutdown, so a successor need not wait for it to run out."""
        seen = self.read()
        if seen is not None and seen.holder == self.holder:
            self._write(self._clock(), seen.generation)

    def _write(self, expires_at: datetime, generation: int, token: str | None = None) -> None:
        row = {
            "name": [self.name],
            "holder": [self.holder],
            "expires_at": pa.array([expires_at], pa.timestamp("us")),
            "generation": pa.array([generation], pa.uint64()),
        }
        self._client.insert(TABLE, versioned(pa.table(row)), token=token)


@dataclass(frozen=True)
class Seen:
    """The lease as read: who holds it, until when, and the generation of its last taking."""

    holder: str
    expires_at: datetime
    generation: int
