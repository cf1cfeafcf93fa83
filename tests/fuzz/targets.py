"""The decoder entry points a request body reaches, as fuzz targets: traces, logs and metrics, each as protobuf,
OTLP/JSON and gzip-compressed protobuf, exactly as the receivers call them.

A target returns normally for every input the service answers with a defined status: a decoded request
(whatever it rejected is counted by reason in its `Decoded`), or an `ExportError` the receivers map to an
OTLP status (400 malformed, 413 too large). Anything else escaping is a bug: the request would be answered
503 with a traceback and retried forever."""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector import native_walk, otlp_json
from collector.decode import Decoded, Decoder, Encoding, decode_logs, decode_metrics, decode_traces
from collector.errors import MalformedPayload, PayloadTooLarge
from collector.http_receiver import gunzip
from collector.reasons import LogRejectReason, MetricRejectReason, SpanRejectReason

# The default ingest.max_request_bytes: a gzip body may inflate to this much.
INFLATE_LIMIT = 16 * 1024 * 1024

DECODERS: dict[str, Callable[[bytes, Encoding], Decoded]] = {
    "traces": decode_traces,
    "logs": decode_logs,
    "metrics": decode_metrics,
}


def _target(signal: str, encoding: str) -> Callable[[bytes], Decoded]:
    decode = DECODERS[signal]
    if encoding == "gzip":
        return lambda data: decode(gunzip(data, INFLATE_LIMIT), Encoding.PROTOBUF)
    return lambda data: decode(data, Encoding(encoding))


def same_decoding(payload: bytes, *, split_attributes: bool = False) -> Decoded:
    """Decode with the compiled walk and with the Python reference; they must agree on the batch, the
    scores and the rejections, or both refuse the request (MalformedPayload, raised again here)."""
    outcomes: list[Decoded | MalformedPayload] = []
    for decoder in (Decoder.PYTHON, Decoder.NATIVE):
        try:
            outcomes.append(
                decode_traces(payload, Encoding.PROTOBUF, decoder=decoder, split_attributes=split_attributes)
            )
        except MalformedPayload as exc:
            outcomes.append(exc)
    reference, native = outcomes
    if isinstance(native, MalformedPayload):
        # Two damaged encodings upb reads past and prost refuses (docs/decoder.md): a known field with the wrong
        # wire type (an unknown field to upb, protobuf's C++ rule) and an over-long or overflowing varint.
        stricter = any(why in str(native) for why in ("invalid wire type", "invalid varint"))
        assert isinstance(reference, MalformedPayload) or stricter, f"only the compiled one refused: {native}"
        raise native
    assert not isinstance(reference, MalformedPayload), f"only the reference refused it: {reference}"
    assert reference.spans is not None and native.spans is not None
    for name in reference.spans.column_names:
        assert native.spans[name].equals(reference.spans[name]), f"column {name} differs"
    assert native.scores.equals(reference.scores), "scores differ"
    assert native.rejections == reference.rejections, "rejections differ"
    return native


TARGETS: dict[str, Callable[[bytes], Decoded]] = {
    f"{signal}_{encoding}": _target(signal, encoding)
    for signal in DECODERS
    for encoding in ("protobuf", "json", "gzip")
}
# traces_protobuf runs the default decoder (the compiled one where it is built); these two add the Python
# reference alone and the two compared on every input. They start from traces_protobuf's corpus.
TARGETS["traces_reference"] = lambda data: decode_traces(data, Encoding.PROTOBUF, decoder=Decoder.PYTHON)
if native_walk.AVAILABLE:  # where cargo built it; tests/test_native_decoder.py fails CI if it did not
    TARGETS["traces_differential"] = same_decoding
CORPUS = {
    target: "traces_protobuf" if target in ("traces_reference", "traces_differential") else target for target in TARGETS
}


MESSAGES: dict[str, type[Message]] = {
    "traces": ExportTraceServiceRequest,
    "logs": ExportLogsServiceRequest,
    "metrics": ExportMetricsServiceRequest,
}
REASONS = {"traces": SpanRejectReason, "logs": LogRejectReason, "metrics": MetricRejectReason}
_POINTS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")


def items_sent(target: str, data: bytes) -> int | None:
    """How many spans, log records or data points the request carries, counted from the official messages
    rather than from the decoder; None where protobuf's own parser refuses what the decoder read."""
    signal, encoding = target.split("_", 1)
    message_type = MESSAGES[signal]
    try:
        if encoding == "json":
            message = otlp_json.parse(data, message_type)
        else:
            message = message_type.FromString(gunzip(data, INFLATE_LIMIT) if encoding == "gzip" else data)
    except (DecodeError, MalformedPayload, PayloadTooLarge):
        return None
    if isinstance(message, ExportTraceServiceRequest):
        return sum(len(s.spans) for r in message.resource_spans for s in r.scope_spans)
    if isinstance(message, ExportLogsServiceRequest):
        return sum(len(s.log_records) for r in message.resource_logs for s in r.scope_logs)
    assert isinstance(message, ExportMetricsServiceRequest)
    return sum(
        len(getattr(m, m.WhichOneof("data")).data_points)
        for r in message.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        if m.WhichOneof("data") in _POINTS
    )


def answer(target: str, data: bytes) -> str:
    """What the service would answer `data` with: 'ok' (rejections counted), or the refusal's kind."""
    try:
        decoded = TARGETS[target](data)
    except MalformedPayload:
        return "malformed"
    except PayloadTooLarge:
        return "too_large"
    # Counted by reason: every item sent is accepted, ignored or rejected with one of its signal's reasons
    # and an explanation. A decoder that drops an item without counting it fails here.
    signal = target.split("_", 1)[0]
    assert all(isinstance(reason, REASONS[signal]) for reason in decoded.rejections.counts), decoded.rejections
    assert set(decoded.rejections.examples) == {r for r, n in decoded.rejections.counts.items() if n}
    sent = items_sent(target, data)
    assert sent is None or decoded.received == sent, f"{sent} items sent, {decoded.received} accounted for"
    return "ok"
