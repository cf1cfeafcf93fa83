"""Retried spans are stored once: the writer's window of recent span identities, its bounds, and its rebuild
after a restart (from the newest stored span, not from the clock)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry
from waiting import WriterHold, join

from model.columns import SCORE_BATCH_SCHEMA, SPAN_BATCH_SCHEMA
from storage.dedup import Identities, RecentSpans, first_in_group, first_occurrences, score_keys, span_keys
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.writer import Writer, WriteResult
from storage.writer_metrics import WriterMetrics

WINDOW = 300.0
T = 1_795_000_000.0  # 2026-11-18, a whole second: ingested_at keeps it exactly
TIMEOUT = 30


class Clock:
    """The writer's clock, moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spans(*ids: str) -> pa.Table:
    start = datetime(2026, 11, 18, 12, 0, 0)
    end = datetime(2026, 11, 18, 12, 0, 2)
    rows = [
        {
            "trace_id": f"trace-{i}",
            "span_id": f"span-{i}",
            "name": "llm_request",
            "kind": "SERVER",
            "start_time": start,
            "end_time": end,
            "duration_ms": 2000.0,
            "status_code": "UNSET",
        }
        for i in ids
    ]
    return pa.Table.from_pylist(rows, schema=SPAN_BATCH_SCHEMA)


@contextmanager
def writer_on(
    db: Path,
    clock: Clock,
    *,
    window: float = WINDOW,
    max_spans: int = 1_000_000,
    registry: CollectorRegistry | None = None,
) -> Iterator[Writer]:
    """A started writer on the migrated database file; closed (and the file released) on exit."""
    con = open_database(db)
    migrate.upgrade(con)
    writer = Writer(
        con,
        max_queued_spans=10_000,
        dedup_window_seconds=window,
        dedup_max_spans=max_spans,
        metrics=WriterMetrics(registry or CollectorRegistry()),
        clock=clock,
    )
    writer.start()
    try:
        yield writer
    finally:
        writer.close(timeout=TIMEOUT)
        con.close()


def write(writer: Writer, table: pa.Table) -> WriteResult:
    future = writer.try_submit(table)
    assert future is not None
    return future.result(timeout=TIMEOUT)


def gauge(writer: Writer, registry: CollectorRegistry) -> float | None:
    """The dedup gauge once the writer has finished its last commit (a job runs only after it)."""
    writer.submit(lambda _con: None).result(timeout=TIMEOUT)
    return registry.get_sample_value("tailwatch_dedup_window_seconds")


def stored(db: Path) -> dict[str, int]:
    """How many rows each span_id has in the file."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return dict(con.execute("SELECT span_id, count(*) FROM spans GROUP BY span_id").fetchall())
    finally:
        con.close()


def committed_together(writer: Writer, *batches: pa.Table) -> list[WriteResult]:
    """Each batch's answer, the batches queued behind a held writer so that they commit as one group."""
    with WriterHold(writer):
        futures = [writer.try_submit(batch) for batch in batches]
    return [f.result(timeout=TIMEOUT) for f in futures if f is not None]


def keys(*ids: str) -> list[int]:
    return span_keys(spans(*ids)).to_list()


# --- the writer across a restart ------------------------------------------------------------------------


def test_a_retry_after_a_restart_longer_than_the_window_is_still_a_duplicate(tmp_path: Path) -> None:
    db = tmp_path / "restart.duckdb"
    with writer_on(db, Clock(T)) as writer:
        assert write(writer, spans("a", "b", "c")) == WriteResult(inserted=3, duplicates=0)
    # The process was down for an hour more than the window: measured from the clock, the stored spans
    # would all be too old to remember; measured from the newest stored span, they are the window.
    with writer_on(db, Clock(T + WINDOW + 3600)) as writer:
        assert write(writer, spans("a", "b", "c", "d")) == WriteResult(inserted=1, duplicates=3)
        assert write(writer, spans("d", "a")) == WriteResult(inserted=0, duplicates=2)
    assert stored(db) == {"span-a": 1, "span-b": 1, "span-c": 1, "span-d": 1}


def test_the_rebuilt_window_reaches_back_exactly_the_window_from_the_newest_stored_span(tmp_path: Path) -> None:
    db = tmp_path / "edge.duckdb"
    clock = Clock(T - WINDOW - 1)
    with writer_on(db, clock) as writer:
        write(writer, spans("outside"))
        clock.now = T - WINDOW
        write(writer, spans("edge"))
        clock.now = T
        write(writer, spans("newest"))
    with writer_on(db, Clock(T + 10 * WINDOW)) as writer:
        # A span stored exactly one window before the newest is remembered; one a second older is not
        # (it is stored again: the window is the promise, not forever).
        assert write(writer, spans("edge", "newest")) == WriteResult(inserted=0, duplicates=2)
        assert write(writer, spans("outside")) == WriteResult(inserted=1, duplicates=0)
    assert stored(db) == {"span-outside": 2, "span-edge": 1, "span-newest": 1}


def test_a_retry_after_a_crash_is_a_duplicate_when_the_window_held_more_than_max_spans(tmp_path: Path) -> None:
    """Found by bench/crash_cycles.py: at 20k spans/s the last window holds millions of spans, more than
    max_spans. Rebuilt as one chunk, the window was evicted whole (at once, or at the first commit after the
    restart) and the retries of the requests a kill left unanswered were stored twice. The newest max_spans
    are the ones to remember, one chunk per commit as while running."""
    db = tmp_path / "busy.duckdb"
    clock = Clock(T)
    with writer_on(db, clock, max_spans=5) as writer:
        for i in range(4):
            clock.now = T + i
            write(writer, spans(f"{i}-a", f"{i}-b", f"{i}-c"))
    with writer_on(db, Clock(T + 60), max_spans=5) as writer:
        # Other clients' first commit after the restart pushes the window over its bound: the oldest
        # remembered commit goes, not the whole rebuilt window (found by the crash cycles too).
        assert write(writer, spans("new")) == WriteResult(inserted=1, duplicates=0)
        # The last request before the crash is still recognised when its retry comes.
        assert write(writer, spans("3-a", "3-b", "3-c")) == WriteResult(inserted=0, duplicates=3)
        assert write(writer, spans("0-a")) == WriteResult(inserted=1, duplicates=0)  # beyond the bound
    assert stored(db)["span-3-a"] == 1 and stored(db)["span-0-a"] == 2


def test_an_empty_database_starts_with_an_empty_window(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    with writer_on(db, Clock(T)) as writer:
        assert writer.submit(lambda _con: len(writer._recent)).result(timeout=TIMEOUT) == 0
        assert write(writer, spans("a", "a", "b")) == WriteResult(inserted=2, duplicates=1)
    assert stored(db) == {"span-a": 1, "span-b": 1}


# --- the count bound ------------------------------------------------------------------------------------


def test_max_spans_evicts_the_oldest_chunks_first() -> None:
    recent = RecentSpans(window_seconds=100, max_spans=5)
    chunks = [[10, 11], [20, 21], [30, 31], [40, 41]]
    for at, chunk in enumerate(chunks):
        recent.add(chunk, at=float(at))
        assert len(recent) <= 5
    assert len(recent) == 4
    assert recent.contains([10, 11, 20, 21, 30, 31, 40, 41]) == [False] * 4 + [True] * 4
    # The count bound binds: duplicates are caught only as far back as the oldest chunk left, 1 s.
    assert recent.covered_seconds(3.0) == 1.0
    assert recent.covered_seconds(3.0) < recent.window_seconds


def test_when_the_count_bound_does_not_bind_the_whole_age_is_covered() -> None:
    recent = RecentSpans(window_seconds=100, max_spans=8)
    for at, chunk in enumerate([[10, 11], [20, 21], [30, 31], [40, 41]]):
        recent.add(chunk, at=float(at))
    assert len(recent) == 8
    assert recent.contains([10, 41]) == [True, True]
    assert recent.covered_seconds(3.0) == 3.0
    assert recent.covered_seconds(50.0) == 50.0
    # One more key than max_spans: only the oldest chunk goes.
    recent.add([50], at=4.0)
    assert len(recent) == 7
    assert recent.contains([10, 11, 20, 50]) == [False, False, True, True]
    assert recent.covered_seconds(4.0) == 3.0


def test_the_writer_reports_a_shortened_window_when_max_spans_binds(tmp_path: Path) -> None:
    db = tmp_path / "bound.duckdb"
    registry = CollectorRegistry()
    clock = Clock(T)
    with writer_on(db, clock, max_spans=4, registry=registry) as writer:
        for step, pair in enumerate([("a1", "a2"), ("b1", "b2"), ("c1", "c2")]):
            clock.now = T + 10 * step
            assert write(writer, spans(*pair)) == WriteResult(inserted=2, duplicates=0)
        assert writer.submit(lambda _con: len(writer._recent)).result(timeout=TIMEOUT) == 4
        # Six spans in, four remembered: the first commit (T) was forgotten, so the window reaches back
        # only to the second (T + 10), 10 s rather than 20 s, and far less than the configured 300 s.
        assert gauge(writer, registry) == 10.0
        # The newest are still caught; the evicted oldest are not (stored a second time).
        assert write(writer, spans("b1", "c2")) == WriteResult(inserted=0, duplicates=2)
        assert write(writer, spans("a1")) == WriteResult(inserted=1, duplicates=0)
    assert stored(db) == {"span-a1": 2, "span-a2": 1, "span-b1": 1, "span-b2": 1, "span-c1": 1, "span-c2": 1}


def test_the_writer_reports_the_full_age_when_max_spans_does_not_bind(tmp_path: Path) -> None:
    db = tmp_path / "unbound.duckdb"
    registry = CollectorRegistry()
    clock = Clock(T)
    with writer_on(db, clock, max_spans=100, registry=registry) as writer:
        for step, pair in enumerate([("a1", "a2"), ("b1", "b2"), ("c1", "c2")]):
            clock.now = T + 10 * step
            write(writer, spans(*pair))
        assert gauge(writer, registry) == 20.0
        assert write(writer, spans("a1", "c2")) == WriteResult(inserted=0, duplicates=2)
        # Past the window by age, the gauge shows the window (the oldest chunk left is one window old).
        clock.now = T + 20 + WINDOW
        write(writer, spans("d1"))
        assert gauge(writer, registry) == WINDOW
    assert set(stored(db).values()) == {1}


# --- the age bound --------------------------------------------------------------------------------------


def test_a_chunk_exactly_one_window_old_stays_and_an_older_one_goes() -> None:
    recent = RecentSpans(window_seconds=60, max_spans=1000)
    recent.add([1], at=0.0)
    recent.add([2], at=60.0)  # horizon 0: the first chunk is exactly window_seconds old
    assert recent.contains([1, 2]) == [True, True]
    assert recent.covered_seconds(60.0) == 60.0
    recent.evict(60.0)
    assert recent.contains([1]) == [True]
    recent.evict(60.5)  # horizon 0.5: now older than the window
    assert recent.contains([1, 2]) == [False, True]
    assert len(recent) == 1
    assert recent.covered_seconds(60.5) == 0.5


def test_adding_later_evicts_by_age_and_an_empty_window_covers_nothing() -> None:
    recent = RecentSpans(window_seconds=60, max_spans=1000)
    assert recent.covered_seconds(100.0) == 0.0
    assert recent.oldest_ingest() is None
    recent.add([1, 2], at=0.0, since=-5.0)
    recent.add([3], at=30.0)
    assert recent.oldest_ingest() == -5.0
    recent.add([4], at=90.0)  # horizon 30: the chunk at 0 goes, the one at 30 stays
    assert recent.contains([1, 2, 3, 4]) == [False, False, True, True]
    assert recent.oldest_ingest() == 30.0
    recent.add([], at=1000.0)  # nothing to add evicts nothing
    assert len(recent) == 2
    recent.evict(1000.0)
    assert len(recent) == 0
    assert recent.covered_seconds(1000.0) == 0.0
    assert recent.oldest_ingest() is None


# --- collisions -----------------------------------------------------------------------------------------


def test_a_remembered_key_is_confirmed_against_the_table_before_a_span_is_dropped(tmp_path: Path) -> None:
    db = tmp_path / "collision.duckdb"
    with writer_on(db, Clock(T)) as writer:
        assert write(writer, spans("stored")) == WriteResult(inserted=1, duplicates=0)
        # A 64-bit hash can collide: pretend a never-stored span's key is remembered (as a colliding key
        # would be). Added on the writer's thread, like every change to the window.
        writer.submit(lambda _con: writer._recent.add(keys("new"), at=T)).result(timeout=TIMEOUT)
        assert writer.submit(lambda _con: writer._recent.contains(keys("new"))).result(timeout=TIMEOUT) == [True]
        # The table has no such span, so it is stored; the real retry beside it is still dropped.
        assert write(writer, spans("new", "stored")) == WriteResult(inserted=1, duplicates=1)
    assert stored(db) == {"span-stored": 1, "span-new": 1}


@pytest.mark.parametrize("same_trace", [True, False])
def test_the_confirming_lookup_matches_trace_and_span_id_together(tmp_path: Path, same_trace: bool) -> None:
    db = tmp_path / "pair.duckdb"
    original = spans("x")
    # The same trace with another span_id, or the same span_id under another trace, is a different span.
    column, value = ("span_id", "span-other") if same_trace else ("trace_id", "trace-other")
    other = original.set_column(original.schema.get_field_index(column), column, pa.array([value]))
    with writer_on(db, Clock(T)) as writer:
        write(writer, original)
        writer.submit(lambda _con: writer._recent.add(span_keys(other).to_list(), at=T)).result(timeout=TIMEOUT)
        assert write(writer, other) == WriteResult(inserted=1, duplicates=0)
        assert write(writer, original) == WriteResult(inserted=0, duplicates=1)
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchall() == [(2, 2)]
    finally:
        con.close()


# --- one group commit, several requests -----------------------------------------------------------------


def test_one_group_commit_answers_each_request_with_its_own_inserted_and_duplicate_counts(tmp_path: Path) -> None:
    db = tmp_path / "group.duckdb"
    with writer_on(db, Clock(1_000.0)) as writer:
        assert write(writer, spans("a", "b")) == WriteResult(inserted=2, duplicates=0)
        answers = committed_together(writer, spans("c", "d", "e"), spans("a", "f"), spans("b", "g", "h", "i"))
    assert answers == [
        WriteResult(inserted=3, duplicates=0),
        WriteResult(inserted=1, duplicates=1),
        WriteResult(inserted=3, duplicates=1),
    ]
    assert stored(db) == {f"span-{i}": 1 for i in "abcdefghi"}


def test_a_span_sent_twice_in_one_request_is_stored_once(tmp_path: Path) -> None:
    db = tmp_path / "repeat.duckdb"
    with writer_on(db, Clock(1_000.0)) as writer:
        assert write(writer, spans("a", "b", "a")) == WriteResult(inserted=2, duplicates=1)
    assert stored(db) == {"span-a": 1, "span-b": 1}


def test_a_retry_queued_beside_its_original_in_one_group_commit_is_stored_once(tmp_path: Path) -> None:
    db = tmp_path / "beside.duckdb"
    with writer_on(db, Clock(1_000.0)) as writer:
        answers = committed_together(writer, spans("a", "b"), spans("c"), spans("b", "a", "d"))
    assert answers == [
        WriteResult(inserted=2, duplicates=0),
        WriteResult(inserted=1, duplicates=0),
        WriteResult(inserted=1, duplicates=2),
    ]
    assert stored(db) == {"span-a": 1, "span-b": 1, "span-c": 1, "span-d": 1}


def test_two_batches_sharing_a_key_but_not_a_span_both_keep_it() -> None:
    # Each batch's keys are computed when it is queued; a key in two batches of one group is a retry or a
    # collision, and only the spans' ids tell which. Colliding keys are forced here, the ids are real.
    first, second = spans("a", "b"), spans("c")
    combined = pa.concat_tables([first, second])
    collide = [Identities([1, 2], [True, True]), Identities([1], [True])]
    assert first_in_group(collide, combined) == [True, True, True]
    same = pa.concat_tables([first, spans("a")])
    assert first_in_group(collide, same) == [True, True, False]
    # Without a shared key, each batch's own firsts stand.
    assert first_in_group([Identities([1, 1], [True, False]), Identities([3], [True])], combined) == [True, False, True]


def test_a_batchs_identities_are_the_keys_the_window_is_rebuilt_with() -> None:
    batch = spans("a", "b", "a")
    assert Identities.of(batch) == Identities(span_keys(batch).to_list(), first_occurrences(batch).to_list())
    assert Identities.of(batch).first == [True, True, False]


def test_a_failing_writer_job_is_rolled_back_answers_with_its_error_and_the_writer_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "job.duckdb"

    def insert_then_fail(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("DELETE FROM span_rows")
        raise ValueError("the job failed half-way")

    with writer_on(db, Clock(1_000.0)) as writer:
        write(writer, spans("a"))
        with pytest.raises(ValueError, match="half-way"):
            writer.submit(insert_then_fail).result(timeout=TIMEOUT)
        assert write(writer, spans("b")) == WriteResult(inserted=1, duplicates=0)
    assert stored(db) == {"span-a": 1, "span-b": 1}


# --- closing, and the ingest time ------------------------------------------------------------------------


def test_close_with_a_timeout_returns_while_the_writer_is_busy_and_what_was_queued_still_commits(
    tmp_path: Path,
) -> None:
    db = tmp_path / "close.duckdb"
    with writer_on(db, Clock(T)) as writer:
        with WriterHold(writer) as hold:
            queued = writer.try_submit(spans("a"))
            assert queued is not None
            closer = threading.Thread(target=writer.close, kwargs={"timeout": 0.05})
            closer.start()
            join(closer, "close(timeout=0.05) to return while the writer is still held")
            assert hold.held, "the writer hold ended before close could be tried"
            assert not queued.done()
            assert writer.try_submit(spans("b")) is None  # closing: no new work
        # Closing stopped intake, not the writer: what was queued before it is still committed.
        assert queued.result(timeout=TIMEOUT) == WriteResult(inserted=1, duplicates=0)
    assert stored(db) == {"span-a": 1}


@contextmanager
def local_time_zone(tz: str) -> Iterator[None]:
    """The process's local time zone (TZ) set to `tz` for the block, then restored."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = tz
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


def test_ingested_at_is_utc_when_the_machines_time_zone_is_not(tmp_path: Path) -> None:
    db = tmp_path / "tz.duckdb"
    # A POSIX rule, so no tz database is needed: five and a half hours east of UTC.
    with local_time_zone("TWX-5:30"):
        assert datetime.fromtimestamp(T) == datetime(2026, 11, 18, 16, 36, 40)  # local time, for contrast
        with writer_on(db, Clock(T)) as writer:
            write(writer, spans("a"))
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT ingested_at FROM spans").fetchall() == [(datetime(2026, 11, 18, 11, 6, 40),)]
    finally:
        con.close()


def scores(*ids: str) -> pa.Table:
    observed = datetime(2026, 11, 18, 12, 0, 2)
    rows = [
        {"trace_id": f"trace-{i}", "span_id": f"span-{i}", "name": "groundedness", "score": 0.5, "source": "event",
         "observed_at": observed}
        for i in ids
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=SCORE_BATCH_SCHEMA)


def test_the_scores_counter_counts_each_score_stored_once_and_nothing_for_a_commit_without_scores(
    tmp_path: Path,
) -> None:
    registry = CollectorRegistry()
    with writer_on(tmp_path / "scores.duckdb", Clock(1_000.0), registry=registry) as writer:
        write(writer, spans("a"))  # counted before the answer: nothing to wait for
        assert registry.get_sample_value("tailwatch_scores_stored_total") == 0
        for _ in range(2):  # the retry's scores are already stored
            future = writer.try_submit(spans("b", "c"), scores("b", "c"))
            assert future is not None
            future.result(timeout=TIMEOUT)
        assert registry.get_sample_value("tailwatch_scores_stored_total") == 2


# --- scores: a window of their own ------------------------------------------------------------------------


def write_scores(writer: Writer, table: pa.Table) -> int:
    """How many of `table`'s scores the writer stored: a batch of scores alone, as OTLP logs bring them."""
    before = stored_scores(writer)
    future = writer.try_submit(None, table)
    assert future is not None
    future.result(timeout=TIMEOUT)
    return stored_scores(writer) - before


def stored_scores(writer: Writer) -> int:
    count: int = writer.submit(lambda con: con.execute("SELECT count(*) FROM span_scores").fetchone()[0]).result(
        timeout=TIMEOUT
    )
    return count


def scores_at(observed_ns: int, *ids: str) -> pa.Table:
    """Scores observed at a nanosecond that is not a whole microsecond: storage rounds it."""
    table = scores(*ids)
    at = pa.array([observed_ns] * len(ids), pa.int64()).cast(pa.timestamp("ns"))
    return table.set_column(table.schema.get_field_index("observed_at"), "observed_at", at)


def test_a_retried_score_batch_without_spans_is_stored_once_and_a_new_time_is_a_new_score(tmp_path: Path) -> None:
    clock = Clock(T)
    with writer_on(tmp_path / "scores.duckdb", clock) as writer:
        assert write_scores(writer, scores("a", "b")) == 2
        clock.now = T + WINDOW  # the window's far edge: still remembered
        assert write_scores(writer, scores("a", "b")) == 0
        assert write_scores(writer, scores_at(1_795_000_000_000_000_000, "a")) == 1  # same span, another time


def test_a_score_retried_after_a_restart_is_stored_once_its_time_rounded_as_storage_rounds_it(tmp_path: Path) -> None:
    db = tmp_path / "scores-restart.duckdb"
    # 1,500 ns past a microsecond: a key that truncated where storage rounds would not match after the restart.
    sent = scores_at(1_795_000_000_000_001_500, "a", "b")
    with writer_on(db, Clock(T)) as writer:
        assert write_scores(writer, sent) == 2
    with writer_on(db, Clock(T + WINDOW + 3600)) as writer:
        # The window is rebuilt from span_scores: no span stands for these scores in the spans' window.
        assert writer._recent_scores.contains(score_keys(sent)) == [True, True]
        assert write_scores(writer, sent) == 0


def test_the_scores_window_is_bounded_by_max_spans_and_an_evicted_score_is_still_recognised(tmp_path: Path) -> None:
    """Past the count bound a key is forgotten; the score is then inserted without the look-up of stored
    ones, so the comparison is kept only where a key says a duplicate is possible."""
    clock = Clock(T)
    with writer_on(tmp_path / "bound.duckdb", clock, max_spans=2) as writer:
        write_scores(writer, scores("a", "b"))
        clock.now = T + 1
        write_scores(writer, scores("c", "d"))
        assert writer._recent_scores.contains(score_keys(scores("a", "c"))) == [False, True]
        # A batch holding a remembered key is compared with the stored scores since the window's oldest commit.
        assert write_scores(writer, scores("c", "e")) == 1
        assert write_scores(writer, scores("a")) == 1  # forgotten: stored again, as spans beyond the bound are


@pytest.mark.parametrize(("column", "other"), [("source", "attribute"), ("name", "relevance"), ("span_id", "span-z")])
def test_a_retried_score_is_told_from_one_differing_only_in_source_name_or_span(
    tmp_path: Path, column: str, other: str
) -> None:
    with writer_on(tmp_path / "identity.duckdb", Clock(T)) as writer:
        write_scores(writer, scores("a"))
        differing = scores("a")
        differing = differing.set_column(differing.schema.get_field_index(column), column, pa.array([other]))
        # The retry makes the batch a suspect, so the stored scores are compared column by column.
        assert write_scores(writer, pa.concat_tables([scores("a"), differing])) == 1
