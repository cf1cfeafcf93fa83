"""The writers' queue: work bounded in rows, drained whole by the one thread that writes.

Receivers offer batches; when the rows already queued (and not yet committed) would pass the bound, the
offer is refused and the receiver answers 'retry later' instead of growing memory. A batch larger than the
bound is still taken when nothing else is queued, so no request is refused forever. Rows are released
only after their commit, so the bound covers the group being written too. Both backends' writers drain it
(storage/duckdb/writer.py, storage/clickhouse/writer.py).
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class GroupQueue(Generic[T]):
    def __init__(self, max_rows: int) -> None:
        self._max_rows = max_rows
        self._cv = threading.Condition()
        self._items: list[T] = []
        self._rows = 0
        self._closing = False

    @property
    def max_rows(self) -> int:
        return self._max_rows

    @property
    def rows(self) -> int:
        """Rows queued or being committed."""
        return self._rows

    def offer(self, item: T, rows: int) -> bool:
        """Queue a batch of `rows`; False when the bound would be passed or the queue is closing."""
        with self._cv:
            if self._closing or (self._rows + rows > self._max_rows and self._rows > 0):
                return False
            self._items.append(item)
            self._rows += rows
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

    def release(self, rows: int) -> None:
        """Rows committed (or failed): room for more."""
        with self._cv:
            self._rows -= rows

    def close(self) -> None:
        """Take nothing more; `take` returns what is left, then None."""
        with self._cv:
            self._closing = True
            self._cv.notify()
