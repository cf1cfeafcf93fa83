"""Retention deletes by event time: a span goes once it ENDED before the cutoff, not when it started or arrived."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import duckdb

from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.retention import delete_expired
from storage.duckdb.writer import Writer

CUTOFF = datetime(2026, 11, 16, 5, 0, 0)
US = timedelta(microseconds=1)


def store(
    con: duckdb.DuckDBPyConnection, span_id: str, start: datetime, end: datetime, ingested: datetime | None = None
) -> None:
    con.execute(
        """INSERT INTO span_rows (trace_id, span_id, name, kind, start_time, end_time, duration_ms, status_code,
                              ingested_at)
           VALUES ('t', ?, 'op', 'SERVER', ?, ?, ?, 'UNSET', ?)""",
        [span_id, start, end, (end - start) / timedelta(milliseconds=1), ingested or end],
    )


def remaining(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT span_id FROM spans").fetchall()}


def test_a_span_that_started_before_the_cutoff_but_ended_after_it_is_kept(con: duckdb.DuckDBPyConnection) -> None:
    store(con, "straddles", CUTOFF - timedelta(hours=3), CUTOFF + timedelta(seconds=1))
    store(con, "straddles-by-a-microsecond", CUTOFF - timedelta(minutes=10), CUTOFF + US)
    store(con, "old", CUTOFF - timedelta(days=2), CUTOFF - timedelta(days=2) + timedelta(seconds=2))
    assert delete_expired(con, CUTOFF) == 1
    assert remaining(con) == {"straddles", "straddles-by-a-microsecond"}


def test_the_cutoff_itself_is_kept_and_a_microsecond_before_it_is_deleted(con: duckdb.DuckDBPyConnection) -> None:
    store(con, "ends-at-cutoff", CUTOFF - timedelta(seconds=2), CUTOFF)
    store(con, "ends-just-before", CUTOFF - timedelta(seconds=2), CUTOFF - US)
    store(con, "instant-at-cutoff", CUTOFF, CUTOFF)
    store(con, "instant-just-before", CUTOFF - US, CUTOFF - US)
    assert delete_expired(con, CUTOFF) == 2
    assert remaining(con) == {"ends-at-cutoff", "instant-at-cutoff"}
    # A second pass finds nothing more to delete.
    assert delete_expired(con, CUTOFF) == 0
    assert remaining(con) == {"ends-at-cutoff", "instant-at-cutoff"}


def test_the_count_returned_is_exactly_the_rows_deleted(con: duckdb.DuckDBPyConnection) -> None:
    for i in range(7):
        store(con, f"old-{i}", CUTOFF - timedelta(hours=i + 1), CUTOFF - timedelta(hours=i + 1) + timedelta(minutes=1))
    for i in range(4):
        store(con, f"new-{i}", CUTOFF - timedelta(seconds=30), CUTOFF + timedelta(minutes=i))
    assert delete_expired(con, CUTOFF) == 7
    assert con.execute("SELECT count(*) FROM spans").fetchall() == [(4,)]
    assert delete_expired(con, datetime(2000, 1, 1)) == 0
    assert delete_expired(con, CUTOFF + timedelta(days=1)) == 4
    assert remaining(con) == set()


def test_arrival_time_does_not_matter_only_the_end_time(con: duckdb.DuckDBPyConnection) -> None:
    # A backfill of old spans that arrived just now is removed; a span that arrived long ago but ends
    # after the cutoff (a clock-skewed sender) is kept.
    store(
        con,
        "old-backfill",
        CUTOFF - timedelta(days=1),
        CUTOFF - timedelta(hours=23),
        ingested=CUTOFF + timedelta(days=7),
    )
    store(con, "late-ending", CUTOFF, CUTOFF + timedelta(hours=1), ingested=CUTOFF - timedelta(days=30))
    assert delete_expired(con, CUTOFF) == 1
    assert remaining(con) == {"late-ending"}


def test_retention_through_the_writer_commits_the_deletion(tmp_path: Path) -> None:
    db = tmp_path / "through-writer.duckdb"
    con = open_database(db)
    migrate.upgrade(con)
    store(con, "straddles", CUTOFF - timedelta(hours=1), CUTOFF + US)
    store(con, "at-cutoff", CUTOFF - timedelta(hours=1), CUTOFF)
    store(con, "expired", CUTOFF - timedelta(hours=1), CUTOFF - US)
    writer = Writer(con, max_queued_spans=100, dedup_window_seconds=300, dedup_max_spans=100)
    writer.start()
    try:
        assert writer.submit(lambda c: delete_expired(c, CUTOFF)).result(timeout=30) == 1
    finally:
        writer.close(timeout=30)
    con.close()
    # Reopened from the file: the deletion was committed, and only it.
    reopened = duckdb.connect(str(db), read_only=True)
    try:
        assert remaining(reopened) == {"straddles", "at-cutoff"}
    finally:
        reopened.close()


def test_slo_minutes_outlive_the_spans_by_the_longest_slo_window_and_no_more(con: duckdb.DuckDBPyConnection) -> None:
    for minute in (CUTOFF - timedelta(days=91), CUTOFF - timedelta(days=89), CUTOFF + timedelta(days=1)):
        con.execute(
            "INSERT INTO slo_burn_minutes VALUES (?, ?, ?, 'ttft-2s', 'acme', NULL, NULL, ?, 9, 10, true)",
            [minute, minute, minute, minute],
        )
    delete_expired(con, CUTOFF)
    kept = [r[0] for r in con.execute("SELECT minute FROM slo_burn_minutes ORDER BY minute").fetchall()]
    assert kept == [CUTOFF - timedelta(days=89), CUTOFF + timedelta(days=1)]
