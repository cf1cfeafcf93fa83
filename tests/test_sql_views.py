"""The curated analyst views compute exactly the figures docs/sql.md describes, over a hand-built database.

Every figure below is worked out by hand from the rows inserted here. quantile_cont interpolates
linearly: the p99 of [a, b] is a + 0.99 (b - a), of [a, b, c] is b + 0.98 (c - b), and of
[a, b, c, d] is c + 0.97 (d - c).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

import duckdb
import pytest

from storage.duckdb import migrate
from storage.duckdb.database import open_database

H12 = datetime(2026, 11, 20, 12, 0)
H13 = datetime(2026, 11, 20, 13, 0)
H14 = datetime(2026, 11, 20, 14, 0)


def at(hh: int, mm: int, ss: int = 0, us: int = 0) -> datetime:
    return datetime(2026, 11, 20, hh, mm, ss, us)


SPAN_DEFAULTS: dict[str, Any] = {
    "name": "llm_request",
    "kind": "SERVER",
    "status_code": "OK",
    "is_llm": True,
    "llm_role": "server",
    "deployment": "d1",
    "model": "m1",
}

# The requests (one span each, except R2: a client span around a server span, one request under the
# client's id with the client's tenant and the server's figures).
SPANS: list[dict[str, Any]] = [
    # R1
    {"trace_id": "t1", "span_id": "s1", "start_time": at(12, 0, 58, 250_000), "end_time": at(12, 1),
     "tenant_id": "a", "replica_id": "r1", "e2e_ms": 100.0, "ttft_ms": 10.0, "tpot_ms": 10.0,
     "cache_hit_ratio": 0.9, "replica_count": 2},
    # Not an LLM span: in no view, whatever its figures.
    {"trace_id": "t1", "span_id": "n1", "start_time": at(12, 1), "end_time": at(12, 1, 30), "is_llm": False,
     "llm_role": None, "tenant_id": "a", "replica_id": "r1", "e2e_ms": 10_000.0, "ttft_ms": 9_000.0,
     "tpot_ms": 900.0, "cache_hit_ratio": 0.1, "replica_count": 2},
    # R2: the client (tenant a) and the server that answered it (no tenant; the figures).
    {"trace_id": "t2", "span_id": "c2", "kind": "CLIENT", "llm_role": "client", "status_code": "UNSET",
     "start_time": at(12, 1, 57), "end_time": at(12, 2, 0, 500_000), "tenant_id": "a", "deployment": None,
     "e2e_ms": 3_500.0, "ttft_ms": 999.0},
    {"trace_id": "t2", "span_id": "s2", "start_time": at(12, 1, 58, 100_000), "end_time": at(12, 2),
     "tenant_id": None, "replica_id": "r1", "e2e_ms": 200.0, "ttft_ms": 20.0, "tpot_ms": 20.0,
     "cache_hit_ratio": 0.85, "replica_count": 2},
    # R3
    {"trace_id": "t3", "span_id": "s3", "start_time": at(12, 2, 59), "end_time": at(12, 3), "status_code": "ERROR",
     "tenant_id": "b", "model": "m2", "replica_id": "r2", "e2e_ms": 300.0, "ttft_ms": 50.0, "tpot_ms": None,
     "cache_hit_ratio": 0.5, "replica_count": None},
    # R4
    {"trace_id": "t4", "span_id": "s4", "start_time": at(12, 6, 58), "end_time": at(12, 7), "tenant_id": "b",
     "replica_id": "r2", "e2e_ms": 400.0, "ttft_ms": 40.0, "tpot_ms": 30.0, "cache_hit_ratio": 0.86,
     "replica_count": 2},
    # R5
    {"trace_id": "t5", "span_id": "s5", "start_time": at(13, 9, 58), "end_time": at(13, 10), "tenant_id": "a",
     "replica_id": "r1", "e2e_ms": 500.0, "ttft_ms": 60.0, "tpot_ms": 40.0, "cache_hit_ratio": None,
     "replica_count": 2},
    # R6: a window whose every latency is 0, so the tenant ratio divides by 0.
    {"trace_id": "t6", "span_id": "s6", "start_time": at(14, 2), "end_time": at(14, 2), "tenant_id": "c",
     "replica_id": "r3", "e2e_ms": 0.0, "ttft_ms": 0.0, "tpot_ms": None, "cache_hit_ratio": None,
     "replica_count": 2},
]  # fmt: skip

SCORES = [
    ("t1", "s1", "json_adherence", 0.8),
    ("t1", "s1", "relevance", 0.5),
    ("t2", "c2", "json_adherence", 0.4),  # the client span of R2 is the one judged
    ("t3", "s3", "json_adherence", None),  # a label-only score: no mean
    ("t4", "s4", "json_adherence", 1.0),
]

LABELS = [
    # window_start, window_end, deployment, arrival_second, replica_count, pattern
    (at(12, 0), at(12, 5), "d1", at(12, 0, 58), 2, "burst"),  # R1
    (at(12, 0), at(12, 5), "d1", at(12, 1, 58), 2, "steady"),  # R2 (the server span's start)
    (at(12, 0), at(12, 5), "d1", at(12, 2, 59), None, "burst"),  # R3: NULL replica_count matches NULL
    (at(12, 5), at(12, 10), "d1", at(12, 6, 58), 3, "burst"),  # R4's second, another replica_count
    (at(12, 0), at(12, 5), "d1", at(12, 6, 58), 2, "steady"),  # R4's second, a window R4 did not end in
    (at(13, 5), at(13, 10), "d1", at(13, 9, 58), 2, "idle"),  # R5 ended at window_end: not in it
    (at(12, 0), at(12, 5), "d2", at(12, 0, 58), 2, "idle"),  # R1's second, another deployment
]


def insert_span(con: duckdb.DuckDBPyConnection, row: dict[str, Any]) -> None:
    values = {**SPAN_DEFAULTS, **row}
    values["duration_ms"] = (values["end_time"] - values["start_time"]).total_seconds() * 1000
    values["ingested_at"] = values["end_time"]
    columns = ", ".join(values)
    con.execute(f"INSERT INTO span_rows ({columns}) VALUES ({', '.join('?' * len(values))})", list(values.values()))


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = open_database(tmp_path_factory.mktemp("views") / "views.duckdb")
    migrate.upgrade(connection)
    for row in SPANS:
        insert_span(connection, row)
    for trace_id, span_id, name, score in SCORES:
        connection.execute(
            """INSERT INTO span_scores (trace_id, span_id, name, score, label, source, observed_at, ingested_at)
               VALUES (?, ?, ?, ?, 'x', 'evaluator', TIMESTAMP '2026-11-20 15:00', TIMESTAMP '2026-11-20 15:00')""",
            [trace_id, span_id, name, score],
        )
    for window_start, window_end, deployment, arrival, replica_count, pattern in LABELS:
        connection.execute(
            """INSERT INTO traffic_pattern_labels VALUES (?, ?, TIMESTAMP '2026-11-20 15:00', ?, ?, ?, 1, ?, ?)""",
            [window_start, window_end, deployment, arrival, replica_count, pattern, f"signal-{pattern}"],
        )
    yield connection
    connection.close()


def exact(value: Any) -> Any:
    """Rounded to 9 places, so 0.99-interpolated quantiles compare with hand-computed figures."""
    if isinstance(value, float | Decimal):
        return round(float(value), 9)
    if isinstance(value, dict):
        return {k: exact(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return tuple(exact(v) for v in value)
    return value


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    return [exact(r) for r in con.cursor().execute(sql).fetchall()]


def expect(*expected: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return [exact(r) for r in expected]


def test_the_hand_built_requests_are_six_with_r2_counted_once(con: duckdb.DuckDBPyConnection) -> None:
    assert rows(con, "SELECT trace_id, span_id, tenant_id, e2e_ms, end_time FROM llm_requests ORDER BY 1") == expect(
        ("t1", "s1", "a", 100.0, at(12, 1)),
        ("t2", "c2", "a", 200.0, at(12, 2)),
        ("t3", "s3", "b", 300.0, at(12, 3)),
        ("t4", "s4", "b", 400.0, at(12, 7)),
        ("t5", "s5", "a", 500.0, at(13, 10)),
        ("t6", "s6", "c", 0.0, at(14, 2)),
    )


# --- token_latency_5m -----------------------------------------------------------------------------------

TOKEN_LATENCY = """
    SELECT window_start, window_end, model, deployment, requests, tpot_n, tpot_p50_ms, tpot_p99_ms, e2e_p99_ms
    FROM {source} ORDER BY window_start, model"""


def test_token_latency_5m(con: duckdb.DuckDBPyConnection) -> None:
    assert rows(con, TOKEN_LATENCY.format(source="token_latency_5m")) == expect(
        # R1 and R2: tpot 10 and 20, e2e 100 and 200.
        (at(12, 0), at(12, 5), "m1", "d1", 2, 2, 15.0, 19.9, 199.0),
        # R3 has no tpot: counted as a request, not in the tpot figures.
        (at(12, 0), at(12, 5), "m2", "d1", 1, 0, None, None, 300.0),
        (at(12, 5), at(12, 10), "m1", "d1", 1, 1, 30.0, 30.0, 400.0),
        (at(13, 10), at(13, 15), "m1", "d1", 1, 1, 40.0, 40.0, 500.0),
        (at(14, 0), at(14, 5), "m1", "d1", 1, 0, None, None, 0.0),
    )


# --- cache_curve_hourly ---------------------------------------------------------------------------------

CACHE_CURVE = """
    SELECT window_start, window_end, bucket, requests, e2e_p50_ms, e2e_p99_ms, tpot_p99_ms, score_means
    FROM {source} ORDER BY window_start, bucket"""


def test_cache_curve_hourly(con: duckdb.DuckDBPyConnection) -> None:
    # high > 0.85 (R1 0.9, R4 0.86), medium 0.55..0.85 (R2 exactly 0.85), low below (R3 0.5); R5 and R6
    # have no cache_hit_ratio and are in no bucket.
    assert rows(con, CACHE_CURVE.format(source="cache_curve_hourly")) == expect(
        (H12, H13, "high", 2, 250.0, 397.0, 29.8, {"json_adherence": 0.9, "relevance": 0.5}),
        (H12, H13, "low", 1, 300.0, 300.0, None, None),
        (H12, H13, "medium", 1, 200.0, 200.0, 20.0, {"json_adherence": 0.4}),
    )


# --- tenant_latency_5m ----------------------------------------------------------------------------------

TENANT_LATENCY = """
    SELECT window_start, window_end, tenant_id, requests, e2e_p99_ms, ttft_p99_ms, aggregate_requests,
           aggregate_e2e_p99_ms, aggregate_ttft_p99_ms, e2e_p99_ratio
    FROM {source} ORDER BY window_start, tenant_id"""


def test_tenant_latency_5m_compares_each_tenant_with_everyone(con: duckdb.DuckDBPyConnection) -> None:
    # 12:00-12:05: tenant a is R1 and R2 (e2e 100, 200; ttft 10, 20), tenant b is R3 (300; 50);
    # everyone's e2e p99 of [100, 200, 300] is 298, ttft p99 of [10, 20, 50] is 49.4.
    assert rows(con, TENANT_LATENCY.format(source="tenant_latency_5m")) == expect(
        (at(12, 0), at(12, 5), "a", 2, 199.0, 19.9, 3, 298.0, 49.4, 199 / 298),
        (at(12, 0), at(12, 5), "b", 1, 300.0, 50.0, 3, 298.0, 49.4, 300 / 298),
        (at(12, 5), at(12, 10), "b", 1, 400.0, 40.0, 1, 400.0, 40.0, 1.0),
        (at(13, 10), at(13, 15), "a", 1, 500.0, 60.0, 1, 500.0, 60.0, 1.0),
        # An aggregate p99 of 0: the ratio is NULL, not a division error or infinity.
        (at(14, 0), at(14, 5), "c", 1, 0.0, 0.0, 1, 0.0, 0.0, None),
    )


def test_the_ratio_is_the_tenant_over_everyone_above_one_for_the_slow_tenant(
    con: duckdb.DuckDBPyConnection,
) -> None:
    [(fast, slow)] = con.execute(
        """SELECT max(e2e_p99_ratio) FILTER (tenant_id = 'a'), max(e2e_p99_ratio) FILTER (tenant_id = 'b')
           FROM tenant_latency_5m WHERE window_start = TIMESTAMP '2026-11-20 12:00'"""
    ).fetchall()
    assert fast < 1 < slow


# --- traffic_pattern_hourly and request_traffic_patterns ------------------------------------------------

TRAFFIC_HOURLY = """
    SELECT window_start, window_end, deployment, pattern, requests, e2e_p50_ms, e2e_p99_ms, tpot_p99_ms, score_means
    FROM {source} ORDER BY window_start, deployment, pattern"""

REQUEST_PATTERNS = """
    SELECT trace_id, span_id, window_start, window_end, pattern, signal, e2e_ms
    FROM {source} ORDER BY trace_id"""


def test_request_traffic_patterns_join_labels_by_deployment_second_and_replica_count(
    con: duckdb.DuckDBPyConnection,
) -> None:
    assert rows(con, REQUEST_PATTERNS.format(source="request_traffic_patterns")) == expect(
        ("t1", "s1", at(12, 0), at(12, 5), "burst", "signal-burst", 100.0),
        ("t2", "c2", at(12, 0), at(12, 5), "steady", "signal-steady", 200.0),
        ("t3", "s3", at(12, 0), at(12, 5), "burst", "signal-burst", 300.0),
    )


def test_traffic_pattern_hourly(con: duckdb.DuckDBPyConnection) -> None:
    assert rows(con, TRAFFIC_HOURLY.format(source="traffic_pattern_hourly")) == expect(
        # R1 and R3: e2e 100 and 300; only R1 has a tpot, and a numeric score.
        (H12, H13, "d1", "burst", 2, 200.0, 298.0, 10.0, {"json_adherence": 0.8, "relevance": 0.5}),
        (H12, H13, "d1", "steady", 1, 200.0, 200.0, 20.0, {"json_adherence": 0.4}),
    )


# --- replica_comparison_hourly --------------------------------------------------------------------------

REPLICAS = """
    SELECT window_start, window_end, replica_id, requests, error_rate, e2e_p99_ms, tpot_p99_ms, fleet_requests,
           fleet_error_rate, fleet_e2e_p99_ms, fleet_tpot_p99_ms, score_means
    FROM {source} ORDER BY window_start, replica_id"""


def test_replica_comparison_hourly(con: duckdb.DuckDBPyConnection) -> None:
    # Hour 12: R1, R2 on r1; R3 (an error, no tpot), R4 on r2. The fleet: e2e [100, 200, 300, 400] has
    # p99 397, tpot [10, 20, 30] has p99 29.8, one error in four.
    assert rows(con, REPLICAS.format(source="replica_comparison_hourly")) == expect(
        (H12, H13, "r1", 2, 0.0, 199.0, 19.9, 4, 0.25, 397.0, 29.8, {"json_adherence": 0.6, "relevance": 0.5}),
        (H12, H13, "r2", 2, 0.5, 399.0, 30.0, 4, 0.25, 397.0, 29.8, {"json_adherence": 1.0}),
        (H13, H14, "r1", 1, 0.0, 500.0, 40.0, 1, 0.0, 500.0, 40.0, None),
        (H14, datetime(2026, 11, 20, 15), "r3", 1, 0.0, 0.0, None, 1, 0.0, 0.0, None, None),
    )


# --- the _between(t0, t1) macros ------------------------------------------------------------------------

# [12:01:00.000001, 12:03:00.000001): R2 and R3 only. R1 ended a microsecond before t0; R4 after t1.
T0, T1 = "'2026-11-20 12:01:00.000001'", "'2026-11-20 12:03:00.000001'"


def between(name: str, t0: str = T0, t1: str = T1) -> str:
    return f"{name}_between({t0}, {t1})"


def test_token_latency_5m_between(con: duckdb.DuckDBPyConnection) -> None:
    assert rows(con, TOKEN_LATENCY.format(source=between("token_latency_5m"))) == expect(
        (at(12, 0), at(12, 5), "m1", "d1", 1, 1, 20.0, 20.0, 200.0),
        (at(12, 0), at(12, 5), "m2", "d1", 1, 0, None, None, 300.0),
    )


def test_cache_curve_hourly_between(con: duckdb.DuckDBPyConnection) -> None:
    assert rows(con, CACHE_CURVE.format(source=between("cache_curve_hourly"))) == expect(
        (H12, H13, "low", 1, 300.0, 300.0, None, None),
        (H12, H13, "medium", 1, 200.0, 200.0, 20.0, {"json_adherence": 0.4}),
    )


def test_tenant_latency_5m_between(con: duckdb.DuckDBPyConnection) -> None:
    # Everyone is now R2 and R3 only: e2e p99 of [200, 300] is 299, ttft p99 of [20, 50] is 49.7.
    assert rows(con, TENANT_LATENCY.format(source=between("tenant_latency_5m"))) == expect(
        (at(12, 0), at(12, 5), "a", 1, 200.0, 20.0, 2, 299.0, 49.7, 200 / 299),
        (at(12, 0), at(12, 5), "b", 1, 300.0, 50.0, 2, 299.0, 49.7, 300 / 299),
    )


def test_traffic_patterns_between(con: duckdb.DuckDBPyConnection) -> None:
    assert rows(con, REQUEST_PATTERNS.format(source=between("request_traffic_patterns"))) == expect(
        ("t2", "c2", at(12, 0), at(12, 5), "steady", "signal-steady", 200.0),
        ("t3", "s3", at(12, 0), at(12, 5), "burst", "signal-burst", 300.0),
    )
    assert rows(con, TRAFFIC_HOURLY.format(source=between("traffic_pattern_hourly"))) == expect(
        (H12, H13, "d1", "burst", 1, 300.0, 300.0, None, None),
        (H12, H13, "d1", "steady", 1, 200.0, 200.0, 20.0, {"json_adherence": 0.4}),
    )


def test_replica_comparison_hourly_between(con: duckdb.DuckDBPyConnection) -> None:
    assert rows(con, REPLICAS.format(source=between("replica_comparison_hourly"))) == expect(
        (H12, H13, "r1", 1, 0.0, 200.0, 20.0, 2, 0.5, 299.0, 20.0, {"json_adherence": 0.4}),
        (H12, H13, "r2", 1, 1.0, 300.0, None, 2, 0.5, 299.0, 20.0, None),
    )


# Requests in each view over the whole day: every request, or those with a cache bucket (R1-R4), or those
# with a traffic pattern (R1-R3).
REQUESTS_IN_VIEW = {
    "token_latency_5m": 6,
    "cache_curve_hourly": 4,
    "tenant_latency_5m": 6,
    "traffic_pattern_hourly": 3,
    "replica_comparison_hourly": 6,
}


@pytest.mark.parametrize("name", REQUESTS_IN_VIEW)
def test_every_macro_includes_t0_and_excludes_t1(con: duckdb.DuckDBPyConnection, name: str) -> None:
    # [12:01, 12:02): R1 ended exactly at t0 and is in; R2 ended exactly at t1 and is out.
    source = between(name, "'2026-11-20 12:01:00'", "'2026-11-20 12:02:00'")
    assert rows(con, f"SELECT sum(requests), min(window_start), max(window_start) FROM {source}") == [(1, H12, H12)]
    # Timestamps work as bounds as well as strings; the view is the macro over all time.
    day = between(name, "TIMESTAMP '2026-11-20 12:01'", "TIMESTAMP '2026-11-21'")
    assert rows(con, f"SELECT sum(requests) FROM {day}") == [(REQUESTS_IN_VIEW[name],)]
    assert rows(con, f"SELECT sum(requests) FROM {name}") == [(REQUESTS_IN_VIEW[name],)]
    assert rows(con, f"SELECT count(*) FROM {between(name, T1, T1)}") == [(0,)]


def test_request_patterns_macro_includes_t0_and_excludes_t1(con: duckdb.DuckDBPyConnection) -> None:
    source = between("request_traffic_patterns", "'2026-11-20 12:01:00'", "'2026-11-20 12:02:00'")
    assert rows(con, f"SELECT trace_id, span_id FROM {source}") == [("t1", "s1")]
