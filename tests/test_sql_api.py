"""POST /v1/sql and GET /v1/export on a running service: formats read by real clients, read-only by
construction, time limits, row caps, the bearer token, and queries beside live ingest."""

from __future__ import annotations

import csv
import io
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import trustme
from conftest import RunningService, service_settings
from waiting import HANG_GUARD, join

from simulator import scenarios, simulate
from storage.duckdb.analyst import AnalystQueries


def sql(
    svc: RunningService,
    statement: str,
    params: Any = None,
    *,
    accept: str | None = None,
    token: str | None = None,
    url: str | None = None,
    context: ssl.SSLContext | None = None,
    **fields: Any,
) -> tuple[int, dict[str, str], bytes]:
    body: dict[str, Any] = {"sql": statement, **fields}
    if params is not None:
        body["params"] = params
    headers = {"Content-Type": "application/json"}
    if accept:
        headers["Accept"] = accept
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        f"{url or svc.api_url}/v1/sql", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=60, context=context) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def error_of(status_body: tuple[int, dict[str, str], bytes]) -> tuple[int, str, str]:
    status, _headers, body = status_body
    error = json.loads(body)["error"]
    assert set(error) == {"code", "message"}
    assert "Traceback" not in error["message"]
    return status, error["code"], error["message"]


@pytest.fixture
def small(tmp_path: Path) -> Any:
    settings = service_settings(tmp_path / "t.duckdb", sql={"max_rows": 5, "timeout_seconds": 1.0})
    with RunningService(settings) as svc:
        yield svc


QUERY = (
    "SELECT i, i * 0.5 AS half, 'row ' || i AS label, TIMESTAMP '2026-11-20 12:00' + to_seconds(i) AS at "
    "FROM range(3) t(i)"
)


def test_json_is_the_default_with_column_types_and_iso_utc_times(small: RunningService) -> None:
    status, headers, body = sql(small, QUERY)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    doc = json.loads(body)
    assert doc["columns"] == [
        {"name": "i", "type": "BIGINT"},
        {"name": "half", "type": "DECIMAL(21,1)"},
        {"name": "label", "type": "VARCHAR"},
        {"name": "at", "type": "TIMESTAMP"},
    ]
    assert doc["rows"][2] == [2, 1.0, "row 2", "2026-11-20T12:00:02Z"]
    assert doc["truncated"] is False


def test_csv_by_accept_header_is_read_by_the_csv_module(small: RunningService) -> None:
    status, headers, body = sql(small, QUERY, accept="text/csv")
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert [r["label"] for r in rows] == ["row 0", "row 1", "row 2"]
    assert rows[1]["at"].startswith("2026-11-20 12:00:01")


def test_arrow_stream_by_format_field_is_read_by_pyarrow(small: RunningService) -> None:
    status, headers, body = sql(small, QUERY, format="arrow")
    assert status == 200 and headers["Content-Type"] == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(body).read_all()
    assert table.column("label").to_pylist() == ["row 0", "row 1", "row 2"]
    assert table.schema.field("at").type == pa.timestamp("us")
    assert table.schema.metadata == {b"truncated": b"false"}


def test_positional_and_named_parameters_bind_values_not_sql(small: RunningService) -> None:
    doc = json.loads(sql(small, "SELECT ? + 1 AS n, ? AS s", [41, "x'); DROP TABLE spans; --"])[2])
    assert doc["rows"] == [[42, "x'); DROP TABLE spans; --"]]
    doc = json.loads(sql(small, "SELECT $a * 2 AS n", {"a": 21})[2])
    assert doc["rows"] == [[42]]
    # The time-range macros take their bounds as strings, so a client need not know DuckDB's types.
    doc = json.loads(sql(small, "SELECT count(*) FROM llm_requests_between(?, ?)", ["2026-01-01", "2027-01-01"])[2])
    assert doc["rows"] == [[0]]


def test_the_row_cap_truncates_and_says_so_in_every_format(small: RunningService) -> None:
    doc = json.loads(sql(small, "SELECT * FROM range(100000)")[2])
    assert len(doc["rows"]) == 5 and doc["truncated"] is True
    exact = json.loads(sql(small, "SELECT * FROM range(5)")[2])
    assert len(exact["rows"]) == 5 and exact["truncated"] is False
    _status, headers, body = sql(small, "SELECT * FROM range(100)", format="arrow")
    table = pa.ipc.open_stream(body).read_all()
    assert table.num_rows == 5 and table.schema.metadata == {b"truncated": b"true"}
    assert headers["X-Tailwatch-Truncated"] == "true"
    _status, headers, body = sql(small, "SELECT * FROM range(100)", format="csv")
    assert len(body.decode().splitlines()) == 6 and headers["X-Tailwatch-Truncated"] == "true"


def test_a_callers_row_cap_can_lower_the_configured_cap_but_not_raise_it() -> None:
    con = duckdb.connect(":memory:")
    try:
        analyst = AnalystQueries(con, timeout_seconds=30, max_rows=5)
        for asked, returned in ((50, 5), (2, 2)):
            result = analyst.run("SELECT * FROM range(100)", max_rows=asked)
            assert (result.table.num_rows, result.truncated) == (returned, True), f"max_rows={asked}"
        exact = analyst.run("SELECT * FROM range(5)", max_rows=6)
        assert (exact.table.column(0).to_pylist(), exact.truncated) == ([0, 1, 2, 3, 4], False)
    finally:
        con.close()


def test_a_long_query_is_cancelled_at_the_time_limit_and_the_service_goes_on(small: RunningService) -> None:
    """The statement would run for hours; it is answered 400 `timeout` (the client's 60 s deadline in `sql`
    is only a hang guard). How soon after the limit the answer comes is measured by bench/sql_time_limit.py."""
    started = time.monotonic()
    status, code, message = error_of(sql(small, "SELECT count(*) FROM range(1000000000000) a"))
    elapsed = time.monotonic() - started
    assert (status, code) == (400, "timeout")
    assert "time limit of 1 s" in message
    # Not cancelled before its limit: a loaded machine can only make this longer, never shorter.
    assert elapsed >= 0.9, f"cancelled after {elapsed:.2f} s, before the 1 s limit"
    assert json.loads(sql(small, "SELECT 1 AS one")[2])["rows"] == [[1]]


def test_errors_are_precise_about_syntax_and_names(small: RunningService) -> None:
    status, code, message = error_of(sql(small, "SELEC trace_id FROM spans"))
    assert (status, code) == (400, "syntax_error")
    assert 'syntax error at or near "SELEC"' in message and "LINE 1" in message
    status, code, message = error_of(sql(small, "SELECT no_such_column FROM spans"))
    assert (status, code) == (400, "invalid_query")
    assert '"no_such_column" not found' in message
    status, code, message = error_of(sql(small, "SELECT * FROM no_such_table"))
    assert (status, code) == (400, "unknown_name")
    assert "no_such_table does not exist" in message
    assert error_of(sql(small, "   "))[:2] == (400, "empty_query")
    assert error_of(sql(small, "SELECT 1", format="xml"))[:2] == (400, "bad_request")
    assert error_of(sql(small, "SELECT 1", accept="image/png"))[:2] == (406, "not_acceptable")


def test_a_failure_duckdb_gives_no_named_class_is_query_failed_with_its_message(small: RunningService) -> None:
    status, code, message = error_of(sql(small, "SELECT 9223372036854775807 + i FROM range(1, 2) t(i)"))
    assert (status, code) == (400, "query_failed")
    assert "Overflow in addition" in message


def test_a_body_that_is_not_a_query_gets_the_same_error_shape(small: RunningService) -> None:
    req = urllib.request.Request(f"{small.api_url}/v1/sql", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400
    assert json.loads(err.value.read())["error"]["code"] == "bad_request"


FORBIDDEN = [
    # writes, however phrased
    ("INSERT INTO alerts (alert_id) VALUES ('x')", "read_only"),
    # `spans` is a view of `span_rows`: the stored rows are what a write would reach.
    ("UPDATE span_rows SET name = 'x'", "read_only"),
    ("DELETE FROM span_rows", "read_only"),
    ("CREATE TABLE mine AS SELECT 1", "read_only"),
    ("CREATE TEMP TABLE mine AS SELECT 1", "read_only"),
    ("DROP TABLE spans", "read_only"),
    ("ALTER TABLE span_rows ADD COLUMN x INT", "read_only"),
    ("EXPLAIN ANALYZE DELETE FROM span_rows", "read_only"),
    ("SELECT 1; DROP TABLE spans", "multiple_statements"),
    ("COMMIT", "read_only"),
    # files, other databases, extensions, configuration
    ("SELECT * FROM read_text('/etc/hostname')", "forbidden"),
    ("SELECT * FROM read_csv('/etc/passwd')", "forbidden"),
    ("SELECT * FROM glob('/*')", "forbidden"),
    ("COPY spans TO '{out}'", "read_only"),
    ("EXPORT DATABASE '{dir}'", "read_only"),
    ("ATTACH '{other}' AS other", "read_only"),
    ("ATTACH ':memory:' AS scratch", "read_only"),
    ("DETACH tailwatch", "read_only"),
    ("INSTALL httpfs", "read_only"),
    ("LOAD json", "read_only"),
    ("SET threads = 1", "read_only"),
    ("PRAGMA threads = 1", "read_only"),
    ("RESET memory_limit", "read_only"),
    ("CHECKPOINT", "read_only"),
]


def test_every_forbidden_statement_class_is_refused_and_nothing_changes(small: RunningService, tmp_path: Path) -> None:
    paths = {"out": tmp_path / "out.csv", "dir": tmp_path / "dump", "other": tmp_path / "other.duckdb"}
    before = snapshot(small)
    for statement, code in FORBIDDEN:
        text = statement.format(**paths)
        status, got, message = error_of(sql(small, text))
        assert (status, got) == ({"multiple_statements": 400}.get(code, 403), code), (text, message)
        assert message, text
    assert snapshot(small) == before
    assert not any(p.exists() for p in paths.values())


def snapshot(svc: RunningService) -> tuple[Any, ...]:
    return (
        svc.rows("SELECT table_name, table_type FROM information_schema.tables ORDER BY ALL"),
        svc.rows("SELECT database_name FROM duckdb_databases() ORDER BY ALL"),
        svc.rows("SELECT count(*) FROM spans"),
        svc.rows("SELECT name, value FROM duckdb_settings() WHERE name IN ('threads', 'memory_limit') ORDER BY 1"),
        svc.rows("SELECT count(*) FROM duckdb_functions()"),  # a loaded extension adds functions
    )


def test_with_a_token_every_path_but_the_probes_needs_it(tmp_path: Path) -> None:
    settings = service_settings(tmp_path / "t.duckdb", api={"token": "s3cret"})
    with RunningService(settings) as svc:
        status, headers, body = sql(svc, "SELECT 1")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert json.loads(body)["error"]["code"] == "unauthorized"
        assert sql(svc, "SELECT 1", token="wrong")[0] == 401
        assert sql(svc, "SELECT 1", token="s3cret")[0] == 200
        for path in ("/metrics", "/v1/alerts", "/v1/clusters"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{svc.api_url}{path}", timeout=10)
            assert err.value.code == 401, path
        for path in ("/healthz", "/readyz"):
            with urllib.request.urlopen(f"{svc.api_url}{path}", timeout=10) as resp:
                assert resp.status == 200


def test_tls_serves_the_api_over_https(tmp_path: Path) -> None:

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    settings = service_settings(tmp_path / "t.duckdb", api={"tls_cert_file": cert_file, "tls_key_file": key_file})
    with RunningService(settings) as svc:
        client = ssl.create_default_context()
        ca.configure_trust(client)
        url = f"https://127.0.0.1:{svc.service.api_port}"
        status, _headers, body = sql(svc, "SELECT 42 AS n", url=url, context=client)
        assert status == 200 and json.loads(body)["rows"] == [[42]]
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP gets no answer
            urllib.request.urlopen(f"http://127.0.0.1:{svc.service.api_port}/healthz", timeout=5).read()


def test_queries_run_while_a_client_streams_spans_and_both_succeed(tmp_path: Path) -> None:
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    with RunningService(service_settings(tmp_path / "t.duckdb")) as svc:
        sent: list[int] = []
        traffic = {"seed": 3, "end": end, "history_hours": 0.5, "history_rate": 1.0, "rate": 5.0}

        def stream() -> None:
            sent.append(simulate.run(["steady"], endpoint=svc.grpc_target, protocol="grpc", **traffic))  # type: ignore[arg-type]

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        answered = 0
        deadline = time.monotonic() + HANG_GUARD
        while streamer.is_alive():
            if time.monotonic() > deadline:
                pytest.fail(f"the simulated client was still streaming after {HANG_GUARD:g} s ({answered} queries)")
            status, _headers, body = sql(
                svc, "SELECT count(*) AS n, quantile_cont(e2e_ms, 0.99) AS p99 FROM llm_requests"
            )
            assert status == 200, body
            answered += 1
        join(streamer, "the simulated client to finish")
        assert answered >= 2
        expected = len(scenarios.requests(["steady"], seed=3, end=end, history_hours=0.5, history_rate=1.0, rate=5.0))
        assert json.loads(sql(svc, "SELECT count(*) FROM llm_requests")[2])["rows"] == [[expected]]
        assert sent and sent[0] > 0


def test_analysts_read_utc_whatever_the_machines_time_zone(small: RunningService) -> None:
    # Each analyst statement runs on a cursor of its own; the service's UTC must reach it.
    doc = json.loads(sql(small, "SELECT current_setting('TimeZone') AS tz, now()::TIMESTAMP AS at")[2])
    [[tz, at]] = doc["rows"]
    assert tz == "UTC"
    now = datetime.now(UTC).replace(tzinfo=None)
    assert abs(datetime.fromisoformat(at.removesuffix("Z")) - now) < timedelta(minutes=1)
