"""The ports under clients that misbehave at the connection level, on a real server on loopback: trickled
headers, stalled bodies, idle connections by the thousand, headers over the limit, connections past the
cap, and gRPC streams that never finish. Each is bounded, and the other clients are served meanwhile."""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from builders import request, span
from conftest import RunningService, service_settings
from google.rpc import error_details_pb2, status_pb2
from waiting import HANG_GUARD, WriterHold, wait_until

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SHORT = {"http_idle_timeout_seconds": 0.5, "http_read_timeout_seconds": 0.5}


@pytest.fixture
def edgy(db_path: Path) -> Iterator[RunningService]:
    with RunningService(service_settings(db_path, ingest=dict(SHORT))) as svc:
        yield svc


def post(svc: RunningService, body: bytes = b"{}") -> int:
    req = urllib.request.Request(f"{svc.http_url}/v1/traces", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_GUARD) as resp:
        resp.read()
        return int(resp.status)


def connect(svc: RunningService, first: bytes = b"") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", svc.service.http_port), timeout=HANG_GUARD)
    if first:
        conn.sendall(first)
    return conn


def answer(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (b"" if it closes without a word)."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def test_a_connection_that_trickles_its_headers_or_sends_nothing_is_closed_after_the_idle_timeout(
    edgy: RunningService,
) -> None:
    trickling = connect(edgy, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: applic")
    silent = connect(edgy)
    assert answer(trickling) == b""
    assert answer(silent) == b""
    assert edgy.metric("tailwatch_http_connections_closed_total", port="otlp_http", reason="idle") >= 2
    assert post(edgy) == 200  # the port serves the next client as before


def test_a_keep_alive_connection_is_closed_once_idle_and_not_while_its_request_is_handled(
    edgy: RunningService,
) -> None:
    conn = connect(edgy, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 2\r\n\r\n{}")  # fmt: skip
    reply = answer(conn)  # the answer, then the close once idle for half a second
    assert reply.startswith(b"HTTP/1.1 200 OK")


def test_a_body_that_stalls_is_refused_408_and_the_connection_closed(edgy: RunningService) -> None:
    conn = connect(edgy, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"resourceSpans\": [")  # fmt: skip
    reply = answer(conn)
    assert reply.startswith(b"HTTP/1.1 408 Request Timeout")
    assert b"Retry-After" not in reply
    assert b"did not arrive within 0.5 s" in reply
    assert edgy.metric("tailwatch_export_requests_total", transport="http", signal="traces", outcome="timed_out") == 1.0
    assert edgy.rows("SELECT count(*) FROM spans") == [(0,)]


def test_a_header_over_the_limit_is_refused_400_counted_and_not_logged(
    edgy: RunningService, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        conn = connect(edgy, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        reply = answer(conn)
    assert reply.startswith(b"HTTP/1.0 400 Bad Request")
    assert edgy.metric("tailwatch_http_malformed_requests_total", reason="LineTooLong") == 1.0
    assert [r for r in caplog.records if r.name.startswith("aiohttp")] == []
    assert post(edgy) == 200


def test_thousands_of_idle_connections_do_not_keep_other_clients_out(db_path: Path) -> None:
    with RunningService(service_settings(db_path)) as svc:
        idle = [connect(svc) for _ in range(2000)]
        try:
            assert post(svc) == 200
        finally:
            for conn in idle:
                conn.close()


def test_past_the_connection_cap_a_new_connection_is_closed_and_the_open_ones_are_served(db_path: Path) -> None:
    with RunningService(service_settings(db_path, ingest={"http_max_connections": 3})) as svc:
        held = [connect(svc) for _ in range(3)]
        refused = connect(svc)
        assert answer(refused) == b""
        assert svc.metric("tailwatch_http_connections_closed_total", port="otlp_http", reason="over_limit") == 1.0
        held[0].sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")  # fmt: skip
        assert answer(held[0]).startswith(b"HTTP/1.1 200 OK")
        for conn in held[1:]:
            conn.close()


def test_a_burst_of_grpc_calls_past_the_concurrency_limit_is_refused_as_retryable(db_path: Path) -> None:
    """Per the OTLP spec an exporter retries RESOURCE_EXHAUSTED only with RetryInfo, and the Collector's does
    exactly that: a refusal without it loses the batch. gRPC's own concurrent-call cap answered so."""
    with RunningService(service_settings(db_path, ingest={"max_concurrent_requests": 2})) as svc:
        bodies = [request([span() for _ in range(200)]).SerializeToString() for _ in range(40)]
        with grpc.insecure_channel(svc.grpc_target) as ch:
            export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            calls = [export.future(body, timeout=HANG_GUARD) for body in bodies]
            refused = [call.exception(HANG_GUARD) for call in calls if call.exception(HANG_GUARD) is not None]
        for error in refused:
            assert isinstance(error, grpc.Call)
            details = dict(error.trailing_metadata() or ()).get("grpc-status-details-bin")
            assert details is not None, (error.code(), error.details())
            status = status_pb2.Status.FromString(details)
            assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details), status
        stored = svc.rows("SELECT count(*) FROM spans")[0][0]
        assert stored == 200 * (len(bodies) - len(refused))


def test_grpc_admits_twice_max_concurrent_requests_at_once_and_refuses_the_next_as_overloaded(db_path: Path) -> None:
    """`max_concurrent_requests` bounds each receiver's requests being processed; gRPC's receiver admits
    twice it (docs/configuration.md), so calls waiting on a held writer fill exactly that many slots."""
    with RunningService(service_settings(db_path, ingest={"max_concurrent_requests": 2})) as svc:
        bodies = [request([span()]).SerializeToString() for _ in range(5)]
        with grpc.insecure_channel(svc.grpc_target) as ch:
            export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            with WriterHold(svc.service.writer):
                admitted = [export.future(body, timeout=HANG_GUARD) for body in bodies[:4]]
                wait_until(
                    lambda: svc.metric("tailwatch_spans_received_total", transport="grpc") == 4,
                    "the four admitted calls to be received",
                )
                with pytest.raises(grpc.RpcError) as refused:
                    export(bodies[4], timeout=HANG_GUARD)
            assert [call.exception(timeout=HANG_GUARD) for call in admitted] == [None] * 4
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert "more than 4 OTLP/gRPC requests" in refused.value.details()  # type: ignore[attr-defined]
        assert svc.rows("SELECT count(*) FROM spans") == [(4,)]


def test_grpc_calls_that_never_half_close_are_answered_and_hold_no_slot(db_path: Path) -> None:
    """A unary call is dispatched on its request message, not on the client's half-close: a client that
    sends its request and never finishes the stream is answered, and holds nothing after."""
    with RunningService(service_settings(db_path, ingest={"max_concurrent_requests": 2})) as svc:
        body = request([span()]).SerializeToString()
        forever = threading.Event()

        def never_ending() -> Iterator[bytes]:
            yield body
            forever.wait(HANG_GUARD)  # the stream stays open past the test's calls, not for ever

        try:
            with grpc.insecure_channel(svc.grpc_target) as ch:
                hanging = ch.stream_unary(EXPORT, request_serializer=None, response_deserializer=None)
                for _ in range(8):  # one after another: twice the concurrent-call limit in all
                    assert hanging(never_ending(), timeout=HANG_GUARD) == b""
                export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
                assert export(body, timeout=HANG_GUARD) == b""
        finally:
            forever.set()
