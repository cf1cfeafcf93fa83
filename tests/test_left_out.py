"""What a summary leaves out for a detector's breaches (storage/left_out.py): breached windows merged into
ranges per group, the newest kept, and the predicate's half-open ranges and NULL matching on a real DuckDB."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pyarrow as pa

from storage.left_out import predicate, resolved
from storage.ports import MAX_LEFT_OUT, Aggregate, Breached, LeftOut, Measure, RequestSummary, Window

T0 = datetime(2026, 11, 20, 12, 0)
LEAVE_OUT = Breached("token_latency", keys=("model",), optional=("tenant_id",))


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


def summary() -> RequestSummary:
    return RequestSummary(Window(T0, at(60)), (("model",),), (Measure("n", Aggregate.COUNT),), leave_out=LEAVE_OUT)


def breached(*rows: tuple[float, float, str, str | None]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"window_start": at(s), "window_end": at(e), "model": m, "tenant_id": t} for s, e, m, t in rows]
    )


def test_a_groups_contiguous_and_overlapping_windows_are_one_range_and_other_groups_their_own() -> None:
    # (2, 4) lies inside (0, 5): the range goes on to 5, not back to 4.
    rows = breached((10, 15, "llama", None), (0, 5, "llama", None), (2, 4, "llama", None), (5, 10, "llama", None),
                    (12, 20, "llama", None),
                    (30, 35, "llama", None), (5, 10, "llama", "acme"), (5, 10, "qwen", None))  # fmt: skip
    got = resolved(summary(), rows).leave_out
    assert got is not None and got.ranges is not None
    assert set(got.ranges) == {
        LeftOut(at(0), at(20), (("model", "llama"), ("tenant_id", None))),
        LeftOut(at(30), at(35), (("model", "llama"), ("tenant_id", None))),
        LeftOut(at(5), at(10), (("model", "llama"), ("tenant_id", "acme"))),
        LeftOut(at(5), at(10), (("model", "qwen"), ("tenant_id", None))),
    }
    assert len(got.ranges) == 4


def test_past_the_bound_the_newest_ranges_are_left_out() -> None:
    rows = breached(*((2 * i, 2 * i + 1, "llama", None) for i in range(MAX_LEFT_OUT + 5)))
    got = resolved(summary(), rows).leave_out
    assert got is not None and got.ranges is not None
    assert len(got.ranges) == MAX_LEFT_OUT
    assert min(r.start for r in got.ranges) == at(10)
    assert max(r.end for r in got.ranges) == at(2 * (MAX_LEFT_OUT + 4) + 1)


def kept(ranges: tuple[LeftOut, ...], rows: list[tuple[datetime, str | None, str | None]]) -> list[int]:
    """Which of `rows` (end_time, model, tenant_id) the predicate keeps, on DuckDB."""
    params: list[object] = []

    def param(value: object) -> str:
        params.append(value)
        return "?"

    where = predicate(Breached("token_latency", ("model",), ("tenant_id",), ranges), param)
    con = duckdb.connect()
    con.execute("CREATE TABLE r (i INTEGER, end_time TIMESTAMP, model VARCHAR, tenant_id VARCHAR)")
    con.executemany("INSERT INTO r VALUES (?, ?, ?, ?)", [(i, *row) for i, row in enumerate(rows)])
    return [i for (i,) in con.execute(f"SELECT i FROM r WHERE {where} ORDER BY i", params).fetchall()]


def test_a_range_is_half_open_like_a_window() -> None:
    ranges = (LeftOut(at(5), at(10), (("model", "llama"), ("tenant_id", None))),)
    rows = [(at(5) - timedelta(microseconds=1), "llama", "a"), (at(5), "llama", "a"),
            (at(10) - timedelta(microseconds=1), "llama", "a"), (at(10), "llama", "a")]  # fmt: skip
    assert kept(ranges, rows) == [0, 3]


def test_null_in_an_optional_column_covers_every_value_and_a_key_matches_null_only_with_null() -> None:
    ranges = (
        LeftOut(at(0), at(10), (("model", None), ("tenant_id", "acme"))),  # requests without a model, acme's
        LeftOut(at(20), at(30), (("model", "qwen"), ("tenant_id", None))),  # all of qwen's
    )
    rows = [(at(1), None, "acme"), (at(1), "llama", "acme"), (at(1), None, "globex"),
            (at(21), "qwen", "acme"), (at(21), "qwen", None), (at(21), "llama", None)]  # fmt: skip
    assert kept(ranges, rows) == [1, 2, 5]


def test_nothing_breached_leaves_nothing_out() -> None:
    assert predicate(Breached("token_latency", ("model",), ranges=()), lambda v: "?") == ""
