"""The ClickHouse backend beyond the ports' conformance suite: the service on it, the same figures as
DuckDB's from the same simulated fleet, counting once across writers and retries, the otel_traces layout
written and followed, the analyst walls, schema mismatches and refused inserts. chDB in-process."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from builders import request, span
from clickhouse_stores import chdb_dsn, open_chdb
from conftest import RunningService, service_settings
from polars.testing import assert_frame_equal
from test_disk_full import post
from test_storage_ports import REQUESTS, SCORES, WINDOW
from test_thread_names import kernel_names
from waiting import HANG_GUARD, wait_until

from collector.normalize import NormalizeConfig, build_plan
from collector.otel_traces_follower import Follower
from detectors.registry import REGISTRY
from detectors.scheduler import scheduled_pass
from model.columns import SCORE_BATCH_SCHEMA, SPAN_BATCH_SCHEMA, SPAN_COLUMNS
from simulator import simulate
from storage.clickhouse.analyst import SAFE_TABLE_FUNCTIONS
from storage.clickhouse.backend import ClickHouseStorage
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.evaluator import Evaluator
from storage.clickhouse.lease import ClickHouseLease
from storage.clickhouse.otel_source import ClickHouseOtelTraces
from storage.clickhouse.schema import (
    SchemaMismatch,
    clickhouse_type,
    create_otel_traces,
    create_otel_view,
    create_replaced,
    create_table,
    delete_rows,
    ingest_statements,
)
from storage.clickhouse.writer import ClickHouseWriter
from storage.duckdb.backend import DuckDBStorage
from storage.ports import Aggregate, Measure, QueryError, Requests, RequestSummary, Storage, Window
from tailwatch.compose import detection_pass
from tailwatch.settings import Settings


def spans() -> pa.Table:
    return pa.Table.from_pylist(REQUESTS, schema=SPAN_BATCH_SCHEMA)


def stored(store: ClickHouseStorage, sql: str) -> Any:
    return store.client.arrow(sql).column(0)[0].as_py()


def store_all(store: Storage, table: pa.Table, scores: pa.Table | None = None) -> None:
    future = store.sink.try_submit(table, scores)
    assert future is not None
    future.result(timeout=HANG_GUARD)


def open_fed(dsn: str) -> ClickHouseStorage:
    """A store whose `otel_traces` is a table receivers feed, as `otel_traces: write` made it before it was a view."""
    for statement in create_otel_traces("otel_traces", cluster=None, ttl_days=None):
        ClickHouse(dsn).command(statement)
    return ClickHouseStorage.open(dsn, otel_traces="write")


def with_attributes(table: pa.Table) -> pa.Table:
    rows = table.to_pylist()
    return pa.Table.from_pylist(
        [{**r, "attributes": f'{{"gen_ai.request.model":"m{i}"}}'} for i, r in enumerate(rows)], schema=table.schema
    )


def test_a_retried_request_is_stored_once_in_every_table_tailwatch_writes_however_it_is_grouped() -> None:
    dsn = chdb_dsn("two_writers")
    first, second = ClickHouseStorage.open(dsn), ClickHouseStorage.open(dsn)  # otel_traces: write, the default
    try:
        table = with_attributes(spans())
        store_all(first, table)
        store_all(second, table.slice(0, 100))  # a retry through another receiver, grouped differently
        store_all(first, table)  # the same request again, whole
        for table in ("spans", "spans FINAL", "otel_traces"):
            assert stored(first, f"SELECT count() FROM {table}") == len(REQUESTS), table
        per_span = first.client.rows("SELECT count() FROM otel_traces GROUP BY TraceId, SpanId HAVING count() > 1")
        assert per_span == []
        # otel_traces is a view of spans that says FINAL itself: a dashboard's session does not.
        engine = "SELECT engine FROM system.tables WHERE database = currentDatabase() AND name = 'otel_traces'"
        assert first.client.rows(engine) == [("View",)]
        unmerged = {"final": 0}
        assert int(first.client.command("SELECT count() FROM spans", settings=unmerged)) > len(REQUESTS)
        assert int(first.client.command("SELECT count() FROM otel_traces", settings=unmerged)) == len(REQUESTS)
        requests = Requests(WINDOW, ("e2e_ms",)).fetch(second.windows)
        assert requests.num_rows == len({r["trace_id"] for r in REQUESTS if WINDOW.start <= r["end_time"] < WINDOW.end})
        # The console's trace view reads a span's attributes from `spans` itself.
        trace = first.console_queries.trace(REQUESTS[7]["trace_id"])["spans"]
        shown = dict(zip(trace.column("span_id").to_pylist(), trace.column("attributes").to_pylist(), strict=True))
        assert shown[REQUESTS[7]["span_id"]] == '{"gen_ai.request.model":"m7"}'
        # Retention deletes spans, and the view follows (a DELETE of the view itself would be refused).
        assert first.retention.delete_ended_before(datetime(2100, 1, 1)) == len(REQUESTS)
        assert stored(first, "SELECT count() FROM otel_traces") == 0
    finally:
        first.close()
        second.close()


def test_follow_refuses_tailwatchs_own_view_of_spans_as_the_collectors_table() -> None:
    dsn = chdb_dsn("view_followed")
    ClickHouseStorage.open(dsn, otel_traces="write").close()
    with pytest.raises(SchemaMismatch, match="otel_traces is Tailwatch's view of spans"):
        ClickHouseStorage.open(dsn, otel_traces="follow")


def test_a_fed_otel_traces_table_from_before_gets_a_regrouped_retry_twice_and_spans_once() -> None:
    dsn = chdb_dsn("otel_write")
    first, second = open_fed(dsn), ClickHouseStorage.open(dsn, otel_traces="write")
    try:
        table = with_attributes(spans())
        store_all(first, table)
        store_all(second, table.slice(0, 100))
        store_all(first, table)
        assert stored(first, "SELECT count() FROM spans") == len(REQUESTS)
        # otel_traces is the exporter's MergeTree, deduplicated by insert token alone: the whole retry is dropped,
        # the regrouped slice (its own token) is not. docs/scale-out.md says so.
        assert stored(first, "SELECT count() FROM otel_traces") == len(REQUESTS) + 100
        first.client.command("TRUNCATE TABLE otel_traces")  # the console reads attributes from spans first
        trace = first.console_queries.trace(REQUESTS[7]["trace_id"])["spans"]
        assert '{"gen_ai.request.model":"m7"}' in trace.column("attributes").to_pylist()
        store_all(first, table.slice(100, 50))  # a group of its own: it lands in the fed table again
        assert stored(first, "SELECT count() FROM otel_traces") == 50
        first.retention.delete_ended_before(datetime(2100, 1, 1))  # the fed table is deleted from too
        assert stored(first, "SELECT count() FROM otel_traces") == 0
    finally:
        first.close()
        second.close()


def test_a_store_that_fed_otel_traces_and_is_turned_off_stops_feeding_it_and_keeps_attributes_in_spans() -> None:
    dsn = chdb_dsn("otel_off")
    older = open_fed(dsn)
    try:
        # A store from before `spans` kept the JSON columns: its view into spans did not store them.
        older.client.command(
            "ALTER TABLE spans_ingest_to_spans MODIFY QUERY SELECT trace_id, span_id, end_time FROM spans_ingest"
        )
    finally:
        older.close()
    store = ClickHouseStorage.open(dsn, otel_traces="off")
    try:
        store_all(store, with_attributes(spans()))
        assert stored(store, "SELECT count() FROM spans") == len(REQUESTS)
        assert stored(store, "SELECT count() FROM otel_traces") == 0  # no longer fed
        assert stored(store, "SELECT count() FROM spans WHERE attributes IS NULL") == 0
    finally:
        store.close()


def spans_of_traces(traces: list[str], rows: list[dict[str, Any]]) -> pa.Table:
    """`rows` spread over `traces` in turn: each table built alone, as a decoder hands one request over."""
    return pa.Table.from_pylist(
        [{**r, "trace_id": traces[i % len(traces)]} for i, r in enumerate(rows)], schema=SPAN_BATCH_SCHEMA
    )


def test_other_spans_of_the_same_traces_are_stored_and_a_whole_retry_is_stored_once() -> None:
    store = open_fed(chdb_dsn("token"))
    try:
        # Ten traces in the same order in both batches: their trace ids alone would give both one token.
        traces = [f"{t:032x}" for t in range(1, 11)]
        first, later = spans_of_traces(traces, REQUESTS[:50]), spans_of_traces(traces, REQUESTS[50:100])
        store_all(store, first)
        store_all(store, later)
        store_all(store, first)  # a retry of the whole first request
        assert stored(store, "SELECT count() FROM spans") == 100
        per_span = store.client.arrow("SELECT SpanId, count() AS n FROM otel_traces GROUP BY SpanId").to_pylist()
        assert sorted((r["SpanId"], r["n"]) for r in per_span) == [(r["span_id"], 1) for r in REQUESTS[:100]]
    finally:
        store.close()


def test_two_batches_sliced_from_one_table_are_both_stored_not_taken_for_a_retry() -> None:
    store = open_fed(chdb_dsn("slices"))
    try:
        table = spans()  # each slice shares the whole table's buffers: its token must hash its own spans alone
        store_all(store, table.slice(0, 50))
        store_all(store, table.slice(50, 50))
        assert stored(store, "SELECT count() FROM spans") == 100
        assert stored(store, "SELECT count() FROM otel_traces") == 100
    finally:
        store.close()


def test_receivers_write_the_exporter_layout_with_attributes_as_text_maps() -> None:
    store = open_chdb("layout", otel_traces="write")
    try:
        row = {**REQUESTS[0], "attributes": '{"gen_ai.request.model":"llama","gen_ai.usage.input_tokens":42}',
               "resource": '{"service.name":"gw"}', "kind": "SERVER", "status_code": "OK"}  # fmt: skip
        store_all(store, pa.Table.from_pylist([row], schema=SPAN_BATCH_SCHEMA))
        [otel] = store.client.arrow(
            "SELECT SpanKind, StatusCode, SpanAttributes, ResourceAttributes, Duration FROM otel_traces"
        ).to_pylist()
        assert otel["SpanKind"] == "Server" and otel["StatusCode"] == "Ok"
        assert dict(otel["SpanAttributes"]) == {"gen_ai.request.model": "llama", "gen_ai.usage.input_tokens": "42"}
        assert dict(otel["ResourceAttributes"]) == {"service.name": "gw"}
        assert otel["Duration"] == int((row["end_time"] - row["start_time"]) / timedelta(microseconds=1)) * 1000
    finally:
        store.close()


def written_by_a_collector(requests: list[dict[str, Any]], dsn: str) -> ClickHouse:
    """A database at `dsn` whose `otel_traces` holds `requests` as a user's Collector writes them (receivers of
    another database write the exporter's layout, and the rows are copied); returns a client of it."""
    source = open_chdb("written", otel_traces="write")
    try:
        rows = []
        for r in requests:
            attributes = {"gen_ai.request.model": r["model"], "gen_ai.usage.input_tokens": r["input_tokens"],
                          "gen_ai.usage.output_tokens": r["output_tokens"], "gen_ai.operation.name": "chat",
                          "tenant.id": r["tenant_id"]}  # fmt: skip
            rows.append({**r, "attributes": pl.Series([attributes]).struct.json_encode()[0]})
        store_all(source, pa.Table.from_pylist(rows, schema=SPAN_BATCH_SCHEMA))
        database = f"{source.client.arrow('SELECT currentDatabase() AS d').column(0)[0].as_py()}"
        admin = ClickHouse(dsn)
        for statement in create_otel_traces("otel_traces", cluster=None, ttl_days=None):  # as the exporter makes it
            admin.command(statement)
        admin.command(f"INSERT INTO otel_traces SELECT * FROM {database}.otel_traces")
        return admin
    finally:
        source.close()


def test_a_followed_otel_traces_gives_the_same_requests_as_spans_received_over_otlp(tmp_path: Path) -> None:
    follower_store = None
    try:
        follower_dsn = chdb_dsn("followed")
        written_by_a_collector(REQUESTS, follower_dsn)
        follower_store = ClickHouseStorage.open(follower_dsn, otel_traces="follow")
        plan = build_plan(NormalizeConfig())
        follower = Follower(
            ClickHouseOtelTraces(follower_store.client, "otel_traces"),
            follower_store.sink,
            plan,
            lag=timedelta(0),
            start=lambda: datetime(2000, 1, 1),
        )
        assert follower.run_once(WINDOW.end + timedelta(hours=1)) == len(REQUESTS)
        assert follower.run_once(WINDOW.end + timedelta(hours=1)) == 0  # the cursor moved past them
        columns = ("model", "tenant_id", "input_tokens", "output_tokens", "e2e_ms", "status_code")
        followed = pl.from_arrow(Requests(WINDOW, columns, ids=True).fetch(follower_store.windows))
        assert isinstance(followed, pl.DataFrame)
        assert followed.height > 0
        expected = pl.DataFrame(REQUESTS, infer_schema_length=None).filter(
            (pl.col("end_time") >= WINDOW.start) & (pl.col("end_time") < WINDOW.end)
        )
        assert_frame_equal(
            followed.select("trace_id", "model", "tenant_id", "input_tokens", "output_tokens").sort("trace_id"),
            expected.select("trace_id", "model", "tenant_id", "input_tokens", "output_tokens").sort("trace_id"),
        )
    finally:
        if follower_store is not None:
            follower_store.close()


def test_follow_mode_stores_a_long_request_written_after_shorter_ones_that_started_later() -> None:
    """A Collector writes a span when it ends: a 180-s request that started at T lands after the cursor has
    passed T + 90 s with the short ones. Followed by end time, it is stored once it has ended."""
    store = ClickHouseStorage.open(chdb_dsn("long_request"), otel_traces="follow")
    t = datetime(2026, 11, 20, 12, 0)
    insert = (
        "INSERT INTO otel_traces (Timestamp, TraceId, SpanId, SpanName, SpanKind, ServiceName, SpanAttributes, "
        "Duration, StatusCode) VALUES ({t:DateTime64(9)}, {trace:String}, {span:String}, 'chat m', "
        "'SPAN_KIND_SERVER', 'vllm', map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'm'), "
        "{ns:UInt64}, 'STATUS_CODE_OK')"
    )
    try:
        follower = Follower(
            ClickHouseOtelTraces(store.client, "otel_traces"),
            store.sink,
            build_plan(NormalizeConfig()),
            lag=timedelta(0),
            start=lambda: datetime(2000, 1, 1),
        )
        short = {"t": t + timedelta(seconds=10), "trace": "a" * 32, "span": "1" * 16, "ns": 2 * 10**9}
        store.client.command(insert, short)
        assert follower.run_once(t + timedelta(seconds=90)) == 1
        long = {"t": t, "trace": "b" * 32, "span": "2" * 16, "ns": 180 * 10**9}
        store.client.command(insert, long)  # written when it ended, at T + 180 s
        assert follower.run_once(t + timedelta(seconds=200)) == 1
        assert follower.run_once(t + timedelta(seconds=300)) == 0
        rows = store.client.arrow("SELECT span_id, duration_ms FROM spans FINAL ORDER BY span_id").to_pylist()
        assert rows == [{"span_id": "1" * 16, "duration_ms": 2000.0}, {"span_id": "2" * 16, "duration_ms": 180000.0}]
        # What Tailwatch stores in follow mode never goes back into the Collector's table.
        assert stored(store, "SELECT count() FROM otel_traces") == 2
    finally:
        store.close()


def test_a_scheduling_process_follows_the_collectors_table_under_the_lease_and_releases_it_at_shutdown(
    tmp_path: Path,
) -> None:
    # The follow job reads from its cursor to now in one-minute chunks: the rows end two minutes ago, not on
    # the fixed test day, so a run reads a quarter of an hour whatever the date.
    shift = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=2) - max(r["end_time"] for r in REQUESTS)
    recent = [{**r, "start_time": r["start_time"] + shift, "end_time": r["end_time"] + shift} for r in REQUESTS]
    dsn = chdb_dsn("follows")
    admin = written_by_a_collector(recent, dsn)
    settings = service_settings(
        tmp_path / "unused.duckdb",
        storage={"backend": "clickhouse", "clickhouse": {"dsn": dsn, "otel_traces": "follow", "follow_lag_seconds": 0}},
    )
    observer = ClickHouseLease(admin, holder="observer")
    with RunningService(settings):
        wait_until(
            lambda: int(admin.command("SELECT count() FROM spans")) == len(REQUESTS),
            "the follow job to store every row the Collector wrote",
        )
        # The job ran only once the process held the scheduler's lease.
        held = observer.current()
        assert held is not None and held[0] != "observer"
        assert not ClickHouseLease(admin, holder="successor").hold()
    # Given up at shutdown: a successor takes it at once instead of waiting out its minute.
    assert ClickHouseLease(admin, holder="successor").hold()


def test_an_existing_otel_traces_of_another_layout_is_refused_naming_the_column() -> None:
    dsn = chdb_dsn("mismatch")
    admin = ClickHouse(dsn)
    admin.command("CREATE TABLE otel_traces (Timestamp DateTime64(9), TraceId String, SpanId String) "
                  "ENGINE = MergeTree ORDER BY Timestamp")  # fmt: skip
    with pytest.raises(SchemaMismatch, match="no column ParentSpanId"):
        ClickHouseStorage.open(dsn, otel_traces="write")
    admin.command("DROP TABLE otel_traces")
    admin.command(
        "CREATE TABLE otel_traces (Timestamp DateTime64(9), TraceId UInt64) ENGINE = MergeTree ORDER BY Timestamp"
    )
    with pytest.raises(SchemaMismatch, match=r"otel_traces\.TraceId is UInt64"):
        ClickHouseStorage.open(dsn, otel_traces="follow")


def test_the_writers_queue_is_bounded_by_the_bytes_its_batches_hold_not_only_their_rows() -> None:
    batch = spans()
    size = batch.get_total_buffer_size()
    # Never started, so what it takes stays queued.
    writer = ClickHouseWriter(
        ClickHouse(chdb_dsn("queued-bytes")), max_queued_spans=10 * batch.num_rows, max_queued_bytes=size + size // 2
    )
    assert writer.try_submit(batch) is not None
    assert (writer.queued_spans, writer.queued_bytes) == (batch.num_rows, size)
    assert writer.try_submit(batch) is None  # ten times its rows would fit, not twice its bytes
    writer.close(HANG_GUARD)


def test_a_refused_insert_acknowledges_nothing_and_the_sink_recovers() -> None:
    store = open_chdb("refused")
    try:
        # What a client sees of a server that refuses: an insert that fails.
        store.client.command("RENAME TABLE spans_ingest TO spans_ingest_gone")
        future = store.sink.try_submit(spans())
        assert future is not None
        with pytest.raises(Exception):  # noqa: B017 - whatever the server says, the request is not acknowledged
            future.result(timeout=HANG_GUARD)
        assert stored(store, "SELECT count() FROM spans") == 0
        assert (store.writer.queued_spans, store.writer.queued_bytes) == (0, 0), "a failed insert frees the queue"
        store.client.command("RENAME TABLE spans_ingest_gone TO spans_ingest")
        store_all(store, spans())
        assert stored(store, "SELECT count() FROM spans") == len(REQUESTS)
        assert (store.writer.queued_spans, store.writer.queued_bytes) == (0, 0)
    finally:
        store.close()


@pytest.fixture(scope="module")
def analyst_store() -> Any:
    store = open_chdb("analyst")
    store_all(store, spans(), pa.Table.from_pylist(SCORES, schema=SCORE_BATCH_SCHEMA))
    yield store
    store.close()


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "forbidden"),
        ("SELECT * FROM spans s JOIN url('http://127.0.0.1:1/x', CSV) u ON 1", "forbidden"),
        ("SELECT count() FROM spans SETTINGS max_execution_time = 0", "forbidden"),
        ("SELECT 1 INTO OUTFILE '{out}'", "forbidden"),
        ("select 1 into  outfile '{out}' TRUNCATE", "forbidden"),
        ("SELECT 1 INTO OUTFILE '{out}' APPEND", "forbidden"),
        ("SELECT 1 INTO OUTFILE '{out}' AND STDOUT", "forbidden"),
        ("SELECT 1 INTO OUTFILE '{out}' COMPRESSION 'gzip'", "forbidden"),
        ("EXPLAIN SELECT 1 INTO OUTFILE '{out}'", "forbidden"),
        ("INSERT INTO alerts SELECT * FROM alerts", "read_only"),
        ("DROP TABLE spans", "read_only"),
        ("SELECT 1; SELECT 2", "multiple_statements"),
        ("SELECT no_such_column FROM spans", "unknown_column"),
        ("SELECT * FROM no_such_table", "unknown_table"),
        ("SELECT FROM WHERE", "syntax_error"),
        ("SELECT 1 FORMAT JSON", "syntax_error"),
        ("", "empty_query"),
    ],
)
def test_the_analyst_endpoint_refuses_what_is_not_a_bounded_read(
    analyst_store: ClickHouseStorage, sql: str, code: str, tmp_path: Path
) -> None:
    out = tmp_path / "written.csv"
    out.write_text("kept\n")
    with pytest.raises(QueryError) as refused:
        analyst_store.analyst.run(sql.format(out=out))
    assert refused.value.code == code
    assert out.read_text() == "kept\n"  # nothing written, truncated or appended


@pytest.mark.parametrize(
    ("sql", "types"),
    [
        ("SELECT count() AS n FROM spans", ["UInt64"]),
        ("WITH 2 AS two SELECT two * 3 AS six", ["UInt16"]),
        ("EXPLAIN SELECT 1", ["String"]),
        ("SHOW TABLES", ["String"]),
        ("DESCRIBE TABLE spans", ["String"] * 7),
        ("SHOW COLUMNS FROM spans", None),
        ("SHOW CREATE TABLE spans", ["String"]),
    ],
)
def test_the_analyst_endpoint_answers_every_reading_kind_with_its_types(
    analyst_store: ClickHouseStorage, sql: str, types: list[str] | None
) -> None:
    result = analyst_store.analyst.run(sql)
    assert result.table.num_rows >= 1
    assert len(result.types) == result.table.num_columns
    if types is not None:
        assert result.types == types
    if sql.startswith(("SHOW TABLES", "DESCRIBE")):
        assert "spans" in result.table.column(0).to_pylist() or "trace_id" in result.table.column(0).to_pylist()


# A call of each generator the wall lets through: they make rows, they reach nothing.
GENERATOR_CALLS = {
    "numbers": "numbers(3)", "numbers_mt": "numbers_mt(3)", "zeros": "zeros(3)", "zeros_mt": "zeros_mt(3)",
    "values": "values('x Int8', 1, 2, 3)", "generate_series": "generate_series(1, 3)",
    "generateSeries": "generateSeries(1, 3)", "null": "null('x Int8')", "primes": "primes(3)",
    "generateRandom": "generateRandom('x Int8', 1)", "view": "view(SELECT 1 AS x)",
}  # fmt: skip
# The refused functions whose arguments are not expressions: a call the parser reads, so the wall is what refuses.
SPECIAL_CALLS = {"viewIfPermitted": "viewIfPermitted(SELECT 1 ELSE null('x Int8'))"}


def test_every_table_function_of_the_engine_is_refused_but_the_generators(analyst_store: ClickHouseStorage) -> None:
    engine = {r[0] for r in analyst_store.client.rows("SELECT name FROM system.table_functions")}
    assert len(engine) > 40  # the engine's own list, not ours: file, url, s3, remote, mysql, executable, …
    for name in sorted(engine - SAFE_TABLE_FUNCTIONS):
        call = SPECIAL_CALLS.get(name, f"{name}('x')")
        for sql in (f"SELECT * FROM {call}", f"WITH t AS (SELECT * FROM {call}) SELECT * FROM t"):
            with pytest.raises(QueryError) as refused:
                analyst_store.analyst.run(sql)
            assert (refused.value.code, refused.value.message.split("()")[0]) == ("forbidden", name), sql
    for name in sorted(engine & SAFE_TABLE_FUNCTIONS):
        assert analyst_store.analyst.run(f"SELECT * FROM {GENERATOR_CALLS[name]} LIMIT 3").table.num_rows >= 0


@pytest.mark.parametrize(
    "sql",
    [
        "SYSTEM FLUSH LOGS", "SYSTEM DROP DNS CACHE", "SET max_execution_time = 0", "USE system",
        "CREATE TABLE leak (x Int8) ENGINE = Memory", "CREATE VIEW leak AS SELECT 1",
        "ALTER TABLE spans DELETE WHERE 1", "ALTER TABLE spans ADD COLUMN x Int8", "DROP TABLE spans",
        "TRUNCATE TABLE spans", "RENAME TABLE spans TO s2", "OPTIMIZE TABLE spans FINAL", "DETACH TABLE spans",
        "ATTACH TABLE spans", "INSERT INTO spans SELECT * FROM spans", "DELETE FROM spans WHERE 1",
        "KILL QUERY WHERE 1", "GRANT SELECT ON *.* TO default", "BACKUP TABLE spans TO File('leak.zip')",
        "EXCHANGE TABLES spans AND alerts",
    ],
)  # fmt: skip
def test_statements_that_change_the_server_or_its_data_are_refused_before_they_run(
    analyst_store: ClickHouseStorage, sql: str
) -> None:
    before = analyst_store.client.rows("SELECT count() FROM spans")
    with pytest.raises(QueryError) as refused:
        analyst_store.analyst.run(sql)
    assert refused.value.code in {"read_only", "forbidden"}, (sql, refused.value)
    assert analyst_store.client.rows("SELECT count() FROM spans") == before


def test_words_of_an_output_clause_in_a_string_or_a_quoted_name_are_read(analyst_store: ClickHouseStorage) -> None:
    result = analyst_store.analyst.run("SELECT 'x INTO OUTFILE y' AS `into outfile`, 1 AS \"INTO OUTFILE\"")
    assert result.table.to_pylist() == [{"into outfile": "x INTO OUTFILE y", "INTO OUTFILE": 1}]


def test_an_analyst_read_is_capped_typed_and_takes_named_parameters(analyst_store: ClickHouseStorage) -> None:
    result = analyst_store.analyst.run(
        "SELECT trace_id, e2e_ms FROM spans WHERE e2e_ms > {floor:Float64} -- file( in a comment is no call",
        {"floor": 0.0},
        max_rows=10,
    )
    assert result.table.num_rows == 10 and result.truncated
    assert result.types == ["String", "Nullable(Float64)"]
    assert analyst_store.analyst.run("SELECT count() AS n FROM spans").table.column(0)[0].as_py() == len(REQUESTS)
    with pytest.raises(QueryError, match="named parameters"):
        analyst_store.analyst.run("SELECT 1", [1])


def test_a_simulated_fleet_gives_the_same_figures_and_alerts_on_duckdb_and_clickhouse(tmp_path: Path) -> None:
    names = ["kv_eviction", "morning_burst"]
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    shape: dict[str, Any] = {"seed": 7, "end": end, "history_hours": 2.0, "history_rate": 0.1, "rate": 3.0}
    at = end + timedelta(seconds=30)
    settings = {
        # No scheduler: a scheduled pass landing mid-test on the slower backend would add a run to compare.
        "duckdb": service_settings(tmp_path / "tw.duckdb", scheduler=False),
        "clickhouse": service_settings(
            tmp_path / "unused.duckdb",
            scheduler=False,
            storage={"backend": "clickhouse", "clickhouse": {"dsn": chdb_dsn("fleet")}},
        ),
    }
    figures: dict[str, dict[str, pl.DataFrame]] = {}
    for backend, s in settings.items():
        with RunningService(s) as svc:
            simulate.run(names, endpoint=svc.grpc_target, protocol="grpc", emitter="vllm", **shape)
            svc.wait_committed()
            storage = svc.service.storage
            # Engine facts settled by each backend's own job (the scheduler runs it every 30 s).
            storage.engine_facts.settle(end - timedelta(minutes=2))
            detection = svc.service.detection
            assert detection is not None
            detection.run(at)
            analyst = storage.analyst
            figures[backend] = {}
            settled = (
                "SELECT trace_id, span_id, engine_queue_depth, engine_running_requests FROM spans WHERE engine_settled"
            )
            for key, sql in [
                *((k, f"SELECT * FROM {k}") for k in (*REGISTRY, "alerts", "clusters")),
                ("settled", settled),
            ]:
                table = analyst.run(sql, max_rows=1_000_000).table
                frame = pl.from_arrow(table)
                assert isinstance(frame, pl.DataFrame)
                drop = [c for c in ("evaluated_at", "_version", "started_at", "updated_at") if c in frame.columns]
                figures[backend][key] = frame.drop(drop)
            # What the console reads: a detector's figures over time and one whole trace.
            console = storage.console_queries
            series = console.figures("token_latency", end - timedelta(hours=3), at, limit=1000, columns=("window_end",
                                     "model", "tpot_p99"))  # fmt: skip
            figures[backend]["console_series"] = pl.DataFrame(series.table)
            trace_id = (
                analyst.run("SELECT min(trace_id) AS t FROM spans WHERE name = 'llm_request'", max_rows=1)
                .table.column(0)[0]
                .as_py()
            )
            trace = console.trace(trace_id)
            figures[backend]["console_trace"] = pl.DataFrame(trace["requests"])
            figures[backend]["console_engine"] = pl.DataFrame(trace["engine"])
            health = console.detector_health(at + timedelta(minutes=1))
            figures[backend]["health"] = pl.DataFrame(
                {"detector": [h.detector for h in health], "outcome": [h.last_outcome for h in health],
                 "runs": [h.runs_24h for h in health]}
            )  # fmt: skip
    assert sum(f.height for f in figures["duckdb"].values()) > 0
    assert figures["duckdb"]["alerts"].height > 0
    assert figures["duckdb"]["settled"].height > 0
    assert min(figures["duckdb"][k].height for k in ("console_series", "console_trace", "console_engine", "health")) > 0
    for key, duck in figures["duckdb"].items():
        click = figures["clickhouse"][key].select(duck.columns)
        click = click.cast(dict(duck.schema), strict=False)  # Int32 vs BIGINT and the like: the values must agree
        # Counts, labels and quantiles (order statistics) agree exactly; a mean is a float sum whose order follows
        # the storage's row order, so it agrees to the last few bits.
        assert_frame_equal(duck.sort(duck.columns), click.sort(duck.columns), check_exact=False, rel_tol=1e-12,
                           abs_tol=0)  # fmt: skip


def paired_spans(seed: int) -> pa.Table:
    """Requests as a gateway and an engine report them: client and server spans of one request, retries (one
    client, several servers), clients whose server never reported, servers without a client, and figures,
    tenants and statuses on one side or the other."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    base = WINDOW.start - timedelta(minutes=2)
    for i in range(300):
        start = base + timedelta(seconds=rng.uniform(0, 540))
        e2e = rng.uniform(100, 3000)
        trace = f"{seed:08x}{i:024x}"
        shape = rng.choice(["pair", "retry", "client_only", "server_only", "pair"])
        tenant = rng.choice(["acme", "globex", None])
        common = {"trace_id": trace, "name": "chat", "is_llm": True, "deployment": "vllm-a"}
        client = {**common, "span_id": f"c{i:015x}", "kind": "CLIENT", "llm_role": "client", "start_time": start,
                  "end_time": start + timedelta(milliseconds=e2e + 20), "duration_ms": e2e + 20,
                  "status_code": rng.choice(["OK", "UNSET", "ERROR"]), "tenant_id": tenant,
                  "ttft_ms": rng.choice([None, rng.uniform(50, 300)]), "e2e_ms": e2e + 20}  # fmt: skip
        servers = []
        for attempt in range(3 if shape == "retry" else 1):
            s_start = start + timedelta(milliseconds=5 + attempt * e2e / 3)
            servers.append({**common, "span_id": f"s{i:013x}{attempt:02x}", "kind": "SERVER", "llm_role": "server",
                            "start_time": s_start, "end_time": s_start + timedelta(milliseconds=e2e / 3),
                            "duration_ms": e2e / 3, "status_code": rng.choice(["OK", "UNSET", "ERROR"]),
                            "model": rng.choice(["llama", "qwen"]), "tenant_id": rng.choice([None, "initech"]),
                            "tpot_ms": rng.choice([None, rng.uniform(5, 40)]), "e2e_ms": e2e / 3,
                            "ttft_ms": rng.choice([None, rng.uniform(50, 300)]),
                            "cache_hit_ratio": rng.random()})  # fmt: skip
        if shape != "server_only":
            rows.append(client)
        if shape != "client_only":
            rows.extend(servers)
    return pa.Table.from_pylist(rows, schema=SPAN_BATCH_SCHEMA)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_summary_computed_in_clickhouse_equals_duckdbs_over_clients_servers_and_retries(
    tmp_path: Path, seed: int
) -> None:
    table = paired_spans(seed)
    duck, click = DuckDBStorage.open(tmp_path / "pairs.duckdb"), open_chdb(f"pairs{seed}")
    try:
        for store in (duck, click):
            store_all(store, table)
        read = RequestSummary(
            WINDOW,
            grouping_sets=(("tenant_id",), ("model", "status_code"), ()),
            measures=(
                Measure("n", Aggregate.COUNT),
                Measure("e2e_p99", Aggregate.QUANTILE, "e2e_ms", 0.99),
                Measure("ttft_p50", Aggregate.QUANTILE, "ttft_ms", 0.5),
                Measure("tpot_p90", Aggregate.QUANTILE, "tpot_ms", 0.9),
                Measure("duration_p50", Aggregate.QUANTILE, "duration_ms", 0.5),
                Measure("cache_mean", Aggregate.MEAN, "cache_hit_ratio"),
            ),
            # Columns of the pairing itself: only requests a server span reported, ending when they did.
            require=("server_span_id", "end_time") if seed == 3 else (),
        )
        frames = [pl.from_arrow(read.fetch(store.windows)) for store in (duck, click)]
        assert isinstance(frames[0], pl.DataFrame) and isinstance(frames[1], pl.DataFrame)
        expected, got = (f.sort(["grouping_set", "tenant_id", "model", "status_code"]) for f in frames)
        assert expected.height > 5
        assert_frame_equal(expected, got.select(expected.columns), check_dtypes=False, check_exact=False,
                           rel_tol=1e-12, abs_tol=0)  # fmt: skip
        exact = ["grouping_set", "tenant_id", "model", "status_code", "n", "e2e_p99", "ttft_p50", "tpot_p90",
                 "duration_p50"]  # fmt: skip
        assert_frame_equal(expected.select(exact), got.select(exact), check_dtypes=False, check_exact=True)
    finally:
        duck.close()
        click.close()


@contextmanager
def two_schedulers(label: str) -> Iterator[tuple[ClickHouseLease, ClickHouseLease, list[datetime]]]:
    """Two processes' leases of a minute on one store, and the clock both read (its one item, moved by the test)."""
    store = open_chdb(label)
    now = [datetime(2026, 11, 24, 12, 0)]
    try:
        yield (
            ClickHouseLease(store.client, seconds=60, holder="a", clock=lambda: now[0]),
            ClickHouseLease(store.client, seconds=60, holder="b", clock=lambda: now[0]),
            now,
        )
    finally:
        store.close()


def test_the_scheduler_lease_has_one_holder_and_passes_on_when_it_lapses_or_is_released() -> None:
    with two_schedulers("lease") as (first, second, now):
        assert first.hold()
        assert not second.hold()
        now[0] += timedelta(seconds=59)
        assert first.hold()  # renewed: good for another minute from here
        now[0] += timedelta(seconds=59)
        assert not second.hold()
        now[0] += timedelta(seconds=2)  # a minute without a renewal: the holder is gone
        assert second.hold()
        assert not first.hold()
        first.release()  # not its lease to give up: the holder keeps it
        assert first.current() == ("b", now[0] + timedelta(seconds=60))
        assert not first.hold()
        second.release()
        assert first.hold()


def test_of_two_schedulers_that_found_the_lease_free_only_the_first_to_write_holds_it() -> None:
    with two_schedulers("lease_race") as (a, b, now):
        for first, second in ((a, b), (b, a)):  # nobody held it yet; then it lapsed, and the other writes first
            seen = second.read()  # both read it free before either writes
            assert first.hold_from(seen)
            assert not second.hold_from(seen)  # its taking of the same generation is dropped by the server
            assert first.current() == (first.holder, now[0] + timedelta(seconds=60))
            assert first.hold() and not second.hold()
            now[0] += timedelta(seconds=61)
        first, second = a, b
        # The holder renews only with a quarter of the lease left; nearer the end it takes a new generation, so
        # a rival that (its clock ahead) found it lapsed cannot also land.
        assert first.hold()
        now[0] += timedelta(seconds=50)
        seen = first.read()
        assert seen is not None
        assert second.hold_from(replace(seen, expires_at=now[0]))  # the rival's view: lapsed
        assert not first.hold_from(seen)


def test_a_lease_table_of_an_earlier_tailwatch_gains_generations() -> None:
    store = open_chdb("lease_upgrade")
    try:
        store.client.command("DROP TABLE IF EXISTS tailwatch_lease")
        store.client.command(
            "CREATE TABLE tailwatch_lease (name String, holder String, expires_at DateTime64(6, 'UTC'), "
            "_version UInt64) ENGINE = ReplacingMergeTree(_version) ORDER BY name"
        )
        lease = ClickHouseLease(store.client, holder="a")
        assert lease.hold()
        seen = lease.read()
        assert seen is not None and seen.generation == 1
    finally:
        store.close()


def test_a_scheduler_without_the_lease_runs_no_detector() -> None:
    store = open_chdb("gate")
    try:
        holder = ClickHouseLease(store.client, holder="other")
        assert holder.hold()
        mine = ClickHouseLease(store.client, holder="me")
        detection = detection_pass(Settings(), store)
        at = lambda: WINDOW.end + timedelta(minutes=5)  # noqa: E731
        assert scheduled_pass(detection, at, gate=mine.hold) == []
        assert [r.detector for r in scheduled_pass(detection, at, gate=holder.hold)] != []
    finally:
        store.close()


def test_an_analyst_stream_reads_block_by_block_and_an_empty_one_keeps_its_columns(
    analyst_store: ClickHouseStorage,
) -> None:
    with analyst_store.analyst.stream("SELECT trace_id, e2e_ms FROM spans ORDER BY trace_id") as reader:
        rows = reader.read_all()
    assert rows.num_rows == len(REQUESTS) and rows.column_names == ["trace_id", "e2e_ms"]
    with analyst_store.analyst.stream("SELECT trace_id FROM spans WHERE e2e_ms < 0") as reader:
        empty = reader.read_all()
    assert empty.num_rows == 0 and empty.column_names == ["trace_id"]


def test_a_refusing_clickhouse_gets_otlp_answered_retryable_and_the_retry_is_stored_once(tmp_path: Path) -> None:
    settings = service_settings(
        tmp_path / "unused.duckdb", storage={"backend": "clickhouse", "clickhouse": {"dsn": chdb_dsn("refusing")}}
    )
    with RunningService(settings) as svc:
        storage = svc.service.storage
        assert isinstance(storage, ClickHouseStorage)
        body = request([span(attributes={"gen_ai.request.model": "m"}) for _ in range(20)]).SerializeToString()
        storage.client.command("RENAME TABLE spans_ingest TO spans_ingest_gone")  # the server refuses inserts
        assert post(svc, body) == (503, "1")  # UNAVAILABLE with a retry hint: the exporter retries
        storage.client.command("RENAME TABLE spans_ingest_gone TO spans_ingest")  # it is back
        assert post(svc, body)[0] == 200
        assert post(svc, body)[0] == 200  # a retry of an acknowledged request
        assert stored(storage, "SELECT count() FROM spans") == 20
        assert stored(storage, "SELECT count() FROM spans FINAL") == 20


def test_tailwatch_migrate_and_sql_work_on_the_configured_clickhouse(tmp_path: Path) -> None:
    # Processes of their own: chDB keeps one data directory per process, and this one holds the suite's.
    env = {
        **os.environ,
        "TAILWATCH_STORAGE__BACKEND": "clickhouse",
        "TAILWATCH_STORAGE__CLICKHOUSE__DSN": f"chdb://{tmp_path / 'ch'}?database=cli",
    }

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tailwatch", *argv],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    migrated = cli("migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "ClickHouse" in migrated.stdout
    answer = cli("sql", "SELECT count() AS n FROM spans", "--format", "csv")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.split() == ['"n"', "0"]
    refused = cli("sql", "SELECT * FROM file('/etc/passwd', 'LineAsString')")
    assert refused.returncode == 1 and "forbidden" in refused.stderr


def test_within_duckdb_a_p99_is_the_same_bits_whatever_the_storage_order_and_a_mean_within_1e_12(
    tmp_path: Path,
) -> None:
    # Why means are compared to 1e-12 across the engines and quantiles to the bit: the same spans stored in
    # another order can give DuckDB itself a mean a last bit away (seen in the suite; not in every run, as
    # it depends on how the rows meet in the sum), while an order statistic cannot move.
    table = paired_spans(1)
    forward = DuckDBStorage.open(tmp_path / "forward.duckdb")
    backward = DuckDBStorage.open(tmp_path / "backward.duckdb")
    try:
        store_all(forward, table)
        store_all(backward, table.take(list(reversed(range(table.num_rows)))))
        read = RequestSummary(
            Window(WINDOW.start - timedelta(hours=1), WINDOW.end + timedelta(hours=1)),
            grouping_sets=((),),
            measures=(Measure("mean", Aggregate.MEAN, "e2e_ms"), Measure("p99", Aggregate.QUANTILE, "e2e_ms", 0.99)),
        )
        one, other = (read.fetch(store.windows).to_pylist()[0] for store in (forward, backward))
        assert one["p99"] == other["p99"]
        assert one["mean"] == pytest.approx(other["mean"], rel=1e-12)
    finally:
        forward.close()
        backward.close()


def test_a_new_retention_reaches_the_ttl_of_tables_created_with_another() -> None:
    dsn = chdb_dsn("ttl")
    for statement in create_otel_traces("otel_traces", cluster=None, ttl_days=7):  # a table from before the view
        ClickHouse(dsn).command(statement)
    ClickHouseStorage.open(dsn, ttl_days=7, otel_traces="write").close()
    longer = ClickHouseStorage.open(dsn, ttl_days=30, otel_traces="write")
    try:
        for table in ("spans", "engine_metrics", "otel_traces"):
            engine = stored(longer, f"SELECT engine_full FROM system.tables WHERE database = currentDatabase() "
                                    f"AND name = '{table}'")  # fmt: skip
            assert f"toIntervalSecond({30 * 86400})" in engine, table
    finally:
        longer.close()


def cluster_statements() -> list[str]:
    evaluator = Evaluator()
    try:
        statements = [st for name, columns in evaluator.tables.items()
                      for st in create_table(name, columns, cluster="prod", ttl_days=7)]  # fmt: skip
        statements += create_otel_traces("otel_traces", cluster="prod", ttl_days=7)
        statements += ingest_statements(evaluator.span_columns_with_json(), otel_table="otel_traces", cluster="prod")
        statements.append(create_replaced("tailwatch_lease", "name String", "name", "prod"))
        statements.append(create_otel_view("otel_traces", cluster="prod"))
    finally:
        evaluator.close()
    return statements


def created(statement: str) -> str:
    return statement.split("`")[1]


def test_on_a_cluster_every_table_is_created_on_it_replicated_and_parses() -> None:
    # No ClickHouse cluster runs here (a Distributed table needs a shard to connect to, ON CLUSTER a Keeper):
    # the statements are what can be checked, by ClickHouse's own parser.
    statements = cluster_statements()
    assert len(statements) > 20
    admin = ClickHouse(chdb_dsn("cluster_parse"))
    for statement in statements:
        assert "ON CLUSTER `prod`" in statement, statement[:80]
        assert admin.command("SELECT formatQuery({q:String})", {"q": statement})
        if "ENGINE = Null" not in statement and "VIEW" not in statement:
            assert "ENGINE = Replicated" in statement or "ENGINE = Distributed" in statement, statement[:80]
            assert "non_replicated_deduplication_window" not in statement


def test_on_a_cluster_span_tables_are_sharded_by_trace_behind_distributed_tables_named_as_the_reads_name_them() -> None:
    statements = cluster_statements()
    by_table = {created(s): s for s in statements if s.lstrip().startswith("CREATE TABLE")}
    sharded = {"spans": "cityHash64(trace_id)", "span_scores": "cityHash64(trace_id)", "engine_metrics": "rand()",
               "otel_traces": "cityHash64(TraceId)"}  # fmt: skip
    for name, key in sharded.items():
        local = by_table[f"{name}_local"]
        assert "'/clickhouse/tables/{shard}/{database}/" in local, name
        assert by_table[name].endswith(f"ENGINE = Distributed(`prod`, currentDatabase(), `{name}_local`, {key})"), (
            by_table[name]
        )
    # Tailwatch's own tables: one replica set across the cluster, read whole on any node.
    for name in ("alerts", "clusters", "detector_runs", "token_latency", "tailwatch_lease"):
        assert "'/clickhouse/tables/all/{database}/" in by_table[name], name
        assert f"{name}_local" not in by_table
    # Receivers insert into their node's Null table, whose view writes through the Distributed `spans`.
    views = [s for s in statements if "MATERIALIZED VIEW" in s]
    assert [s.split(" TO ")[1].split()[0] for s in views] == ["spans", "`otel_traces`"]
    # ... answered once the shards stored the rows, not once this node queued them for later.
    client = ClickHouse(chdb_dsn("cluster_sync"))
    assert int(client.command("SELECT toUInt8(getSetting('insert_distributed_sync'))")) == 1


def test_on_a_cluster_retention_deletes_from_each_shards_table_and_once_from_a_replicated_one() -> None:
    where = "end_time < {c:DateTime64(6)}"
    assert delete_rows("spans", where, "prod") == f"DELETE FROM `spans_local` ON CLUSTER `prod` WHERE {where}"
    assert delete_rows("otel_traces", where, "prod", sharded=True).startswith("DELETE FROM `otel_traces_local` ON")
    assert delete_rows("slo_burn_minutes", where, "prod") == f"DELETE FROM `slo_burn_minutes` WHERE {where}"
    assert delete_rows("spans", where, None) == f"DELETE FROM `spans` WHERE {where}"


def test_a_receiver_only_process_schedules_nothing_and_never_takes_the_lease(tmp_path: Path) -> None:
    settings = service_settings(
        tmp_path / "unused.duckdb",
        scheduler=False,
        storage={"backend": "clickhouse", "clickhouse": {"dsn": chdb_dsn("receiver"), "otel_traces": "follow"}},
    )
    with RunningService(settings) as svc:
        storage = svc.service.storage
        assert isinstance(storage, ClickHouseStorage)
        scheduler = svc.service._scheduler  # what the process runs on its own is the point
        assert scheduler is not None and scheduler.get_jobs() == []
        assert storage.lease.current() is None
        body = request([span(attributes={"gen_ai.request.model": "m"}) for _ in range(5)]).SerializeToString()
        assert post(svc, body)[0] == 200  # it still receives


def test_clickhouses_spans_columns_are_nullable_as_the_model_says_not_as_duckdb_stores_them() -> None:
    """DuckDB stores `duration_ms` NULL where its view reads it from the times; ClickHouse stores every value."""
    evaluator = Evaluator()
    try:
        types = {c.name: c.type for c in evaluator.tables["spans"]}
    finally:
        evaluator.close()
    assert types == {c.name: clickhouse_type(c.sql_type, not c.required) for c in SPAN_COLUMNS if c.name in types}
    assert types["duration_ms"] == "Float64"


def test_the_clickhouse_writer_thread_is_named_for_top() -> None:
    # Before its first insert: in-process chDB renames a thread that runs its queries ("Unknown"); over HTTP
    # to a ClickHouse server the name stays.
    store = open_chdb("thread_name")
    try:
        wait_until(lambda: "tw-clickhouse-w" in kernel_names(os.getpid()), "the writer thread to name itself")
    finally:
        store.close()


def test_a_store_made_by_an_earlier_tailwatch_gets_the_columns_added_since_and_keeps_replayed_figures() -> None:
    """Tables are created if missing; a store from before a migration lacks its columns (clusters.same_requests,
    spans.engine_facts_reason) and has a deduplication window on tables whose rows are replaced on purpose:
    opened again, it gains both, and a replayed window keeps its rows."""
    dsn = chdb_dsn("upgrade")
    store = ClickHouseStorage.open(dsn)
    old = "ALTER TABLE {} MODIFY SETTING non_replicated_deduplication_window = 1000"
    store.client.command("ALTER TABLE clusters DROP COLUMN same_requests")
    store.client.command("ALTER TABLE spans DROP COLUMN engine_facts_reason")
    store.client.command(old.format("context_length"))
    store.close()
    store = ClickHouseStorage.open(dsn)
    try:
        columns = {
            (str(t), str(c))
            for t, c in store.client.rows(
                "SELECT table, name FROM system.columns WHERE database = currentDatabase() "
                "AND name IN ('same_requests', 'engine_facts_reason')"
            )
        }
        assert {("clusters", "same_requests"), ("spans", "engine_facts_reason")} <= columns
        [(query,)] = store.client.rows("SELECT create_table_query FROM system.tables WHERE name = 'context_length' "
                                       "AND database = currentDatabase()")  # fmt: skip
        assert "non_replicated_deduplication_window = 1000" not in str(query)
        [(spans_query,)] = store.client.rows("SELECT create_table_query FROM system.tables WHERE name = 'spans' "
                                             "AND database = currentDatabase()")  # fmt: skip
        assert "non_replicated_deduplication_window = 1000" in str(spans_query)  # retried batches still count once
    finally:
        store.close()
