"""OTLP/HTTP: SDK exporter and plain-HTTP JSON bodies land; each error class gets its status and body."""

from __future__ import annotations

import gzip
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest
from builders import T0, request, span
from conftest import RunningService, service_settings
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from waiting import HANG_GUARD, WriterHold, join, wait_until

PROTOBUF = "application/x-protobuf"


def post(
    url: str, body: bytes | Iterable[bytes], content_type: str, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type, **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def json_request(n: int = 3, trace_id: str = "5b8efff798038103d269b633813fc60c") -> bytes:
    spans = [
        {
            "traceId": trace_id,
            "spanId": f"{i + 1:016x}",
            "name": "chat",
            "kind": 3,
            "startTimeUnixNano": str(T0),
            "endTimeUnixNano": str(T0 + 1_000_000),
            "attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "812"}}],
        }
        for i in range(n)
    ]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


def test_sdk_http_exporter_spans_all_land(service: RunningService) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{service.http_url}/v1/traces")
    provider = TracerProvider(resource=Resource.create({"service.name": "gateway"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    for i in range(75):
        with tracer.start_as_current_span("litellm_request", attributes={"i": i}):
            pass
    assert provider.force_flush(int(HANG_GUARD * 1000)), "the SDK exporter did not finish in time"
    provider.shutdown()
    assert service.rows("SELECT count(*), min(service_name) FROM spans") == [(75, "gateway")]


def test_json_body_from_a_plain_http_client_lands_and_gets_a_json_answer(service: RunningService) -> None:
    status, headers, body = post(f"{service.http_url}/v1/traces", json_request(3), "application/json")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == {}
    rows = service.rows(
        "SELECT trace_id, span_id, attributes->>'gen_ai.usage.input_tokens' FROM spans ORDER BY span_id"
    )
    assert rows == [("5b8efff798038103d269b633813fc60c", f"{i + 1:016x}", "812") for i in range(3)]


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_a_span_at_2_to_the_63_ns_or_with_a_nan_token_count_loses_nothing_else(
    service: RunningService, encoding: str
) -> None:
    """Valid OTLP at the edges of its types: the bad span is rejected alone (not the whole request refused as
    retryable, which an exporter would resend forever), the NaN count is no value, every good span is stored."""
    spans = [
        span(),
        span(start=2**63, end=2**63 + 5),
        span(attributes={"gen_ai.request.model": "m", "gen_ai.usage.output_tokens": float("nan")}),
    ]
    body, content_type = request(spans).SerializeToString(), PROTOBUF
    if encoding == "json":
        edge = json.loads(json_request(3))
        good, late, nan = edge["resourceSpans"][0]["scopeSpans"][0]["spans"]
        late["startTimeUnixNano"], late["endTimeUnixNano"] = str(2**63), str(2**63 + 5)
        # JSON has no NaN: a string that parses to one is the edge an OTLP/JSON sender can reach.
        nan["attributes"] = [
            {"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
            {"key": "gen_ai.usage.output_tokens", "value": {"stringValue": "NaN"}},
        ]
        good["attributes"] = []
        body, content_type = json.dumps(edge).encode(), "application/json"
    status, _, answer = post(f"{service.http_url}/v1/traces", body, content_type)
    assert status == 200, answer
    text = answer.decode() if encoding == "json" else str(ExportTraceServiceResponse.FromString(answer))
    assert "invalid_time" in text
    assert service.rows("SELECT count(*), count(output_tokens), count(model) FROM spans") == [(2, 0, 1)]


def test_gzip_protobuf_body_lands_and_gets_a_protobuf_answer(service: RunningService) -> None:
    payload = gzip.compress(request([span() for _ in range(4)]).SerializeToString())
    status, headers, body = post(f"{service.http_url}/v1/traces", payload, PROTOBUF, **{"Content-Encoding": "gzip"})
    assert status == 200 and headers["Content-Type"] == PROTOBUF
    assert not ExportTraceServiceResponse.FromString(body).HasField("partial_success")
    assert service.rows("SELECT count(*) FROM spans") == [(4,)]


def test_bad_ids_in_json_are_a_partial_success(service: RunningService) -> None:
    status, _, body = post(f"{service.http_url}/v1/traces", json_request(2, trace_id="00" * 16), "application/json")
    assert status == 200
    answer = json.loads(body)["partialSuccess"]
    assert answer["rejectedSpans"] == "2" and "invalid_trace_id" in answer["errorMessage"]
    assert service.rows("SELECT count(*) FROM spans") == [(0,)]


@pytest.mark.parametrize(
    ("body", "content_type", "headers", "status"),
    [
        (b"{oops", "application/json", {}, 400),
        (b"\x0a\xff\xff", PROTOBUF, {}, 400),
        (b"not gzip at all", PROTOBUF, {"Content-Encoding": "gzip"}, 400),
        (gzip.compress(b"\x0a\x02")[:-6], PROTOBUF, {"Content-Encoding": "gzip"}, 400),
        (b"hello", "text/plain", {}, 415),
        (b"{}", "application/json", {"Content-Encoding": "br"}, 415),
    ],
    # Named ids: a test id made of the raw bytes cannot be passed back to pytest to run one case.
    ids=["bad-json", "bad-protobuf", "not-gzip", "truncated-gzip", "text-plain", "brotli"],
)
def test_bad_requests_get_their_status_and_an_rpc_status_body(
    service: RunningService, body: bytes, content_type: str, headers: dict[str, str], status: int
) -> None:
    got, got_headers, answer = post(f"{service.http_url}/v1/traces", body, content_type, **headers)
    assert got == status
    assert "Retry-After" not in got_headers
    if got_headers["Content-Type"].startswith(PROTOBUF):
        message = status_pb2.Status.FromString(answer).message
    else:
        message = json.loads(answer)["message"]
    assert message
    assert service.rows("SELECT count(*) FROM spans") == [(0,)]


def test_empty_body_is_a_success(service: RunningService) -> None:
    assert post(f"{service.http_url}/v1/traces", b"", PROTOBUF)[0] == 200


def test_oversize_and_gzip_bombs_are_413(db_path) -> None:
    with RunningService(service_settings(db_path, ingest={"max_request_bytes": 64 * 1024})) as svc:
        url = f"{svc.http_url}/v1/traces"
        big = request([span(attributes={"blob": "x" * 1000}) for _ in range(100)]).SerializeToString()
        assert post(url, big, PROTOBUF)[0] == 413
        bomb = gzip.compress(b"\x00" * (50 * 2**20))  # 50 MiB of zeros in ~50 KiB
        assert len(bomb) < 64 * 1024
        status, _, answer = post(url, bomb, PROTOBUF, **{"Content-Encoding": "gzip"})
        assert status == 413 and "inflates past" in status_pb2.Status.FromString(answer).message
        assert (
            svc.metric("tailwatch_export_requests_total", transport="http", signal="traces", outcome="too_large") == 2
        )
        # The receiver is still healthy afterwards.
        assert post(url, request([span()]).SerializeToString(), PROTOBUF)[0] == 200


def test_overload_is_503_with_retry_after(db_path) -> None:
    settings = service_settings(db_path, ingest={"max_inflight_bytes": 1024, "retry_after_seconds": 3})
    with RunningService(settings) as svc:
        url = f"{svc.http_url}/v1/traces"
        results: list[int] = []
        first = threading.Thread(target=lambda: results.append(post(url, json_request(5), "application/json")[0]))
        with WriterHold(svc.service.writer) as hold:
            first.start()
            wait_until(
                lambda: svc.metric("tailwatch_spans_received_total", transport="http") == 5,
                "the first request's 5 spans to be received",
            )
            assert hold.held, "the writer hold ended before the overload could be tried"
            status, headers, body = post(url, json_request(1), "application/json")
            assert status == 503 and headers["Retry-After"] == "3"
            assert json.loads(body)["code"] == 14  # UNAVAILABLE
        join(first, "the first request to be answered")
        assert results == [200]
        assert svc.rows("SELECT count(*) FROM spans") == [(5,)]


def test_a_chunked_body_without_content_length_is_413_once_it_passes_the_limit(db_path: Path) -> None:
    with RunningService(service_settings(db_path, ingest={"max_request_bytes": 1024})) as svc:
        url = f"{svc.http_url}/v1/traces"
        big = request([span(attributes={"blob": "x" * 1000}) for _ in range(3)]).SerializeToString()
        # An iterable body is sent chunked: the receiver learns its size only by reading it.
        status, headers, answer = post(url, iter([big[:2000], big[2000:]]), PROTOBUF)
        assert status == 413 and "Retry-After" not in headers
        assert status_pb2.Status.FromString(answer).message == "request body exceeds the 1024-byte limit"
        assert (
            svc.metric("tailwatch_export_requests_total", transport="http", signal="traces", outcome="too_large") == 1
        )
        small = request([span()]).SerializeToString()
        assert post(url, iter([small]), PROTOBUF)[0] == 200
        assert svc.rows("SELECT count(*) FROM spans") == [(1,)]


def evaluation_logs(n: int) -> bytes:
    """An OTLP/JSON logs request with `n` evaluation records of one span."""
    records = [
        {
            "timeUnixNano": str(T0),
            "eventName": "gen_ai.evaluation.result",
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b174",
            "attributes": [
                {"key": "gen_ai.evaluation.name", "value": {"stringValue": f"eval-{i}"}},
                {"key": "gen_ai.evaluation.score.value", "value": {"doubleValue": 0.5}},
            ],
        }
        for i in range(n)
    ]
    return json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]}).encode()


# Full in spans, or in bytes though its spans are few: one request's 5 decoded spans hold more than 1024 bytes,
# so it is taken alone and nothing more until it is committed.
@pytest.mark.parametrize("bound", [{"max_queued_spans": 5}, {"max_queued_bytes": 1024}], ids=["spans", "bytes"])
def test_a_full_storage_queue_is_503_with_retry_after_and_counts_the_refused_items_by_signal(
    db_path: Path, bound: dict[str, int]
) -> None:
    settings = service_settings(db_path, ingest={**bound, "retry_after_seconds": 3})
    with RunningService(settings) as svc:
        base = svc.http_url
        results: list[int] = []
        first = threading.Thread(
            target=lambda: results.append(post(f"{base}/v1/traces", json_request(5), "application/json")[0])
        )
        with WriterHold(svc.service.writer) as hold:
            first.start()
            wait_until(
                lambda: svc.metric("tailwatch_writer_queued_spans") == 5,
                "the first request's 5 spans to fill the writer's queue",
            )
            assert svc.metric("tailwatch_writer_queued_bytes") > 1024
            assert hold.held, "the writer hold ended before the full queue could be tried"
            for path, body, items in (("traces", json_request(2), 2), ("logs", evaluation_logs(3), 3)):
                status, headers, answer = post(f"{base}/v1/{path}", body, "application/json")
                assert (status, headers.get("Retry-After")) == (503, "3"), (path, answer)
                assert json.loads(answer)["code"] == 14  # UNAVAILABLE
                assert "storage queue is full" in json.loads(answer)["message"]
                refused_requests = svc.metric(
                    "tailwatch_export_requests_total", transport="http", signal=path, outcome="overloaded"
                )
                assert refused_requests == 1
                assert svc.metric("tailwatch_items_refused_total", signal=path, reason="overloaded") == items
        join(first, "the first request to be answered")
        assert results == [200]
        assert svc.rows("SELECT count(*) FROM spans") == [(5,)]
        assert svc.rows("SELECT count(*) FROM span_scores") == [(0,)]
        wait_until(lambda: svc.metric("tailwatch_writer_queued_bytes") == 0, "the committed batch's bytes released")
        assert (
            post(f"{base}/v1/traces", json_request(1, "6b8efff798038103d269b633813fc60c"), "application/json")[0] == 200
        )
        assert svc.rows("SELECT count(*) FROM spans") == [(6,)]
