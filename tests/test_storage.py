"""Schema by migrations, retention by event time, the writer's commit semantics."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import grpc
from builders import request, span
from conftest import RunningService
from waiting import HANG_GUARD

from detectors.alerts import Alert, evaluate, fingerprint
from detectors.base import Condition, Severity, Window
from model.columns import SPAN_BATCH_SCHEMA
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.detector_store import DuckDBDetectorStore
from storage.duckdb.window_source import DuckDBWindowSource

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


def test_attributes_are_stored_zstd_compressed_and_survive_the_rebuild_both_ways(tmp_path: Path) -> None:
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con, "0013")
    con.execute(
        "INSERT INTO spans (trace_id, span_id, name, kind, start_time, end_time, duration_ms, status_code, "
        "attributes, ingested_at) SELECT 't' || i, 's', 'n', 'SERVER', TIMESTAMP '2026-11-23', "
        "TIMESTAMP '2026-11-23', 0, 'OK', json_object('gen_ai.request.id', 'chatcmpl-' || i), now() "
        "FROM range(5000) AS r(i)"
    )

    def stored() -> list[tuple[str, str]]:
        return con.execute("SELECT trace_id, attributes->>'gen_ai.request.id' FROM spans ORDER BY ALL").fetchall()

    def compression() -> set[str]:
        con.execute("CHECKPOINT")
        rows = con.execute("SELECT compression FROM pragma_storage_info('spans') WHERE column_name = 'attributes'")
        return {r[0] for r in rows.fetchall()} - {"Constant"}

    before = stored()
    migrate.upgrade(con, "0015")  # 0016 stores attributes split (tests/test_stored_attributes.py)
    assert compression() == {"ZSTD"}
    assert stored() == before
    migrate.downgrade(con, "0013")
    assert "ZSTD" not in compression()
    assert stored() == before
    con.close()


# Alerts as 0007's detectors stored them (four said `score` where the others said `signal`), each with the
# hold-down count of its group: (alert_id, detector, state, labels, breaches).
BEFORE_0008 = [
    ("a-cache", "cache_curve", "firing", {"bucket": "low", "score": "json_adherence"}, 4),
    ("a-cache-resolved", "cache_curve", "resolved", {"bucket": "medium", "score": "latency_p99"}, 1),
    (
        "a-cells",
        "context_length",
        "firing",
        {"prompt_bucket": "64k+", "output_bucket": "<500", "score": "groundedness"},
        2,
    ),
    ("a-scaling", "saturation", "firing", {"bucket": "scaling", "score": "latency_p99"}, 3),
    ("a-burst", "traffic_pattern", "firing", {"pattern": "burst", "score": "json_adherence"}, 5),
    ("a-replica", "replica_skew", "firing", {"replica_id": "r7", "signal": "json_adherence"}, 6),
]


def renamed(labels: dict[str, str]) -> dict[str, str]:
    return {("signal" if name == "score" else name): value for name, value in labels.items()}


def stored_alerts(con: duckdb.DuckDBPyConnection) -> dict[str, Alert]:
    return {r["alert_id"]: Alert.from_row(r) for r in con.sql("SELECT * FROM alerts").to_arrow_table().to_pylist()}


def stored_conditions(con: duckdb.DuckDBPyConnection) -> set[tuple[str, str, int]]:
    return set(con.execute("SELECT detector, fingerprint, breaches FROM alert_conditions").fetchall())


def test_migration_0008_renames_score_to_signal_and_a_firing_alert_keeps_firing(tmp_path: Path) -> None:
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con, "0007")
    at = datetime(2026, 11, 20, 12, 0)
    for alert_id, detector, state, labels, breaches in BEFORE_0008:
        fp = fingerprint(detector, labels)
        con.execute(
            "INSERT INTO alerts VALUES (?, ?, ?, 'warning', ?, ?, 'summary', 0.2, 0.1, ?, ?, ?, ?, ?)",
            [alert_id, detector, fp, state, json.dumps(labels, sort_keys=True), at - timedelta(minutes=5), at,
             at - timedelta(hours=1), at if state == "resolved" else None, at],
        )  # fmt: skip
        con.execute("INSERT INTO alert_conditions VALUES (?, ?, ?, ?)", [fp, detector, breaches, at])
    # A breach in its hold-down that no alert names: a fingerprint is a hash, so its count cannot move.
    con.execute("INSERT INTO alert_conditions VALUES ('0123456789abcdef', 'cache_curve', 1, ?)", [at])

    migrate.upgrade(con)
    alerts = stored_alerts(con)
    for alert_id, detector, state, labels, _ in BEFORE_0008:
        alert = alerts[alert_id]
        assert alert.labels == renamed(labels), alert_id
        assert alert.fingerprint == fingerprint(detector, renamed(labels)), alert_id
        assert (alert.state, alert.started_at) == (state, at - timedelta(hours=1)), alert_id
    assert con.execute("SELECT labels::VARCHAR FROM alerts WHERE alert_id = 'a-cells'").fetchall() == [
        ('{"output_bucket": "<500", "prompt_bucket": "64k+", "signal": "groundedness"}',)
    ]
    assert stored_conditions(con) == {(d, alerts[a].fingerprint, n) for a, d, _, _, n in BEFORE_0008}

    # The next evaluation of the same breach, from the state the pass reads, refreshes the alert and counts on
    # from its hold-down count: nothing resolves, nothing fires anew.
    store = DuckDBDetectorStore(DuckDBWindowSource(con), writer=None)  # reads only
    for alert_id, detector, state, labels, breaches in BEFORE_0008:
        if state != "firing" or "score" not in labels:
            continue
        firing = store.firing_state(detector)
        later = at + timedelta(minutes=5)
        evaluation = evaluate(
            detector,
            [Condition(renamed(labels), 0.3, 0.1, "still breaching")],
            firing.firing,
            firing.breaches,
            for_evaluations=3,
            default_severity=Severity.WARNING,
            window=Window(at, later),
            at=later,
        )
        assert (evaluation.fired, evaluation.resolved) == ([], []), alert_id
        assert [a.alert_id for a in evaluation.updated] == [alert_id]
        assert evaluation.breaches == {alerts[alert_id].fingerprint: breaches + 1}, alert_id

    migrate.downgrade(con, "0007")
    alerts = stored_alerts(con)
    for alert_id, detector, _, labels, _ in BEFORE_0008:
        assert alerts[alert_id].labels == labels, alert_id
        assert alerts[alert_id].fingerprint == fingerprint(detector, labels), alert_id
    assert stored_conditions(con) == {(d, fingerprint(d, labels), n) for _, d, _, labels, n in BEFORE_0008}
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
