"""The ClickHouse sink: receivers' batches grouped and inserted by one thread, acknowledged once inserted.

Like the DuckDB writer, requests queue (bounded in rows; a full queue answers 'retry later') and one
thread inserts everything queued as one group, resolving each request's future only after ClickHouse
acknowledged the insert. A failed insert (the server unreachable, slow or refusing) fails every request
of the group, which the receivers answer as retryable: nothing acknowledged was not stored.

Counting once: `spans` and `span_scores` are ReplacingMergeTree keyed by trace and span (and score), and
read with `final`, so a retried request, from this process or another receiver, counts once whatever
its grouping. Each group also carries a deduplication token (a hash of its spans' keys), so a group
retried whole is dropped by the server before it reaches `otel_traces`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property

import numpy as np
import pyarrow as pa

from model.thread_names import name_this_thread
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.schema import INGEST_TABLE
from storage.group_queue import DEFAULT_MAX_BYTES, GroupQueue
from storage.ports import WriteResult
from storage.writer_metrics import WriterMetrics

log = logging.getLogger(__name__)


@dataclass
class _Batch:
    spans: pa.Table | None
    scores: pa.Table | None
    metrics: pa.Table | None
    future: Future[WriteResult] = field(default_factory=Future)

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in (self.spans, self.scores, self.metrics) if t is not None)

    @cached_property
    def nbytes(self) -> int:
        return sum(t.get_total_buffer_size() for t in (self.spans, self.scores, self.metrics) if t is not None)


def _stamped(table: pa.Table, now: datetime) -> pa.Table:
    # One value repeated by Arrow: a group is up to a queue's worth of spans, no Python object per span.
    return table.append_column("ingested_at", pa.repeat(pa.scalar(now, pa.timestamp("us")), table.num_rows))


def micros(table: pa.Table) -> pa.Table:
    """Nanosecond timestamps as microseconds rounded half away from zero, as DuckDB stores them."""
    return pa.Table.from_arrays([_micros(c) for c in table.columns], names=table.column_names)


def _micros(column: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    if not (pa.types.is_timestamp(column.type) and column.type.unit == "ns"):
        return column
    ns = column.cast(pa.int64()).to_numpy(zero_copy_only=False)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    us = np.where(ns >= 0, (ns + 500) // 1000, -((500 - ns) // 1000))
    return pa.array(us, pa.int64(), mask=~valid).cast(pa.timestamp("us"))


def token(spans: pa.Table) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for column in ("trace_id", "span_id"):
        # A slice shares its parent's whole buffers; combined, they hold the values of its own spans alone.
        for buffer in spans.column(column).combine_chunks().buffers():
            if buffer is not None:
                digest.update(buffer)
    return digest.hexdigest()


class ClickHouseWriter:
    """The `SpanSink` port on ClickHouse."""

    def __init__(
        self,
        client: ClickHouse,
        *,
        max_queued_spans: int,
        max_queued_bytes: int = DEFAULT_MAX_BYTES,
        metrics: WriterMetrics | None = None,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._queue: GroupQueue[_Batch] = GroupQueue(max_queued_spans, max_queued_bytes)
        self._thread = threading.Thread(target=self._run, name="tailwatch-clickhouse-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def try_submit(
        self, spans: pa.Table | None, scores: pa.Table | None = None, metrics: pa.Table | None = None
    ) -> Future[WriteResult] | None:
        item = _Batch(
            spans if spans is not None and spans.num_rows else None,
            scores if scores is not None and scores.num_rows else None,
            metrics if metrics is not None and metrics.num_rows else None,
        )
        if not self._queue.offer(item, item.rows, item.nbytes):
            return None
        self._set_queue_gauge()
        return item.future

    @property
    def queued_spans(self) -> int:
        return self._queue.rows

    @property
    def queued_bytes(self) -> int:
        return self._queue.bytes

    def close(self, timeout: float | None = None) -> None:
        self._queue.close()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        name_this_thread()
        while (items := self._queue.take()) is not None:
            self._commit(items)

    def _commit(self, items: list[_Batch]) -> None:
        started = time.perf_counter()
        rows, nbytes = sum(i.rows for i in items), sum(i.nbytes for i in items)
        now = datetime.now(UTC).replace(tzinfo=None)
        try:
            spans = [i.spans for i in items if i.spans is not None]
            scores = [i.scores for i in items if i.scores is not None]
            points = [i.metrics for i in items if i.metrics is not None]
            if spans:
                table = pa.concat_tables(spans)
                self._client.insert(INGEST_TABLE, _stamped(table, now), token=token(table))
            if scores:
                self._client.insert("span_scores", micros(_stamped(pa.concat_tables(scores), now)))
            if points:
                self._client.insert("engine_metrics", micros(_stamped(pa.concat_tables(points), now)))
        except Exception as exc:  # noqa: BLE001 - the clients retry the whole request; the writer keeps running
            log.warning("insert of %d rows into ClickHouse failed: %s", rows, str(exc).splitlines()[0][:300])
            if self._metrics:
                self._metrics.commit_failures.inc()
            for item in items:
                item.future.set_exception(exc)
        else:
            if self._metrics:
                self._metrics.inserted.inc(sum(t.num_rows for t in spans))
                self._metrics.scores.inc(sum(t.num_rows for t in scores))
                self._metrics.points.inc(sum(t.num_rows for t in points))
                self._metrics.commit_seconds.observe(time.perf_counter() - started)
                self._metrics.last_commit.set_to_current_time()
            for item in items:
                n = item.spans.num_rows if item.spans is not None else 0
                item.future.set_result(WriteResult(inserted=n, duplicates=0))
        finally:
            self._queue.release(rows, nbytes)
            self._set_queue_gauge()

    def _set_queue_gauge(self) -> None:
        if self._metrics:
            self._metrics.queued_rows.set(self._queue.rows)
            self._metrics.queued_bytes.set(self._queue.bytes)
