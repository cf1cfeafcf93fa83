"""The single writer: one thread owns the read-write DuckDB connection and commits in groups.

Receivers hand decoded batches to `try_submit`; the writer drains everything queued into one
transaction, commits, and only then resolves each request's future, so a success response always
means the spans are durable (group commit). The queue is bounded in rows: when it is full the
receiver answers 'retry later' instead of growing memory.

While the writer is behind (`spool_backlog` spans already queued), a trace request's batch is also
appended to the ingest spool (storage/spool.py) and acknowledged once that is synced, without waiting for
the commits ahead of it: the writer then commits larger groups, which cost far less a span. Such a batch
is never dropped: if its commit fails it is retried, and if the process dies first it is replayed from the
spool at the next start (`ingest_spool.committed_through`, updated in each commit, says how far).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, TypeVar

import duckdb
import polars as pl
import pyarrow as pa

from model.thread_names import name_this_thread
from storage.dedup import Identities, RecentSpans, first_in_group, score_keys, span_keys
from storage.duckdb.space import DiskSpace, reserve_path
from storage.duckdb.stored_attributes import insert_spans_sql, with_moved
from storage.group_queue import DEFAULT_MAX_BYTES, GroupQueue
from storage.ports import WriteResult
from storage.spool import Spool, read_spool
from storage.writer_metrics import WriterMetrics

log = logging.getLogger(__name__)
T = TypeVar("T")
_BATCH_VIEW = "_tailwatch_batch"
_SCORES_VIEW = "_tailwatch_scores"
_METRICS_VIEW = "_tailwatch_metric_points"
_RETRY_SECONDS = 1.0  # how soon a failed commit of acknowledged batches is tried again


@dataclass
class _Batch:
    table: pa.Table | None  # spans; None for a batch of scores (OTLP logs) or engine metric points only
    scores: pa.Table | None
    metrics: pa.Table | None
    identities: Identities  # of `table`'s spans: keys for the duplicate window, firsts within the batch
    score_keys: list[int] = field(default_factory=list)  # of `scores`' rows, for the scores' window
    future: Future[WriteResult] = field(default_factory=Future)
    spooled_to: int = 0  # the spool offset its record ends at; 0 when it is not in the spool
    acknowledged: bool = False  # from the spool, before its commit: it must be committed whatever happens

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in (self.table, self.scores, self.metrics) if t is not None)

    @cached_property
    def nbytes(self) -> int:
        """What its tables hold, the buffers they keep alive: the queue's bound in bytes counts it (computed
        once: it is released by it too). Not `nbytes`, which walks every array's offsets for the ranges in use:
        0.17 against 0.02 µs a span, on the decoder's thread."""
        return sum(t.get_total_buffer_size() for t in (self.table, self.scores, self.metrics) if t is not None)


@dataclass
class _Job(Generic[T]):
    fn: Callable[[duckdb.DuckDBPyConnection], T]
    future: Future[T] = field(default_factory=Future)
    transaction: bool = True


class Writer:
    """Owns the write connection; every change to the database runs on its thread."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        *,
        max_queued_spans: int,
        max_queued_bytes: int = DEFAULT_MAX_BYTES,
        dedup_window_seconds: float,
        dedup_max_spans: int,
        metrics: WriterMetrics | None = None,
        clock: Callable[[], float] = time.time,
        reserve_bytes: int = 0,
        spool: Path | None = None,
        spool_backlog: int = 1000,
    ) -> None:
        """`spool`: the ingest spool's directory (None: every acknowledgement waits for its commit);
        `spool_backlog`: spans queued ahead of a trace batch past which it is spooled and acknowledged early."""
        self._con = con
        self._metrics = metrics
        self._clock = clock
        self._recent = RecentSpans(dedup_window_seconds, dedup_max_spans)
        # Scores have a window of their own: a score sent in logs has no span in the spans' window.
        self._recent_scores = RecentSpans(dedup_window_seconds, dedup_max_spans)
        self._queue: GroupQueue[_Batch | _Job[Any]] = GroupQueue(max_queued_spans, max_queued_bytes)
        self._spool_dir = spool
        self._spool: Spool | None = None
        self._spool_backlog = spool_backlog
        self._submit_lock = threading.Lock()  # a spooled batch is queued and appended as one step: same order
        self._ack_lock = threading.Lock()  # the spool's thread and the writer's both settle futures
        self._awaiting_spool: deque[_Batch] = deque()  # spooled, not yet synced, in spool order
        self._retry: list[_Batch] = []  # acknowledged from the spool, their commit failed: in the next group
        self.invalidated: duckdb.FatalException | None = None  # set once a fatal error invalidated the database
        self._thread = threading.Thread(target=self._run, name="tailwatch-writer", daemon=True)
        [(path,)] = con.execute(
            "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
        ).fetchall()
        self.disk = DiskSpace(
            Path(path).parent if path else None,
            reserve=reserve_path(path) if path else None,
            reserve_bytes=reserve_bytes,
        )
        if metrics is not None:
            self.disk.changed = lambda full: metrics.storage_full.set(1 if full else 0)

    def start(self) -> None:
        """Rebuild the duplicate window from the newest stored spans, then start the writer thread."""
        now = self._clock()
        for recent, kept in ((self._recent, _SPANS_KEPT), (self._recent_scores, _SCORES_KEPT)):
            for since, keys in _recent_commits(self._con, kept, recent.window_seconds, recent.max_spans):
                recent.add(keys, now, since)
        self.disk.keep_reserve()
        if self._spool_dir is not None:
            self._replay_spool(self._spool_dir)
            # Replayed, everything intact in the spool is committed: the new one goes on from there.
            self._spool = Spool(
                self._spool_dir,
                _committed_through(self._con),
                durable=self._spool_synced,
                failed=self._spool_failed,
            )
        self._thread.start()

    def _replay_spool(self, directory: Path) -> None:
        """Commit what the spool holds past its committed point: batches acknowledged before a crash."""
        replayed = 0
        for group in _groups(read_spool(directory, _committed_through(self._con)), self._queue.max_rows):
            self._commit(group)
            if self._retry:  # the database refuses them: start no further, and keep the spool
                raise RuntimeError(f"replaying the ingest spool in {directory} failed; see the error above")
            replayed += sum(i.rows for i in group)
        if replayed:
            log.warning("replayed %d spans acknowledged before the last stop from the ingest spool", replayed)

    def try_submit(
        self, spans: pa.Table | None, scores: pa.Table | None = None, metrics: pa.Table | None = None
    ) -> Future[WriteResult] | None:
        """Queue spans, scores and engine metric points for the next group commit; None when full or closing."""
        table = with_moved(spans) if spans is not None else None
        scores = scores if scores is not None and scores.num_rows else None
        item = _Batch(
            table,
            scores,
            metrics if metrics is not None and metrics.num_rows else None,
            # Hashed on the submitting thread (a decoder's), not the writer's: ingest waits on the writer alone.
            identities=Identities.of(table) if table is not None else Identities([], []),
            score_keys=score_keys(scores) if scores is not None else [],
        )
        spool = self._spool
        # A record holds a trace batch's spans and their scores, so only a trace batch is spooled; below the
        # backlog its commit comes soon.
        if spool is None or table is None or item.metrics is not None or self._queue.rows < self._spool_backlog:
            if not self._queue.offer(item, item.rows, item.nbytes):
                return None
        else:
            record = to_record(table, item.scores)  # on the submitting thread: the writer's time is the scarce one
            with self._submit_lock:
                if not self._queue.offer(item, item.rows, item.nbytes):
                    return None
                item.spooled_to = spool.append(record)
                self._awaiting_spool.append(item)
        self._set_queue_gauge()
        return item.future

    def submit(self, fn: Callable[[duckdb.DuckDBPyConnection], T], *, transaction: bool = True) -> Future[T]:
        """Run `fn(connection)` on the writer thread inside its own transaction (or none, for a CHECKPOINT)."""
        job: _Job[T] = _Job(fn, transaction=transaction)
        self._queue.put(job)
        return job.future

    @property
    def queued_spans(self) -> int:
        return self._queue.rows

    @property
    def queued_bytes(self) -> int:
        return self._queue.bytes

    def close(self, timeout: float | None = None) -> None:
        """Stop taking work, commit everything already queued, and stop the thread. Idempotent."""
        self._queue.close()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._spool is not None and not self._thread.is_alive():
            self._spool.close()
            self._spool = None

    def _run(self) -> None:
        name_this_thread()
        # With acknowledged batches to retry, wake without new work too.
        while (items := self._queue.take(_RETRY_SECONDS if self._retry else None)) is not None:
            spans = [*self._retry, *(i for i in items if isinstance(i, _Batch))]
            self._retry = []
            if spans:
                self._queue.release(*self._commit(spans))
                self._set_queue_gauge()
            for job in items:
                if isinstance(job, _Job):
                    self._run_job(job)

    def _commit(self, items: list[_Batch]) -> tuple[int, int]:
        """Commit `items` in one transaction and settle their futures; returns the rows and bytes done with (the
        queue's bounds stop covering them), which exclude acknowledged batches kept to retry."""
        started = time.perf_counter()
        rows, nbytes = sum(i.rows for i in items), sum(i.nbytes for i in items)
        # A spooled batch is queued, then given its offset, under the submit lock: taken in between, it would be
        # committed without its offset, and the spool would replay it after the next start.
        with self._submit_lock:
            spooled_to = max(i.spooled_to for i in items)
        span_tables = [i.table for i in items if i.table is not None]
        score_tables = [i.scores for i in items if i.scores is not None]
        now = self._clock()
        try:
            if span_tables:
                combined = pa.concat_tables(span_tables)
                keep, keys = self._new_rows(combined, [i.identities for i in items if i.table is not None])
                batch = combined if all(keep) else combined.filter(pa.array(keep, pa.bool_()))
            else:
                keep, keys, batch = [], [], None
            scores = pa.concat_tables(score_tables) if score_tables else None
            scored = [k for i in items for k in i.score_keys]
            # Only a score whose key was committed within the window can be stored already (or a collision).
            since = self._recent_scores.oldest_ingest() if any(self._recent_scores.contains(scored)) else None
            metric_tables = [i.metrics for i in items if i.metrics is not None]
            points = pa.concat_tables(metric_tables) if metric_tables else None
            stored_scores = self._insert(batch, (scores, since), points, now, spooled_to)
        except Exception as exc:  # the batch is retried by the clients; the writer must keep running
            if not self.disk.failed(exc) and not self._invalidated_by(exc):
                log.exception("group commit of %d spans failed; rolled back", rows)
            if self._metrics:
                self._metrics.commit_failures.inc()
            with self._ack_lock:
                for item in items:
                    if item.acknowledged:
                        self._retry.append(item)
                    else:
                        item.future.set_exception(exc)
            # Those still held: the queue's bounds cover them.
            return rows - sum(i.rows for i in self._retry), nbytes - sum(i.nbytes for i in self._retry)
        else:
            self._recent.add([k for k, kept in zip(keys, keep, strict=True) if kept], now)
            self._recent_scores.add(scored, now)
            self.disk.committed()
            # Counted before anyone is told: a client that saw its spans acknowledged sees them counted.
            if self._metrics:
                stored_spans = batch.num_rows if batch is not None else 0
                self._metrics.inserted.inc(stored_spans)
                self._metrics.duplicates.inc(len(keep) - stored_spans)
                self._metrics.scores.inc(stored_scores)
                self._metrics.points.inc(points.num_rows if points is not None else 0)
                self._metrics.commit_seconds.observe(time.perf_counter() - started)
                self._metrics.last_commit.set_to_current_time()
                self._metrics.dedup_seconds.set(self._recent.covered_seconds(now))
            offset = 0
            with self._ack_lock:
                for item in items:
                    n = item.table.num_rows if item.table is not None else 0
                    inserted = sum(keep[offset : offset + n])
                    offset += n
                    if not item.future.done():  # unless acknowledged from the spool already
                        item.future.set_result(WriteResult(inserted=inserted, duplicates=n - inserted))
            if self._spool is not None and spooled_to:
                self._spool.trim(spooled_to)
            return rows, nbytes

    def _new_rows(self, table: pa.Table, identities: list[Identities]) -> tuple[list[bool], list[int]]:
        """Which rows to insert: first in the group and not committed before. Returns (keep, keys)."""
        keys = [k for i in identities for k in i.keys]
        keep = first_in_group(identities, table)
        suspects = [i for i, hit in enumerate(self._recent.contains(keys)) if hit and keep[i]]
        since = self._recent.oldest_ingest()
        if suspects and since is not None:
            for i in _confirm_stored(self._con, table.take(suspects), suspects, since):
                keep[i] = False
        return keep, keys

    def _insert(
        self,
        spans: pa.Table | None,
        scored: tuple[pa.Table | None, float | None],
        points: pa.Table | None,
        now: float,
        spooled_to: int,
    ) -> int:
        """Insert spans, scores and metric points in one transaction, and say how far the spool is committed;
        `scored`: the scores, and since when stored ones must be compared (None: none can be stored);
        returns how many scores were new."""
        con = self._con
        ingested_at = _timestamp(now)
        scores, since = scored
        stored_scores = 0
        con.execute("BEGIN")
        try:
            if spans is not None and spans.num_rows:
                con.register(_BATCH_VIEW, spans)
                insert = insert_spans_sql(_BATCH_VIEW, tuple(spans.column_names))
                con.execute(insert, [ingested_at])
            if scores is not None and scores.num_rows:
                stored_scores = _insert_scores(con, scores, ingested_at, since)
            if points is not None:
                _insert_as(con, "engine_metrics", _METRICS_VIEW, points, ingested_at)
            if spooled_to:
                con.execute("UPDATE ingest_spool SET committed_through = ?", [spooled_to])
            con.execute("COMMIT")
        except BaseException:
            _rollback(con)
            raise
        finally:
            con.unregister(_BATCH_VIEW)
            con.unregister(_SCORES_VIEW)
            con.unregister(_METRICS_VIEW)
        return stored_scores

    def _run_job(self, job: _Job[Any]) -> None:
        con = self._con
        try:
            if not job.transaction:
                result = job.fn(con)
            else:
                con.execute("BEGIN")
                result = job.fn(con)
                con.execute("COMMIT")
        except Exception as exc:  # a failing job must not take the writer down with it
            _rollback(con)
            if not self._invalidated_by(exc):
                log.exception("writer job %s failed", getattr(job.fn, "__name__", job.fn))
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)

    def _invalidated_by(self, exc: BaseException) -> bool:
        """Whether `exc` is DuckDB's fatal error: the database refuses every statement until it is reopened.
        Said once, with what to do; every later write fails at once with the same error, and /readyz is 503."""
        if not isinstance(exc, duckdb.FatalException):
            return False
        if self.invalidated is None:
            self.invalidated = exc
            log.error(
                "the database was invalidated by a fatal error and takes no more writes until Tailwatch is "
                "restarted (free disk space first if it is full; storage.reserve_mb keeps room for this): %s",
                str(exc).splitlines()[0],
            )
        return True

    def _spool_synced(self, through: int) -> None:
        """On the spool's thread: acknowledge the batches synced up to `through` that are not committed yet."""
        acknowledged = 0
        with self._ack_lock:
            while self._awaiting_spool and self._awaiting_spool[0].spooled_to <= through:
                item = self._awaiting_spool.popleft()
                if not item.future.done():  # committed already, or its commit failed and the client retries
                    item.acknowledged = True
                    n = item.table.num_rows if item.table is not None else 0
                    acknowledged += n
                    item.future.set_result(WriteResult(inserted=n, duplicates=0))
        if self._metrics and acknowledged:
            self._metrics.spool_acknowledged.inc(acknowledged)

    def _spool_failed(self, through: int, exc: OSError) -> None:
        """On the spool's thread: the batches up to `through` are not on disk, so they wait for their commit.
        (Their offsets still count once committed: a replay skips what the failed write left intact.)"""
        with self._ack_lock:
            while self._awaiting_spool and self._awaiting_spool[0].spooled_to <= through:
                self._awaiting_spool.popleft()
        if self._metrics:
            self._metrics.spool_failures.inc()
        log.warning("writing the ingest spool failed; its requests are acknowledged at their commit: %s", exc)

    def _set_queue_gauge(self) -> None:
        if self._metrics:
            self._metrics.queued_rows.set(self._queue.rows)
            self._metrics.queued_bytes.set(self._queue.bytes)


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    # A COMMIT that failed (a full disk) has already ended the transaction, and a database invalidated by a
    # fatal error refuses the ROLLBACK too: either way there is nothing left to undo, and the failure that
    # led here is the one to report.
    with contextlib.suppress(duckdb.Error):
        con.execute("ROLLBACK")


def _insert_as(con: duckdb.DuckDBPyConnection, table: str, view: str, batch: pa.Table, ingested_at: datetime) -> None:
    columns = ", ".join(batch.column_names)
    con.register(view, batch)
    con.execute(f"INSERT INTO {table} ({columns}, ingested_at) SELECT {columns}, ? FROM {view}", [ingested_at])


def _insert_scores(con: duckdb.DuckDBPyConnection, scores: pa.Table, ingested_at: datetime, since: float | None) -> int:
    """Insert the scores not stored since `since` (None: all of them, each once): a retried request carries
    the same (span, name, source, time), compared as stored: to the microsecond. Bounded so, the look-up reads
    the window's scores, not every one stored (28 µs a span with 3M stored, 1.3 bounded)."""
    columns = ", ".join(scores.column_names)
    con.register(_SCORES_VIEW, scores)
    stored = (
        ""
        if since is None
        else """
        WHERE NOT EXISTS (
            SELECT 1 FROM span_scores AS s
            WHERE s.ingested_at >= ? AND s.observed_at = b.observed_at::TIMESTAMP AND s.trace_id = b.trace_id
              AND s.span_id = b.span_id AND s.name = b.name AND s.source = b.source
        )"""
    )
    inserted = con.execute(
        f"INSERT INTO span_scores ({columns}, ingested_at) SELECT DISTINCT {columns}, ? FROM {_SCORES_VIEW} AS b"
        f"{stored} RETURNING 1",
        [ingested_at] if since is None else [ingested_at, _timestamp(since)],
    ).fetchall()
    return len(inserted)


def to_record(spans: pa.Table, scores: pa.Table | None = None) -> bytes:
    """A trace batch as a spool record: its spans as an Arrow IPC stream, then its scores as a second one when
    it has any (a record of spans alone, as every record was before scores were spooled, reads back the same)."""
    sink = pa.BufferOutputStream()
    for table in (spans, scores):
        if table is not None:
            with pa.ipc.new_stream(sink, table.schema) as stream:
                stream.write_table(table)
    record: bytes = sink.getvalue().to_pybytes()
    return record


def from_record(record: bytes) -> tuple[pa.Table, pa.Table | None]:
    """(spans, scores) of a spool record; scores None when it has none."""
    source = pa.BufferReader(record)
    spans = pa.ipc.open_stream(source).read_all()  # reads up to its end-of-stream marker, no further
    scores = pa.ipc.open_stream(source).read_all() if source.tell() < len(record) else None
    return spans, scores


def _groups(records: Iterator[tuple[int, bytes]], max_rows: int) -> Iterator[list[_Batch]]:
    """Spool records as batches to commit, in groups of at most `max_rows` rows, spans and scores (one when
    larger)."""
    group: list[_Batch] = []
    rows = 0
    for end, record in records:
        table, scores = from_record(record)
        item = _Batch(
            table,
            scores,
            None,
            Identities.of(table),
            score_keys=score_keys(scores) if scores is not None else [],
            spooled_to=end,
            acknowledged=True,
        )
        if group and rows + item.rows > max_rows:
            yield group
            group, rows = [], 0
        group.append(item)
        rows += item.rows
    if group:
        yield group


def _committed_through(con: duckdb.DuckDBPyConnection) -> int:
    [(through,)] = con.execute("SELECT committed_through FROM ingest_spool").fetchall()
    return int(through)


def _timestamp(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class _Kept:
    """A table whose recent commits a window remembers: its identity columns and how they are keyed."""

    table: str
    identity: str
    keys: Callable[[pa.Table], list[int]]


_SPANS_KEPT = _Kept("spans", "trace_id, span_id", lambda rows: span_keys(rows).to_list())
_SCORES_KEPT = _Kept("span_scores", "trace_id, span_id, name, source, observed_at", score_keys)


def _recent_commits(
    con: duckdb.DuckDBPyConnection, kept: _Kept, window_seconds: float, max_rows: int
) -> list[tuple[float, list[int]]]:
    """The commits of the last window before the newest row stored in `kept.table`, oldest first, as
    (ingested_at, keys): at most the newest `max_rows` rows, which are the ones a crash left unanswered.

    One chunk a commit, as the writer remembers them while running: the count bound then evicts the
    oldest commits one by one. (As one chunk, the first commit after a restart pushed it over the bound
    and it went whole, and retries of the last requests before the crash were stored twice.)"""
    # Relative to the newest stored row rather than the clock: after a crash, retries of requests that
    # were committed just before it must still be recognised, however long the restart took.
    newest = con.execute(f"SELECT epoch(max(ingested_at)) FROM {kept.table}").fetchall()[0][0]
    if newest is None or max_rows <= 0:
        return []
    rows = con.sql(
        f"SELECT {kept.identity}, epoch(ingested_at) AS at FROM {kept.table} WHERE ingested_at >= ? "
        "ORDER BY ingested_at DESC LIMIT ?",
        params=[_timestamp(float(newest) - window_seconds), max_rows],
    ).to_arrow_table()
    frame = pl.DataFrame({"at": rows.column("at"), "key": pl.Series(kept.keys(rows), dtype=pl.UInt64)})
    commits = frame.group_by("at").agg("key").sort("at")
    # A confirming lookup starts at `since`: a millisecond early, so a float's rounding never skips the commit.
    return [(float(at) - 0.001, list(keys)) for at, keys in commits.iter_rows()]


def _confirm_stored(
    con: duckdb.DuckDBPyConnection, candidates: pa.Table, positions: list[int], since: float
) -> list[int]:
    """Positions (from `positions`) whose exact (trace_id, span_id) is already stored."""
    probe = pa.table(
        {
            "pos": pa.array(positions, pa.int64()),
            "trace_id": candidates.column("trace_id"),
            "span_id": candidates.column("span_id"),
        }
    )
    con.register("_tailwatch_probe", probe)
    try:
        rows = con.execute(
            """
            SELECT DISTINCT p.pos FROM _tailwatch_probe p
            JOIN spans s ON s.trace_id = p.trace_id AND s.span_id = p.span_id
            WHERE s.ingested_at >= ?
            """,
            [_timestamp(since)],
        ).fetchall()
    finally:
        con.unregister("_tailwatch_probe")
    return [int(r[0]) for r in rows]
