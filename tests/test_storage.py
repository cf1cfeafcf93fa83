"""Schema by migrations, retention by event time, the writer's commit semantics."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import grpc
from builders import request, span
from conftest import RunningService
from waiting import HANG_GUARD

from collector.model import SPAN_BATCH_SCHEMA
from storage.duckdb import migrate
from storage.duckdb.database import open_database

CONTRACT_COLUMNS = [
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_time",
    "end_time",
    "duration_ms",
    "status_code",
    "status_message",
    "service_name",
    "tenant_id",
    "replica_id",
    "deployment",
    "model",
    "provider",
    "operation",
    "is_llm",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "ttft_ms",
    "tpot_ms",
    "queue_ms",
    "prefill_ms",
    "decode_ms",
    "e2e_ms",
    "cache_hit_ratio",
    "queue_depth",
    "replica_count",
    "batch_size",
    "prefill_tokens_in_batch",
    "quantization",
    "finish_reason",
    "attributes",
    "resource",
]


def columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]


def test_migrations_create_every_contract_column_and_every_decoded_column(tmp_path: Path) -> None:
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con)
    have = columns(con, "spans")
    assert set(CONTRACT_COLUMNS) <= set(have)
    assert set(SPAN_BATCH_SCHEMA.names) <= set(have)
    assert migrate.current_revision(con) == migrate.head_revision()
    con.close()


def test_downgrade_to_base_and_upgrade_again_round_trips(tmp_path: Path) -> None:
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con)
    migrate.downgrade(con, "base")
    assert migrate.current_revision(con) is None
    assert "spans" not in [r[0] for r in con.execute("SHOW TABLES").fetchall()]
    migrate.upgrade(con)
    assert "spans" in [r[0] for r in con.execute("SHOW TABLES").fetchall()]
    con.close()


def test_migrate_command_creates_the_schema_and_is_idempotent(tmp_path: Path) -> None:
    db = tmp_path / "cli.duckdb"
    cmd = [sys.executable, "-m", "tailwatch", "migrate", "--db", str(db)]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=HANG_GUARD)
    assert "schema empty -> " in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=HANG_GUARD)
    assert "schema at " in second.stdout


def test_retention_deletes_spans_that_ended_before_the_cutoff(service: RunningService) -> None:
    now_ns = int(datetime.now(UTC).timestamp() * 1e9)
    day = 86_400 * 10**9
    old = [span(start=now_ns - 9 * day, attributes={"age": "old"}) for _ in range(3)]
    fresh = [span(start=now_ns - day, attributes={"age": "fresh"}) for _ in range(2)]
    with grpc.insecure_channel(service.grpc_target) as ch:
        call = ch.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None,
            response_deserializer=None,
        )
        call(request(old + fresh).SerializeToString(), timeout=10)
    assert service.service.enforce_retention() == 3
    assert service.rows("SELECT DISTINCT attributes->>'age' FROM spans") == [("fresh",)]


def test_timestamps_are_utc_and_ingested_at_is_set(service: RunningService) -> None:
    start = int(datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC).timestamp() * 1e9)
    with grpc.insecure_channel(service.grpc_target) as ch:
        ch.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None,
            response_deserializer=None,
        )(request([span(start=start, duration_ns=250_000_000)]).SerializeToString(), timeout=10)
    [(start_time, end_time, duration_ms, ingested_at)] = service.rows(
        "SELECT start_time, end_time, duration_ms, ingested_at FROM spans"
    )
    assert start_time == datetime(2026, 11, 20, 12, 0, 0)
    assert end_time - start_time == timedelta(milliseconds=250)
    assert duration_ms == 250.0
    assert abs(ingested_at - datetime.now(UTC).replace(tzinfo=None)) < timedelta(minutes=1)
