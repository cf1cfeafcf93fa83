"""The one OTLP batch decoder: request bytes → validated, normalized canonical columns.

Pure and picklable: no I/O, no clock, no globals that change. The gRPC and HTTP receivers both call
`decode`, inline or in a decoder worker process, once per request.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any

import orjson
import pyarrow as pa
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector import otlp_json
from collector.anyvalue import attributes_dict
from collector.decode_metrics import metric_points, parse_metrics
from collector.engine_names import EngineNames
from collector.errors import MalformedPayload
from collector.model import MAX_TIME_NS, SCORE_BATCH_SCHEMA, SPAN_BATCH_SCHEMA, SPAN_KINDS, STATUS_CODES
from collector.normalize import FIELDS, NormalizeConfig, Plan, SpanBatch, build_plan, first_token_ms, normalize_batch
from collector.reasons import LogRejectReason, MetricUnjoined, Rejections, SpanRejectReason
from collector.scores import EVALUATION_EVENT, Score, from_evaluation, from_span_attributes
from collector.wire import TraceRequest, any_value

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)


class Encoding(StrEnum):
    PROTOBUF = "protobuf"
    JSON = "json"


class Signal(StrEnum):
    TRACES = "traces"
    LOGS = "logs"
    METRICS = "metrics"


@dataclass
class Decoded:
    """A decoded request: spans (traces), scores, or engine metric points to store, plus what was rejected."""

    signal: Signal
    spans: pa.Table | None
    scores: pa.Table
    rejections: Rejections
    ignored: int = 0  # valid items with nothing to store: logs that carry no evaluation, summary points
    metrics: pa.Table | None = None
    points: int = 0  # metric data points accepted (a histogram point is two rows of `metrics`)
    unjoined: Counter[MetricUnjoined] = field(default_factory=Counter)

    @property
    def items(self) -> int:
        """Spans, log records or metric data points that were accepted."""
        if self.spans is not None:
            return int(self.spans.num_rows)
        if self.signal is Signal.METRICS:
            return self.points + self.ignored
        return int(self.scores.num_rows) + self.ignored

    @property
    def received(self) -> int:
        return self.items + self.rejections.total

    @property
    def noun(self) -> str:
        return {Signal.TRACES: "span", Signal.LOGS: "log record", Signal.METRICS: "data point"}[self.signal]


@cache
def default_plan() -> Plan:
    return build_plan(NormalizeConfig())


def decode(
    signal: Signal, payload: bytes, encoding: Encoding, plan: Plan | None = None, names: EngineNames | None = None
) -> Decoded:
    """Decode one export request of any signal."""
    if signal is Signal.LOGS:
        return decode_logs(payload, encoding)
    if signal is Signal.METRICS:
        return decode_metrics(payload, encoding, plan, names)
    return decode_traces(payload, encoding, plan)


def decode_metrics(
    payload: bytes, encoding: Encoding, plan: Plan | None = None, names: EngineNames | None = None
) -> Decoded:
    """Decode one OTLP metrics export request into engine metric points."""
    if encoding is Encoding.JSON:
        request = otlp_json.parse(payload, ExportMetricsServiceRequest)
    else:
        request = parse_metrics(payload)
    points, ignored = metric_points(request, plan or default_plan(), names or EngineNames())
    return Decoded(
        Signal.METRICS,
        None,
        score_table([]),
        points.rejections,
        ignored,
        metrics=points.table(),
        points=points.points,
        unjoined=points.unjoined,
    )


def _parse(payload: bytes, encoding: Encoding, message: type[Message], wire: type[Message]) -> Any:
    if encoding is Encoding.JSON:
        # OTLP/JSON is re-encoded once so that both encodings share the one walk below.
        payload = otlp_json.parse(payload, message).SerializeToString()
    try:
        return wire.FromString(payload)
    except DecodeError as exc:
        raise MalformedPayload(f"not a valid OTLP protobuf {message.DESCRIPTOR.name}: {exc}") from None


def decode_traces(payload: bytes, encoding: Encoding, plan: Plan | None = None) -> Decoded:
    """Decode, validate and normalize one OTLP trace export request."""
    request = _parse(payload, encoding, ExportTraceServiceRequest, TraceRequest)
    try:
        return _spans(request, plan or default_plan())
    except (DecodeError, UnicodeDecodeError, IndexError) as exc:
        # Attribute values are decoded lazily from their bytes (collector.wire), so a corrupt value
        # surfaces here rather than in the parse; the whole request is malformed either way.
        raise MalformedPayload(
            f"not a valid OTLP protobuf ExportTraceServiceRequest: bad attribute value ({exc})"
        ) from None


def _spans(request: Any, plan: Plan) -> Decoded:
    rejections = Rejections()
    trace_ids: list[str] = []
    span_ids: list[str] = []
    parents: list[str | None] = []
    names: list[str] = []
    kinds: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    durations: list[float] = []
    status_codes: list[str] = []
    status_messages: list[str | None] = []
    services: list[str | None] = []
    scopes: list[str | None] = []
    attributes: list[str] = []
    resources: list[str] = []
    events_col: list[str | None] = []
    links_col: list[str | None] = []
    span_attrs: list[dict[str, Any]] = []
    resource_attrs: list[dict[str, Any]] = []
    resource_of: list[int] = []
    first_tokens: list[float | None] = []
    scores: list[Score] = []
    dumps = orjson.dumps
    n_kinds = len(SPAN_KINDS)

    for rs in request.resource_spans:
        resource = attributes_dict(Resource.FromString(rs.resource).attributes)
        resource_json = dumps(resource).decode()
        service = resource.get("service.name")
        service = service if isinstance(service, str) else None
        resource_index = len(resource_attrs)
        resource_attrs.append(resource)
        for ss in rs.scope_spans:
            scope = InstrumentationScope.FromString(ss.scope).name or None
            for s in ss.spans:
                tid = s.trace_id
                sid = s.span_id
                if len(tid) != 16 or tid == _ZERO_TRACE:
                    rejections.add(SpanRejectReason.INVALID_TRACE_ID, _id_problem("trace", tid, 16))
                    continue
                if len(sid) != 8 or sid == _ZERO_SPAN:
                    rejections.add(SpanRejectReason.INVALID_SPAN_ID, _id_problem("span", sid, 8))
                    continue
                parent = s.parent_span_id
                if parent and len(parent) != 8:
                    rejections.add(
                        SpanRejectReason.INVALID_PARENT_SPAN_ID,
                        f"parent span ids must be 64 bit, received {len(parent) * 8} bits",
                    )
                    continue
                start = s.start_time_unix_nano
                end = s.end_time_unix_nano
                if start == 0:
                    rejections.add(SpanRejectReason.MISSING_START_TIME, "start_time_unix_nano is 0")
                    continue
                if start > MAX_TIME_NS or end > MAX_TIME_NS:
                    rejections.add(SpanRejectReason.INVALID_TIME, "span times must be below 2^63 ns")
                    continue
                if end < start:
                    rejections.add(
                        SpanRejectReason.END_BEFORE_START,
                        f"end_time_unix_nano is {start - end} ns before start_time_unix_nano",
                    )
                    continue

                attrs = {k: any_value(v) for k, v in s.attributes.items()}
                attrs_json = dumps(attrs)
                trace_hex = tid.hex()
                span_hex = sid.hex()
                kind = s.kind
                kind_name = SPAN_KINDS[kind] if 0 <= kind < n_kinds else "UNSPECIFIED"
                events = _events(s.events) if s.events else None
                links = _links(s.links) if s.links else None

                score_trace, score_span = trace_hex, span_hex
                if links is not None and len(links) == 1 and attrs.get("openinference.span.kind") == "EVALUATOR":
                    # OpenInference feedback arrives on a carrier span linked to the span it judges.
                    score_trace, score_span = links[0]["trace_id"], links[0]["span_id"]
                scores.extend(from_span_attributes(attrs, attrs_json, score_trace, score_span, end))
                if events is not None:
                    for event_name, event_time, event_attrs in events:
                        if event_name == EVALUATION_EVENT:
                            # An event time storage cannot hold is as good as none: the score is the span's.
                            at = event_time if 0 < event_time <= MAX_TIME_NS else end
                            score = from_evaluation(event_attrs, trace_hex, span_hex, "event", at)
                            if score is not None:
                                scores.append(score)

                trace_ids.append(trace_hex)
                span_ids.append(span_hex)
                parents.append(parent.hex() if parent and parent != _ZERO_SPAN else None)
                names.append(s.name)
                kinds.append(kind_name)
                starts.append(start)
                ends.append(end)
                durations.append((end - start) / 1e6)
                status = s.status
                code = status.code
                status_codes.append(STATUS_CODES[code] if 0 <= code < 3 else "UNSET")
                status_messages.append(status.message or None)
                services.append(service)
                scopes.append(scope)
                attributes.append(attrs_json.decode())
                resources.append(resource_json)
                events_col.append(
                    dumps([{"name": n, "time_unix_nano": t, "attributes": a} for n, t, a in events]).decode()
                    if events is not None
                    else None
                )
                links_col.append(dumps(links).decode() if links is not None else None)
                span_attrs.append(attrs)
                resource_of.append(resource_index)
                first_tokens.append(
                    first_token_ms(attrs, events, start)
                    if events is not None or "langfuse.observation.completion_start_time" in attrs
                    else None
                )

    names_arr = pa.array(names, pa.string())
    kinds_arr = pa.array(kinds, pa.string())
    durations_arr = pa.array(durations, pa.float64())
    llm, is_llm, roles = normalize_batch(
        plan,
        SpanBatch(span_attrs, resource_attrs, resource_of, names_arr, kinds_arr, durations_arr, first_tokens),
    )
    table = pa.Table.from_arrays(
        [
            pa.array(trace_ids, pa.string()),
            pa.array(span_ids, pa.string()),
            pa.array(parents, pa.string()),
            names_arr,
            kinds_arr,
            pa.array(starts, pa.int64()).cast(pa.timestamp("ns")),
            pa.array(ends, pa.int64()).cast(pa.timestamp("ns")),
            durations_arr,
            pa.array(status_codes, pa.string()),
            pa.array(status_messages, pa.string()),
            pa.array(services, pa.string()),
            pa.array(scopes, pa.string()),
            pa.array(attributes, pa.string()),
            pa.array(resources, pa.string()),
            pa.array(events_col, pa.string()),
            pa.array(links_col, pa.string()),
            is_llm,
            roles,
            *(llm[name] for name in FIELDS),
        ],
        schema=SPAN_BATCH_SCHEMA,
    )
    return Decoded(Signal.TRACES, table, score_table(scores), rejections)


def score_table(scores: list[Score]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array([s.trace_id for s in scores], pa.string()),
            pa.array([s.span_id for s in scores], pa.string()),
            pa.array([s.name for s in scores], pa.string()),
            pa.array([s.score for s in scores], pa.float64()),
            pa.array([s.label for s in scores], pa.string()),
            pa.array([s.explanation for s in scores], pa.string()),
            pa.array([s.source for s in scores], pa.string()),
            pa.array([s.observed_ns for s in scores], pa.int64()).cast(pa.timestamp("ns")),
        ],
        schema=SCORE_BATCH_SCHEMA,
    )


def decode_logs(payload: bytes, encoding: Encoding) -> Decoded:
    """Decode one OTLP logs export request, keeping the `gen_ai.evaluation.result` events as scores."""
    request = _parse(payload, encoding, ExportLogsServiceRequest, ExportLogsServiceRequest)
    rejections = Rejections()
    scores: list[Score] = []
    ignored = 0
    for rl in request.resource_logs:
        for sl in rl.scope_logs:
            for record in sl.log_records:
                attrs = attributes_dict(record.attributes)
                event_name = record.event_name or attrs.get("event.name")
                if event_name != EVALUATION_EVENT:
                    ignored += 1
                    continue
                tid, sid = record.trace_id, record.span_id
                if len(tid) != 16 or tid == _ZERO_TRACE or len(sid) != 8 or sid == _ZERO_SPAN:
                    rejections.add(
                        LogRejectReason.MISSING_SPAN_CONTEXT,
                        "an evaluation record needs the trace_id and span_id of the span it judges",
                    )
                    continue
                observed = record.time_unix_nano or record.observed_time_unix_nano
                if observed > MAX_TIME_NS:
                    rejections.add(LogRejectReason.INVALID_TIME, "an evaluation record's time must be below 2^63 ns")
                    continue
                score = from_evaluation(attrs, tid.hex(), sid.hex(), "log", observed)
                if score is None:
                    rejections.add(LogRejectReason.INVALID_EVALUATION, "gen_ai.evaluation.name is required")
                    continue
                scores.append(score)
    return Decoded(Signal.LOGS, None, score_table(scores), rejections, ignored)


def _id_problem(what: str, value: bytes, size: int) -> str:
    if len(value) == size:
        return f"{what} ids must not be all zeros"
    return f"{what} ids must be {size * 8} bit, received {len(value) * 8} bits"


def _events(raw_events: Any) -> list[tuple[str, int, dict[str, Any]]]:
    events = [Span.Event.FromString(raw) for raw in raw_events]
    return [(e.name, e.time_unix_nano, attributes_dict(e.attributes)) for e in events]


def _links(raw_links: Any) -> list[dict[str, Any]]:
    links = [Span.Link.FromString(raw) for raw in raw_links]
    return [
        {"trace_id": k.trace_id.hex(), "span_id": k.span_id.hex(), "attributes": attributes_dict(k.attributes)}
        for k in links
    ]
