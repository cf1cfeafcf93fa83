"""The ingest spool: records read back as written, torn tails skipped, committed segments removed; and the
writer acknowledging from it while behind, retrying what it acknowledged, and replaying it after a crash."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from builders import request, span
from prometheus_client import CollectorRegistry
from small_disks import resize, tmpfs
from test_dedup import Clock
from waiting import HANG_GUARD, wait_until

from collector.decode import Encoding, decode_traces
from storage.duckdb.stored_attributes import with_moved
from storage.duckdb.writer import Writer, from_record, to_record
from storage.ports import WriteResult
from storage.spool import Spool, read_spool
from storage.writer_metrics import WriterMetrics


class Synced:
    """What a spool reported: how far it synced, and failures."""

    def __init__(self) -> None:
        self.through = 0
        self.failures: list[tuple[int, OSError]] = []
        self.cv = threading.Condition()

    def durable(self, through: int) -> None:
        with self.cv:
            self.through = through
            self.cv.notify_all()

    def failed(self, through: int, exc: OSError) -> None:
        with self.cv:
            self.failures.append((through, exc))
            self.cv.notify_all()

    def wait_for(self, offset: int) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: self.through >= offset, HANG_GUARD), f"spool never synced {offset}"


def open_spool(directory: Path, start: int = 0, segment_bytes: int = 2**20) -> tuple[Spool, Synced]:
    synced = Synced()
    return Spool(directory, start, durable=synced.durable, failed=synced.failed, segment_bytes=segment_bytes), synced


def last_end(directory: Path) -> int:
    """Where the spool's last intact record ends (0 for none)."""
    return max((end for end, _ in read_spool(directory, 0)), default=0)


def test_records_read_back_in_order_and_only_past_the_committed_offset(tmp_path: Path) -> None:
    spool, synced = open_spool(tmp_path)
    ends = [spool.append(bytes([i]) * (10 + i)) for i in range(5)]
    synced.wait_for(ends[-1])
    spool.close()
    assert ends == sorted(ends) and ends[0] == 8 + 10
    assert list(read_spool(tmp_path, 0)) == [(end, bytes([i]) * (10 + i)) for i, end in enumerate(ends)]
    assert [end for end, _ in read_spool(tmp_path, ends[2])] == ends[3:]
    assert last_end(tmp_path) == ends[-1]


def test_a_torn_last_record_is_skipped_and_a_new_spool_starts_past_the_intact_ones(tmp_path: Path) -> None:
    spool, synced = open_spool(tmp_path)
    ends = [spool.append(b"x" * 100) for _ in range(3)]
    synced.wait_for(ends[-1])
    spool.close()
    [segment] = tmp_path.glob("*.spool")
    segment.write_bytes(segment.read_bytes()[:-30])  # a crash mid-write
    assert [end for end, _ in read_spool(tmp_path, 0)] == ends[:2]
    assert last_end(tmp_path) == ends[1]

    corrupt = bytearray(segment.read_bytes())
    corrupt[ends[0] + 10] ^= 0xFF  # the second record's payload
    segment.write_bytes(bytes(corrupt))
    assert [end for end, _ in read_spool(tmp_path, 0)] == ends[:1]


def test_a_new_spool_continues_the_offsets_and_removes_the_old_segments(tmp_path: Path) -> None:
    spool, synced = open_spool(tmp_path)
    end = spool.append(b"a" * 50)
    synced.wait_for(end)
    spool.close()
    spool, synced = open_spool(tmp_path, start=last_end(tmp_path))
    assert list(tmp_path.glob("*.spool")) == []
    later = spool.append(b"b" * 50)
    synced.wait_for(later)
    spool.close()
    assert later == end + 58
    assert list(read_spool(tmp_path, 0)) == [(later, b"b" * 50)]


def test_trim_removes_the_segments_whose_every_record_is_committed_and_no_other(tmp_path: Path) -> None:
    spool, synced = open_spool(tmp_path, segment_bytes=1000)
    ends = []
    for _ in range(6):  # one record a write, each write past the segment size: a segment each
        ends.append(spool.append(b"r" * 992))
        synced.wait_for(ends[-1])
    assert len(list(tmp_path.glob("*.spool"))) == 6
    spool.trim(ends[2] - 1)  # the third record is not wholly committed
    assert [e for e, _ in read_spool(tmp_path, 0)] == ends[2:]
    spool.trim(ends[2])
    assert [e for e, _ in read_spool(tmp_path, 0)] == ends[3:]
    spool.trim(ends[-1])  # the segment being written stays
    assert [e for e, _ in read_spool(tmp_path, 0)] == ends[5:]
    spool.close()


def test_a_failed_write_is_reported_and_later_records_go_to_a_new_segment(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "64k") as disk:
        spool, synced = open_spool(disk)
        first = spool.append(b"a" * 1000)
        synced.wait_for(first)
        too_big = spool.append(b"b" * 256 * 1024)  # the disk fills partway through it
        with synced.cv:
            assert synced.cv.wait_for(lambda: synced.failures, HANG_GUARD)
        [(through, exc)] = synced.failures
        assert through == too_big and isinstance(exc, OSError)
        resize(disk, "1m")  # space returns
        after = spool.append(b"c" * 100)
        synced.wait_for(after)
        spool.close()
        assert [(e, p[:1]) for e, p in read_spool(disk, 0)] == [(first, b"a"), (after, b"c")]


# --- the writer acknowledging from the spool ---------------------------------------------------------


def batch(n: int) -> pa.Table:
    return decode_traces(request([span() for _ in range(n)]).SerializeToString(), Encoding.PROTOBUF).spans


def scored_batch(n: int) -> tuple[pa.Table, pa.Table]:
    """A trace batch of `n` spans, each scored by an `eval.*` attribute: (spans, scores)."""
    decoded = decode_traces(
        request(
            [span(attributes={"gen_ai.operation.name": "chat", "eval.json_adherence": 0.91}) for _ in range(n)]
        ).SerializeToString(),
        Encoding.PROTOBUF,
    )
    assert decoded.scores.num_rows == n
    return decoded.spans, decoded.scores


def stored_scores(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in con.cursor().execute("SELECT span_id FROM span_scores").fetchall()]


def stored(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in con.cursor().execute("SELECT span_id FROM spans").fetchall()]


def committed_through(con: duckdb.DuckDBPyConnection) -> int:
    return int(con.cursor().execute("SELECT committed_through FROM ingest_spool").fetchall()[0][0])


DEDUP_WINDOW = 300.0


def spooling_writer(
    con: duckdb.DuckDBPyConnection,
    directory: Path,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
    backlog: int = 1,
) -> Writer:
    writer = Writer(
        con,
        max_queued_spans=10_000,
        dedup_window_seconds=DEDUP_WINDOW,
        dedup_max_spans=100_000,
        metrics=WriterMetrics(registry) if registry is not None else None,
        clock=clock,
        spool=directory,
        spool_backlog=backlog,
    )
    writer.start()
    return writer


def block(writer: Writer, sql: str | None = None) -> tuple[threading.Event, Future[None]]:
    """Keep the writer busy until the event is set: a job holding its thread (having run `sql`), started."""
    started, go = threading.Event(), threading.Event()

    def hold(c: duckdb.DuckDBPyConnection) -> None:
        if sql:
            c.execute(sql)
        started.set()
        assert go.wait(HANG_GUARD)

    held = writer.submit(hold)
    assert started.wait(HANG_GUARD)
    return go, held


def test_behind_the_writer_a_trace_batch_is_acknowledged_from_the_spool_then_committed(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    writer = spooling_writer(con, tmp_path / "spool")
    try:
        ahead = writer.try_submit(batch(3))  # nothing queued ahead: waits for its commit
        assert ahead is not None
        ahead.result(HANG_GUARD)
        go, held = block(writer)
        first = writer.try_submit(batch(4))  # one span ahead of the next: that one is spooled
        behind = writer.try_submit(batch(5))
        assert first is not None and behind is not None
        assert behind.result(HANG_GUARD).inserted == 5  # acknowledged while the writer is still held
        assert not first.done() and len(stored(con)) == 3
        go.set()
        held.result(HANG_GUARD)
        first.result(HANG_GUARD)
        wait_until(lambda: len(stored(con)) == 12, "the spooled batch to be committed")
        assert committed_through(con) == last_end(tmp_path / "spool") > 0
    finally:
        writer.close(HANG_GUARD)


def test_behind_the_writer_a_scored_trace_batch_is_spooled_with_its_scores_and_acknowledged_before_its_commit(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    # Half the spans of a real fleet's traffic carry a score: were a scored batch never spooled, the writer
    # would commit such traffic in small groups, as if there were no spool.
    directory = tmp_path / "spool"
    writer = spooling_writer(con, directory)
    go, held = block(writer)
    try:
        ahead = writer.try_submit(batch(1))
        spans, scores = scored_batch(3)
        scored = writer.try_submit(spans, scores)
        assert ahead is not None and scored is not None
        assert scored.result(HANG_GUARD).inserted == 3  # acknowledged while the writer is still held
        assert stored_scores(con) == []
        [(_, record)] = read_spool(directory, 0)
        spooled_spans, spooled_scores = from_record(record)
        assert spooled_spans.column("span_id") == spans.column("span_id")
        assert spooled_scores is not None and spooled_scores.equals(scores)
        go.set()
        held.result(HANG_GUARD)
        wait_until(lambda: committed_through(con) == last_end(directory), "the spooled batch to be committed")
        assert sorted(stored_scores(con)) == sorted(scores.column("span_id").to_pylist())
    finally:
        go.set()
        writer.close(HANG_GUARD)


def test_a_batch_the_writer_takes_before_it_has_its_spool_offset_is_committed_with_that_offset(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    # A spooled batch is queued, then appended to the spool for its offset. Committed without it, the spool
    # would hold a record past the committed offset after a clean stop, replayed at the next start.
    directory = tmp_path / "spool"
    writer = spooling_writer(con, directory, backlog=0)
    spool = writer._spool
    assert spool is not None
    submitted: list[Future[WriteResult] | None] = []
    try:
        go, held = block(writer)
        with spool._cv:  # the spool's append waits: the batch is queued, its offset not yet given
            submitter = threading.Thread(target=lambda: submitted.append(writer.try_submit(batch(3))))
            submitter.start()
            wait_until(lambda: writer.queued_spans == 3, "the batch to be queued")
            go.set()
            held.result(HANG_GUARD)
            wait_until(lambda: not writer._queue._items, "the writer to take the batch")
        submitter.join(HANG_GUARD)
        [future] = submitted
        assert future is not None and future.result(HANG_GUARD).inserted == 3
        wait_until(lambda: committed_through(con) == last_end(directory) > 0, "the batch's offset to be committed")
    finally:
        writer.close(HANG_GUARD)


def test_a_scored_batch_a_crash_left_in_the_spool_is_replayed_with_its_scores_and_a_retry_stores_neither_again(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    directory = tmp_path / "spool"
    spans, scores = scored_batch(4)
    spool, synced = open_spool(directory)
    synced.wait_for(spool.append(to_record(with_moved(spans), scores)))
    spool.close()

    writer = spooling_writer(con, directory)
    try:
        assert sorted(stored(con)) == sorted(spans.column("span_id").to_pylist())
        assert sorted(stored_scores(con)) == sorted(scores.column("span_id").to_pylist())
        # An exporter that never saw the acknowledgement sends the request again: the replayed scores are in
        # the scores' window, so neither its spans nor its scores are stored twice.
        again = writer.try_submit(spans, scores)
        assert again is not None
        assert again.result(HANG_GUARD).inserted == 0
        assert Counter(stored_scores(con)) == Counter(scores.column("span_id").to_pylist())
    finally:
        writer.close(HANG_GUARD)


def test_spooled_batches_a_crash_left_uncommitted_are_replayed_at_start_and_stored_once(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    directory = tmp_path / "spool"
    committed, lost = batch(4), batch(6)
    # What a crash leaves: two records synced, the first committed with its offset, the second not.
    spool, synced = open_spool(directory)
    first = spool.append(to_record(with_moved(committed)))
    second = spool.append(to_record(with_moved(lost)))
    synced.wait_for(second)
    spool.close()
    plain = Writer(con, max_queued_spans=10_000, dedup_window_seconds=300, dedup_max_spans=100_000)
    plain.start()
    done = plain.try_submit(committed)
    assert done is not None
    done.result(HANG_GUARD)
    plain.close(HANG_GUARD)
    con.execute("UPDATE ingest_spool SET committed_through = ?", [first])

    writer = spooling_writer(con, directory)
    ids = stored(con)
    assert sorted(ids) == sorted(committed.column("span_id").to_pylist() + lost.column("span_id").to_pylist())
    assert committed_through(con) == second
    assert list(read_spool(directory, 0)) == []  # replayed: the new spool starts past it
    # ... so what it spools next ends past the committed offset, and a later replay would not skip it.
    go, held = block(writer)
    ahead, later = writer.try_submit(batch(1)), writer.try_submit(batch(2))
    assert ahead is not None and later is not None
    later.result(HANG_GUARD)
    assert last_end(directory) > second
    go.set()
    held.result(HANG_GUARD)
    writer.close(HANG_GUARD)
    assert committed_through(con) > second


def test_a_restart_replays_only_what_lies_past_the_committed_offset_not_a_batch_the_window_forgot(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    directory = tmp_path / "spool"
    clock = Clock(1_795_000_000.0)
    ahead, spooled, newest = batch(1), batch(3), batch(2)
    writer = spooling_writer(con, directory, clock=clock)
    try:
        go, held = block(writer)
        waiting, acknowledged = writer.try_submit(ahead), writer.try_submit(spooled)  # the second is spooled
        assert waiting is not None and acknowledged is not None
        acknowledged.result(HANG_GUARD)
        go.set()
        held.result(HANG_GUARD)
        waiting.result(HANG_GUARD)
        wait_until(lambda: committed_through(con) == last_end(directory) > 0, "the spooled batch to be committed")
        # The duplicate window is rebuilt back from the newest stored span: one committed more than a window
        # later leaves the spooled batch outside it, so only the committed offset keeps a replay from storing
        # it again.
        clock.now += DEDUP_WINDOW + 1
        later = writer.try_submit(newest)  # nothing queued ahead: committed, not spooled
        assert later is not None
        later.result(HANG_GUARD)
    finally:
        writer.close(HANG_GUARD)
    # The segment being written is never trimmed, so the committed record is still on disk at the restart.
    assert [end for end, _ in read_spool(directory, 0)] == [committed_through(con)]

    spooling_writer(con, directory, clock=clock).close(HANG_GUARD)
    expected = {span_id: 1 for t in (ahead, spooled, newest) for span_id in t.column("span_id").to_pylist()}
    assert Counter(stored(con)) == expected


def test_an_acknowledged_batch_whose_commit_fails_is_committed_by_a_later_attempt(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    writer = spooling_writer(con, tmp_path / "spool")
    try:
        # Every commit fails until the table is back.
        go, held = block(writer, "ALTER TABLE span_rows RENAME TO span_rows_away")
        waiting = writer.try_submit(batch(2))  # waits for its commit: failed with it
        spooled = writer.try_submit(batch(3))  # acknowledged from the spool: retried
        assert waiting is not None and spooled is not None
        spooled.result(HANG_GUARD)
        go.set()
        held.result(HANG_GUARD)
        with pytest.raises(duckdb.Error):
            waiting.result(HANG_GUARD)
        # The failed batch is done with; the acknowledged one is still held, and the queue's bounds cover it.
        assert writer.queued_spans == 3 and writer.queued_bytes > 0
        back = writer.submit(lambda c: c.execute("ALTER TABLE span_rows_away RENAME TO span_rows"))
        back.result(HANG_GUARD)
        wait_until(lambda: len(stored(con)) == 3, "the acknowledged batch to be committed")
        assert (writer.queued_spans, writer.queued_bytes) == (0, 0)
    finally:
        writer.close(HANG_GUARD)


def test_a_batch_the_spool_cannot_take_is_acknowledged_at_its_commit_and_the_failure_counted(
    con: duckdb.DuckDBPyConnection, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    with tmpfs(tmp_path / "small", "64k") as disk:
        writer = spooling_writer(con, disk / "spool", registry)
        try:
            go, held = block(writer)
            ahead = writer.try_submit(batch(1))
            too_big = writer.try_submit(batch(300))  # spooled, but its record is larger than the disk
            assert ahead is not None and too_big is not None
            wait_until(
                lambda: registry.get_sample_value("tailwatch_spool_write_failures_total") == 1,
                "the spool write to fail",
            )
            assert not too_big.done()  # not on disk: it waits for its commit
            assert "writing the ingest spool failed" in caplog.text and "No space left on device" in caplog.text
            resize(disk, "1m")
            later = writer.try_submit(batch(2))  # synced once there is room: acknowledged, and only it
            assert later is not None
            later.result(HANG_GUARD)
            assert not too_big.done()
            go.set()
            held.result(HANG_GUARD)
            assert too_big.result(HANG_GUARD).inserted == 300
            assert len(stored(con)) == 303
            assert registry.get_sample_value("tailwatch_spool_acknowledged_spans_total") == 2
        finally:
            writer.close(HANG_GUARD)
