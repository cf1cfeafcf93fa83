"""OTLP/gRPC: the real SDK exporter lands every span; each error class gets its OTLP status."""

from __future__ import annotations

import json
import threading
from collections import Counter

import grpc
import pytest
from builders import request, span
from conftest import RunningService, service_settings
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from waiting import HANG_GUARD, WriterHold, join, wait_until

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def raw_export(
    target: str, payload: bytes, timeout: float = 10
) -> tuple[ExportTraceServiceResponse, None] | tuple[None, grpc.RpcError]:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        try:
            return ExportTraceServiceResponse.FromString(call(payload, timeout=timeout)), None
        except grpc.RpcError as err:
            return None, err


def status_details(err: grpc.RpcError) -> status_pb2.Status | None:
    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    return None


def test_sdk_grpc_exporter_spans_all_land_in_the_spans_table(service: RunningService) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "chat-api", "tenant.id": "acme"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=service.grpc_target, insecure=True)))
    tracer = provider.get_tracer("tests")
    for i in range(120):
        with tracer.start_as_current_span("chat llama-3", attributes={"gen_ai.request.model": "llama-3", "i": i}):
            pass
    assert provider.force_flush(int(HANG_GUARD * 1000)), "the SDK exporter did not finish in time"
    provider.shutdown()

    rows = service.rows("SELECT name, service_name, kind, attributes, resource FROM spans ORDER BY attributes->>'i'")
    assert len(rows) == 120
    name, service_name, kind, attributes, resource = rows[0]
    assert (name, service_name, kind) == ("chat llama-3", "chat-api", "INTERNAL")
    assert json.loads(attributes)["gen_ai.request.model"] == "llama-3"
    assert json.loads(resource)["tenant.id"] == "acme"
    assert sorted(json.loads(r[3])["i"] for r in rows) == list(range(120))
    assert service.metric("tailwatch_spans_stored_total") == 120


def test_invalid_spans_get_partial_success_and_the_rest_are_stored(service: RunningService) -> None:
    payload = request([span(), span(trace_id=b"\x01" * 8), span(span_id=bytes(8)), span()]).SerializeToString()
    response, err = raw_export(service.grpc_target, payload)
    assert err is None and response is not None
    assert response.partial_success.rejected_spans == 2
    assert "invalid_trace_id" in response.partial_success.error_message
    assert "invalid_span_id" in response.partial_success.error_message
    assert service.rows("SELECT count(*) FROM spans") == [(2,)]
    assert service.metric("tailwatch_spans_rejected_total", reason="invalid_trace_id") == 1
    assert service.metric("tailwatch_spans_rejected_total", reason="invalid_span_id") == 1


def test_truncated_protobuf_is_invalid_argument_and_stores_nothing(service: RunningService) -> None:
    good = request([span() for _ in range(5)]).SerializeToString()
    _, err = raw_export(service.grpc_target, good[:-7])
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid OTLP protobuf" in err.details()
    assert service.rows("SELECT count(*) FROM spans") == [(0,)]
    assert (
        service.metric("tailwatch_export_requests_total", transport="grpc", signal="traces", outcome="malformed") == 1
    )


def test_empty_request_succeeds_with_nothing_stored(service: RunningService) -> None:
    response, err = raw_export(service.grpc_target, b"")
    assert err is None and response is not None and not response.HasField("partial_success")
    assert service.rows("SELECT count(*) FROM spans") == [(0,)]


def test_oversize_request_is_resource_exhausted_without_retry_info(db_path) -> None:
    with RunningService(service_settings(db_path, ingest={"max_request_bytes": 64 * 1024})) as svc:
        big = request([span(attributes={"blob": "x" * 1000}) for _ in range(100)]).SerializeToString()
        _, err = raw_export(svc.grpc_target, big)
        assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert status_details(err) is None
        assert svc.rows("SELECT count(*) FROM spans") == [(0,)]


def test_overload_is_unavailable_with_retry_info_and_nothing_is_lost(db_path) -> None:
    settings = service_settings(db_path, ingest={"max_inflight_bytes": 1024, "retry_after_seconds": 2})
    with RunningService(settings) as svc:
        first_payload = request([span() for _ in range(20)]).SerializeToString()
        first: list[object] = []
        sender = threading.Thread(target=lambda: first.append(raw_export(svc.grpc_target, first_payload)))
        with WriterHold(svc.service.writer) as hold:
            sender.start()
            # The first request holds the only in-flight slot while the writer is held.
            wait_until(
                lambda: svc.metric("tailwatch_spans_received_total", transport="grpc") == 20,
                "the first request's 20 spans to be received",
            )
            assert hold.held, "the writer hold ended before the overload could be tried"
            _, err = raw_export(svc.grpc_target, request([span()]).SerializeToString())
            assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE
            details = status_details(err)
            assert details is not None and details.code == grpc.StatusCode.UNAVAILABLE.value[0]
            retry = error_details_pb2.RetryInfo()
            assert details.details[0].Unpack(retry) and retry.retry_delay.seconds == 2
        join(sender, "the first request to be answered")
        assert first[0][1] is None  # type: ignore[index]
        assert svc.rows("SELECT count(*) FROM spans") == [(20,)]
        assert (
            svc.metric("tailwatch_export_requests_total", transport="grpc", signal="traces", outcome="overloaded") == 1
        )


def test_calls_grpc_has_not_yet_handed_over_when_the_service_stops_are_refused_as_retryable_not_cancelled(
    db_path,
) -> None:
    """gRPC core cancels, at stop, every call it has received but not yet handed to a handler, and
    under load the event loop lags behind arriving calls. CANCELLED is a status an exporter may take
    for its own doing; the service must answer those calls UNAVAILABLE with a retry hint instead."""
    with RunningService(service_settings(db_path)) as svc, grpc.insecure_channel(svc.grpc_target) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        call(request([span()]).SerializeToString(), timeout=HANG_GUARD)  # the connection is up before the stretch
        svc.busy_loop(0.5)  # the calls below arrive while no handler can take them
        pending = [call.future(request([span()]).SerializeToString(), timeout=HANG_GUARD) for _ in range(20)]
        stopped = svc.begin_shutdown()  # SIGTERM, queued behind the busy stretch
        errors = [p.exception(timeout=HANG_GUARD) for p in pending]
        stopped.result(timeout=HANG_GUARD)

    codes = Counter(err.code() if isinstance(err, grpc.RpcError) else err for err in errors)
    assert set(codes) <= {None, grpc.StatusCode.UNAVAILABLE}, f"not an ack or a retryable refusal: {codes}"
    stopping = [err for err in errors if isinstance(err, grpc.RpcError) and "stopping" in err.details()]
    assert stopping, "no call was waiting inside gRPC at the stop: the test did not reach the case it pins"
    details = status_details(stopping[0])
    retry = error_details_pb2.RetryInfo()
    assert details is not None and details.details[0].Unpack(retry)


@pytest.mark.parametrize("workers", [1])
def test_decoder_worker_processes_store_the_same_rows(db_path, workers: int) -> None:
    with RunningService(service_settings(db_path, ingest={"decode_workers": workers})) as svc:
        spans = [span(attributes={"i": i}) for i in range(50)]
        response, err = raw_export(svc.grpc_target, request(spans).SerializeToString(), timeout=60)
        assert err is None and response is not None
        assert svc.rows("SELECT count(*), count(DISTINCT span_id) FROM spans") == [(50, 50)]


def test_a_span_at_2_to_the_63_ns_is_a_partial_success_not_a_retry(service: RunningService) -> None:
    """The span storage cannot place is rejected alone: an UNAVAILABLE answer would have the exporter resend the
    good spans with it forever."""
    spans = [span(), span(start=2**63, end=2**63 + 5), span(attributes={"gen_ai.usage.input_tokens": float("inf")})]
    response, err = raw_export(service.grpc_target, request(spans).SerializeToString())
    assert err is None and response is not None
    assert response.partial_success.rejected_spans == 1
    assert "invalid_time" in response.partial_success.error_message
    assert service.rows("SELECT count(*), count(input_tokens) FROM spans") == [(2, 0)]
