"""The shared decoder: validation by reason, value conversion, OTLP/JSON ids, malformed input."""

from __future__ import annotations

import base64
import json
import math

import pytest
from builders import T0, kvs, request, span
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span

from collector.decode import Decoded, Encoding, decode_logs, decode_traces
from collector.errors import MalformedPayload
from collector.reasons import LogRejectReason, SpanRejectReason

pytestmark = pytest.mark.usefixtures("each_decoder")


def decode(req_bytes: bytes, encoding: Encoding = Encoding.PROTOBUF) -> Decoded:
    return decode_traces(req_bytes, encoding)


def test_valid_span_becomes_one_row_with_canonical_columns() -> None:
    s = span(
        "chat llama",
        trace_id=bytes(range(1, 17)),
        span_id=bytes(range(1, 9)),
        parent_span_id=b"\x09" * 8,
        kind=Span.SPAN_KIND_CLIENT,
        duration_ns=1_500_000,
        status_code=2,
        status_message="boom",
        attributes={
            "s": "x",
            "i": 7,
            "d": 0.5,
            "b": True,
            "arr": [1, "a"],
            "kv": {"k": 1},
            "raw": b"\x00\xff",
        },
    )
    out = decode(request([s], resource={"tenant.id": "acme"}).SerializeToString())
    row = out.spans.to_pylist()[0]
    assert out.rejections.total == 0
    assert row["trace_id"] == bytes(range(1, 17)).hex()
    assert row["span_id"] == "0102030405060708"
    assert row["parent_span_id"] == "0909090909090909"
    assert row["kind"] == "CLIENT"
    assert row["status_code"] == "ERROR"
    assert row["status_message"] == "boom"
    assert row["duration_ms"] == 1.5
    assert row["service_name"] == "test-svc"
    assert row["scope_name"] == "tests"
    assert json.loads(row["attributes"]) == {
        "s": "x",
        "i": 7,
        "d": 0.5,
        "b": True,
        "arr": [1, "a"],
        "kv": {"k": 1},
        "raw": base64.b64encode(b"\x00\xff").decode(),
    }
    assert json.loads(row["resource"]) == {"service.name": "test-svc", "tenant.id": "acme"}


@pytest.mark.parametrize(
    ("bad", "reason", "explanation"),
    [
        ({"trace_id": b"\x01" * 8}, SpanRejectReason.INVALID_TRACE_ID, "received 64 bits"),
        ({"trace_id": bytes(16)}, SpanRejectReason.INVALID_TRACE_ID, "all zeros"),
        ({"span_id": b"\x01" * 4}, SpanRejectReason.INVALID_SPAN_ID, "received 32 bits"),
        ({"span_id": bytes(8)}, SpanRejectReason.INVALID_SPAN_ID, "all zeros"),
        ({"parent_span_id": b"\x01" * 3}, SpanRejectReason.INVALID_PARENT_SPAN_ID, "received 24 bits"),
        ({"start": 0, "end": 5}, SpanRejectReason.MISSING_START_TIME, "is 0"),
        ({"start": T0, "end": T0 - 10}, SpanRejectReason.END_BEFORE_START, "10 ns before"),
        # uint64 times storage cannot hold: one flipped bit away from a real timestamp.
        ({"start": T0 | 1 << 63, "end": T0 | 1 << 63}, SpanRejectReason.INVALID_TIME, "below 2^63"),
        ({"start": T0, "end": T0 | 1 << 63}, SpanRejectReason.INVALID_TIME, "below 2^63"),
        ({"start": 2**64 - 1, "end": 2**64 - 1}, SpanRejectReason.INVALID_TIME, "below 2^63"),
    ],
)
def test_invalid_span_is_rejected_by_reason_and_the_rest_kept(
    bad: dict, reason: SpanRejectReason, explanation: str
) -> None:
    out = decode(request([span(), span(**bad), span()]).SerializeToString())
    assert out.spans.num_rows == 2
    assert dict(out.rejections.counts) == {reason: 1}
    message = out.rejections.message()
    assert reason.value in message and explanation in message


def test_the_last_representable_time_is_kept_and_the_next_one_rejected() -> None:
    last = 2**63 - 1
    out = decode(request([span(start=last - 5, end=last), span(start=last - 5, end=last + 1)]).SerializeToString())
    assert out.spans.num_rows == 1 and dict(out.rejections.counts) == {SpanRejectReason.INVALID_TIME: 1}


def test_a_json_span_at_2_to_the_63_ns_is_rejected_alone() -> None:
    out = decode(_json_body(startTimeUnixNano=str(2**63), endTimeUnixNano=str(2**63 + 5)), Encoding.JSON)
    assert out.spans.num_rows == 0 and dict(out.rejections.counts) == {SpanRejectReason.INVALID_TIME: 1}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e300, "nan", "1e400", 2**62 * 4.0])
def test_a_token_count_or_latency_no_number_can_hold_is_no_value_and_the_span_is_kept(value: object) -> None:
    attrs = {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": value, "gen_ai.usage.output_tokens": value,
             "gen_ai.latency.time_to_first_token": value, "gen_ai.server.time_per_output_token": value}  # fmt: skip
    out = decode(request([span(), span(attributes=attrs)]).SerializeToString())
    assert out.spans.num_rows == 2 and out.rejections.total == 0
    row = out.spans.to_pylist()[1]
    assert (row["model"], row["input_tokens"], row["output_tokens"]) == ("m", None, None)
    # A latency is a float: a huge finite one is kept (SQL can see it is absurd), never NaN or infinite.
    assert all(v is None or math.isfinite(v) for v in (row["ttft_ms"], row["tpot_ms"], row["e2e_ms"]))
    assert "gen_ai.usage.input_tokens" in json.loads(row["attributes"])  # the value itself stays for SQL


def test_empty_request_decodes_to_nothing() -> None:
    out = decode(b"")
    assert out.spans.num_rows == 0 and out.rejections.total == 0


@pytest.mark.parametrize("payload", [b"\x0a\xff\xff\xff", b"\xff" * 64, b"\x0a\x05abc"])
def test_malformed_protobuf_raises(payload: bytes) -> None:
    with pytest.raises(MalformedPayload, match="not a valid OTLP protobuf"):
        decode(payload)


def test_truncated_protobuf_raises() -> None:
    good = request([span() for _ in range(3)]).SerializeToString()
    with pytest.raises(MalformedPayload):
        decode(good[: len(good) // 2])


def _json_body(**span_fields: object) -> bytes:
    s = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "op",
        "kind": 3,
        "startTimeUnixNano": str(T0),
        "endTimeUnixNano": str(T0 + 2_000_000),
        "attributes": [
            {"key": "n", "value": {"intValue": "812"}},
            {"key": "f", "value": {"doubleValue": 0.25}},
        ],
        "links": [{"traceId": "00000000000000000000000000000001", "spanId": "0000000000000002"}],
        **span_fields,
    }
    body = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [s]}]}]}
    return json.dumps(body).encode()


def test_otlp_json_uses_hex_ids_string_int64_and_int_enums() -> None:
    row = decode(_json_body(), Encoding.JSON).spans.to_pylist()[0]
    assert row["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert row["span_id"] == "eee19b7ec3c1b174"
    assert row["kind"] == "CLIENT"
    assert row["duration_ms"] == 2.0
    assert json.loads(row["attributes"]) == {"n": 812, "f": 0.25}
    assert json.loads(row["links"]) == [
        {"trace_id": "00000000000000000000000000000001", "span_id": "0000000000000002", "attributes": {}}
    ]


def test_otlp_json_wrong_length_id_is_a_span_rejection_not_a_malformed_request() -> None:
    out = decode(_json_body(traceId="5b8e"), Encoding.JSON)
    assert out.spans.num_rows == 0
    assert dict(out.rejections.counts) == {SpanRejectReason.INVALID_TRACE_ID: 1}


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{not json", "invalid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (_json_body(traceId="zz" * 16), "not hex"),
        (_json_body(startTimeUnixNano="soon"), "not a valid OTLP/JSON"),
        (b'{"resourceSpans": 3}', "must be a JSON array"),
    ],
)
def test_malformed_json_raises_with_the_reason(body: bytes, match: str) -> None:
    with pytest.raises(MalformedPayload, match=match):
        decode(body, Encoding.JSON)


def test_the_partial_success_message_gives_each_ids_expected_and_received_bits() -> None:
    out = decode(request([span(trace_id=b"\x01" * 8), span(span_id=b"\x01" * 4), span()]).SerializeToString())
    assert out.rejections.message() == (
        "rejected 2 span(s): 1 invalid_span_id (span ids must be 64 bit, received 32 bits); "
        "1 invalid_trace_id (trace ids must be 128 bit, received 64 bits)"
    )


def test_span_events_are_stored_as_json_with_name_time_and_attributes() -> None:
    s = span()
    event = s.events.add(name="gen_ai.content.completion", time_unix_nano=T0 + 5)
    event.attributes.extend(kvs({"gen_ai.completion": "hi", "n": 2}))
    s.events.add(name="bare", time_unix_nano=T0 + 7)
    row = decode(request([s]).SerializeToString()).spans.to_pylist()[0]
    assert json.loads(row["events"]) == [
        {
            "name": "gen_ai.content.completion",
            "time_unix_nano": T0 + 5,
            "attributes": {"gen_ai.completion": "hi", "n": 2},
        },
        {"name": "bare", "time_unix_nano": T0 + 7, "attributes": {}},
    ]


TRACE = bytes(range(1, 17))
SPAN = bytes(range(1, 9))


def evaluation(name: str, value: float, *, trace_id: bytes = TRACE, span_id: bytes = SPAN) -> LogRecord:
    record = LogRecord(time_unix_nano=T0, event_name="gen_ai.evaluation.result", trace_id=trace_id, span_id=span_id)
    record.attributes.extend(kvs({"gen_ai.evaluation.name": name, "gen_ai.evaluation.score.value": value}))
    return record


def logs_request(*records: LogRecord) -> bytes:
    req = ExportLogsServiceRequest()
    req.resource_logs.add().scope_logs.add().log_records.extend(records)
    return req.SerializeToString()


@pytest.mark.parametrize(
    "context",
    [{"trace_id": bytes(16)}, {"trace_id": TRACE[:8]}, {"span_id": bytes(8)}, {"span_id": SPAN[:4]}, {"trace_id": b""}],
    ids=["zero-trace-id", "short-trace-id", "zero-span-id", "short-span-id", "no-trace-id"],
)
def test_an_evaluation_log_record_without_a_valid_span_context_is_rejected(context: dict[str, bytes]) -> None:
    out = decode_logs(logs_request(evaluation("relevance", 0.5, **context)), Encoding.PROTOBUF)
    assert out.scores.num_rows == 0
    assert dict(out.rejections.counts) == {LogRejectReason.MISSING_SPAN_CONTEXT: 1}


def test_an_evaluation_log_record_at_2_to_the_63_ns_is_rejected_alone() -> None:
    late = evaluation("relevance", 0.5)
    late.time_unix_nano = 2**63
    out = decode_logs(logs_request(late, evaluation("toxicity", 0.2)), Encoding.PROTOBUF)
    assert out.scores.column("name").to_pylist() == ["toxicity"]
    assert dict(out.rejections.counts) == {LogRejectReason.INVALID_TIME: 1}


def test_an_evaluation_event_at_2_to_the_63_ns_scores_at_the_spans_end() -> None:
    s = span(duration_ns=1_000)
    event = s.events.add(name="gen_ai.evaluation.result", time_unix_nano=2**63)
    event.attributes.extend(kvs({"gen_ai.evaluation.name": "relevance", "gen_ai.evaluation.score.value": 0.5}))
    out = decode(request([s]).SerializeToString())
    assert out.scores.num_rows == 1 and out.rejections.total == 0
    assert out.scores.column("observed_at").cast("int64").to_pylist() == [T0 + 1_000]


def test_a_rejected_log_record_does_not_stop_the_records_after_it_in_its_scope() -> None:
    ordinary = LogRecord(time_unix_nano=T0)
    ordinary.body.string_value = "an ordinary log line"
    payload = logs_request(
        evaluation("relevance", 0.1, trace_id=bytes(16)),
        evaluation("toxicity", 0.2),
        ordinary,
        evaluation("groundedness", 0.3, span_id=b""),
        evaluation("coherence", 0.4),
    )
    out = decode_logs(payload, Encoding.PROTOBUF)
    assert [(r["name"], r["score"], r["span_id"]) for r in out.scores.to_pylist()] == [
        ("toxicity", 0.2, SPAN.hex()),
        ("coherence", 0.4, SPAN.hex()),
    ]
    assert dict(out.rejections.counts) == {LogRejectReason.MISSING_SPAN_CONTEXT: 2}
    assert (out.ignored, out.items, out.received) == (1, 3, 5)


def test_an_attribute_carrying_a_field_newer_than_its_key_and_value_is_kept() -> None:
    # OTLP added KeyValue.key_strindex (for profiles); a span attribute that sets it must not vanish.
    s = span()
    s.attributes.append(KeyValue(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=7), key_strindex=5))
    spans = decode(request([s]).SerializeToString()).spans
    assert spans is not None
    assert json.loads(spans["attributes"][0].as_py()) == {"gen_ai.usage.input_tokens": 7}
    assert spans["input_tokens"].to_pylist() == [7]


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field, written by hand so that a message field can be sent twice."""
    length, n = bytearray(), len(payload)
    while n >= 0x80:
        length.append(n & 0x7F | 0x80)
        n >>= 7
    length.append(n)
    return bytes([number << 3 | 2, *length]) + payload


def test_a_resource_or_scope_sent_twice_is_merged_as_protobuf_merges_it() -> None:
    # Protobuf's rule for a message field met twice: the copies merge (a later copy's unset name
    # leaves the first one's, lists join). The reference walk once took the last copy whole.
    scope_spans = ScopeSpans(scope=InstrumentationScope(name="vllm.tracing.otel"), spans=[span()])
    later_scope = ScopeSpans(scope=InstrumentationScope(version="0.11"))
    resource_spans = (
        _field(1, Resource(attributes=kvs({"service.name": "vllm-llama8b"})).SerializeToString())
        + _field(1, Resource(attributes=kvs({"tenant.id": "acme"})).SerializeToString())
        + _field(2, scope_spans.SerializeToString() + later_scope.SerializeToString())
    )
    spans = decode(_field(1, resource_spans)).spans
    assert spans is not None
    assert spans["scope_name"].to_pylist() == ["vllm.tracing.otel"]
    assert spans["service_name"].to_pylist() == ["vllm-llama8b"]
    assert json.loads(spans["resource"][0].as_py()) == {"service.name": "vllm-llama8b", "tenant.id": "acme"}


def test_a_token_count_beyond_exact_floats_is_stored_and_its_ratios_computed() -> None:
    # 2^53 + 1 has no exact float: the per-token time and cache ratio use the nearest one, the count stays exact.
    big = 2**53 + 1
    attributes = {
        "gen_ai.usage.input_tokens": big,
        "gen_ai.usage.cache_read.input_tokens": big,
        "gen_ai.usage.output_tokens": big,
        "gen_ai.latency.time_to_first_token": 0.1,
    }
    spans = decode(request([span(attributes=attributes)]).SerializeToString()).spans
    assert spans is not None
    assert spans["input_tokens"].to_pylist() == [big]
    assert spans["cache_hit_ratio"].to_pylist() == [1.0]
    assert spans["tpot_ms"][0].is_valid
