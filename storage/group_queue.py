"""The writers' queue: work bounded in rows and in bytes, drained whole by the one thread that writes.

Receivers offer batches; when the rows or the bytes already queued (and not yet committed) would pass
their bound, the offer is refused and the receiver answers 'retry later' instead of growing memory. Rows
bound a group commit; bytes bound the memory, which rows cannot: a decoded span of an OpenInference trace
carrying its prompt is several times one of vLLM's. A batch larger than either bound is still taken when
nothing else is queued, so no request is refused forever. Rows and bytes are released only after their
commit, so the bounds cover the group being written too. Both backends' writers drain it
(storage/duckdb/writer.py, storage/clickhouse/writer.py).
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")
# Decoded batches waiting for the writer, by default: a queue of short spans is bounded by its rows (at ~0.8 KB
# a decoded vLLM span, ~1.2 KB one of a realistic mix, the default 20,000 hold 16-24 MiB) and one of
# prompt-carrying spans by this.
DEFAULT_MAX_BYTES = 64 * 2**20


class GroupQueue(Generic[T]):
    def __init__(self, max_rows: int, max_bytes: int) -> None:
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._cv = threading.Condition()
        self._items: list[T] = []
        self._rows = 0
        self._bytes = 0
        self._closing = False

    @property
    def max_rows(self) -> int:
        return self._max_rows

    @property
    def rows(self) -> int:
        """Rows queued or being committed."""
        return self._rows

    @property
    def bytes(self) -> int:
        """Bytes of the batches queued or being committed."""
        return self._bytes

    def offer(self, item: T, rows: int, nbytes: int) -> bool:
        """Queue a batch of `rows` holding `nbytes`; False when a bound would be passed or the queue is closing."""
        with self._cv:
            over = self._rows + rows > self._max_rows or self._bytes + nbytes > self._max_bytes
            if self._closing or (over and self._rows > 0):
                return False
            self._items.append(item)
            self._rows += rows
            self._bytes += nbytes
            self._cv.notify()
        return True

    def put(self, item: T) -> None:
        """Queue work that holds no rows (a job); refused once closing."""
        with self._cv:
            if self._closing:
                raise RuntimeError("the writer is closed")
            self._items.append(item)
            self._cv.notify()

    def take(self, timeout: float | None = None) -> list[T] | None:
        """Everything queued, waiting for something (at most `timeout` seconds: then []); None once closed and
        drained."""
        with self._cv:
            while not self._items and not self._closing:
                if not self._cv.wait(timeout):
                    return []
            if not self._items:
                return None
            items, self._items = self._items, []
            return items

    def release(self, rows: int, nbytes: int) -> None:
        """Rows and the bytes holding them committed (or failed): room for more."""
        with self._cv:
            self._rows -= rows
            self._bytes -= nbytes

    def close(self) -> None:
        """Take nothing more; `take` returns what is left, then None."""
        with self._cv:
            self._closing = True
            self._cv.notify()
