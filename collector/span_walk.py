"""The walk over one trace export request: validation, the stored span columns, the gathered keys.

Two implementations produce the same `Walked`: this one, in Python, is the reference and the fallback
where no Rust toolchain built the compiled one (native/, loaded by collector/native_walk.py). A
differential property test holds them together (tests/test_native_decoder.py). Everything after the
walk (normalization, the final batch) is shared: collector/decode.py. Scores and first-token times from
events are read by both (collector/span_scores.py is the reference, native/src/scores.rs the compiled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector import span_scores
from collector.anyvalue import attributes_dict
from collector.errors import MalformedPayload
from collector.normalize import KeyValues, gather
from collector.reasons import Rejections, SpanRejectReason
from collector.wire import TraceRequest, any_value
from model.columns import MAX_TIME_NS, SPAN_KINDS, STATUS_CODES

ZERO_TRACE = bytes(16)
ZERO_SPAN = bytes(8)

# The walk's span columns, in order: the stored columns a span carries itself, then the index of its
# resource among the request's resources (for the per-resource gathered keys). `left_out` holds the
# attributes the walk was asked to leave out of `attributes` (model/attribute_split.py) that hold a
# value, as a JSON object of their own; null when a span has none of them.
WALK_SCHEMA = pa.schema(
    [
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("parent_span_id", pa.string()),
        ("name", pa.string()),
        ("kind", pa.string()),
        ("start_time", pa.timestamp("ns")),
        ("end_time", pa.timestamp("ns")),
        ("duration_ms", pa.float64()),
        ("status_code", pa.string()),
        ("status_message", pa.string()),
        ("service_name", pa.string()),
        ("scope_name", pa.string()),
        ("attributes", pa.string()),
        ("left_out", pa.string()),
        ("resource", pa.string()),
        ("events", pa.string()),
        ("links", pa.string()),
        ("resource_index", pa.int32()),
    ]
)


@dataclass
class Walked:
    """One request after the walk: accepted spans' columns, the gathered keys, and what was rejected."""

    spans: pa.RecordBatch  # WALK_SCHEMA
    span_values: dict[str, KeyValues]
    resource_values: dict[str, KeyValues]
    rejections: Rejections
    scores: pa.Table  # SCORE_BATCH_SCHEMA, in row order
    first_tokens: pa.Array  # float64 a row: the first-token time its events give, if any


def malformed(detail: object) -> MalformedPayload:
    return MalformedPayload(f"not a valid OTLP protobuf ExportTraceServiceRequest: {detail}")


def walk(
    payload: bytes, span_keys: tuple[str, ...], resource_keys: tuple[str, ...], left_out: tuple[str, ...] = ()
) -> Walked:
    """Walk one serialized ExportTraceServiceRequest (the reference implementation)."""
    try:
        # The walk below reads a cheaper wire-compatible schema (collector.wire) that leaves fields it
        # skips unchecked; parsing with the official messages first refuses exactly what the compiled
        # decoder's official messages refuse (e.g. invalid UTF-8 in a trace_state).
        official = ExportTraceServiceRequest.FromString(payload)
        request: Any = TraceRequest.FromString(payload)
        return _walk(request, official, span_keys, resource_keys, frozenset(left_out))
    except (DecodeError, UnicodeDecodeError, IndexError) as exc:
        raise malformed(exc) from None


def _walk(
    request: Any,
    official: ExportTraceServiceRequest,
    span_keys: tuple[str, ...],
    resource_keys: tuple[str, ...],
    left_out: frozenset[str],
) -> Walked:
    rejections = Rejections()
    columns: list[list[Any]] = [[] for _ in WALK_SCHEMA]
    (
        trace_ids,
        span_ids,
        parents,
        names,
        kinds,
        starts,
        ends,
        durations,
        status_codes,
        status_messages,
        services,
        scopes,
        attributes,
        left_out_col,
        resources,
        events_col,
        links_col,
        resource_of,
    ) = columns
    span_attrs: list[dict[str, Any]] = []
    resource_attrs: list[dict[str, Any]] = []
    dumps = orjson.dumps
    sort_keys = orjson.OPT_SORT_KEYS
    n_kinds = len(SPAN_KINDS)

    for resource_index, (rs, official_rs) in enumerate(
        zip(request.resource_spans, official.resource_spans, strict=True)
    ):
        # From the official messages: a resource or scope sent twice is merged, protobuf's rule and prost's.
        resource = attributes_dict(official_rs.resource.attributes)
        resource_json = dumps(resource).decode()
        service = resource.get("service.name")
        service = service if isinstance(service, str) else None
        resource_attrs.append(resource)
        for ss, official_ss in zip(rs.scope_spans, official_rs.scope_spans, strict=True):
            scope = official_ss.scope.name or None
            for s, official_span in zip(ss.spans, official_ss.spans, strict=True):
                if not _accepted(s, rejections):
                    continue
                start, end = s.start_time_unix_nano, s.end_time_unix_nano
                attrs = {k: any_value(v) for k, v in s.attributes.items()}
                if len(attrs) < len(official_span.attributes):
                    # Repeated keys, or a KeyValue with a field the wire map's entry cannot hold (OTLP's newer
                    # key_strindex, say), which upb drops from the map: read this span the official way.
                    attrs = attributes_dict(official_span.attributes)
                kind = s.kind
                trace_ids.append(s.trace_id.hex())
                span_ids.append(s.span_id.hex())
                parent = s.parent_span_id
                parents.append(parent.hex() if parent and parent != ZERO_SPAN else None)
                names.append(s.name)
                kinds.append(SPAN_KINDS[kind] if 0 <= kind < n_kinds else "UNSPECIFIED")
                starts.append(start)
                ends.append(end)
                durations.append((end - start) / 1e6)
                status = s.status
                code = status.code
                status_codes.append(STATUS_CODES[code] if 0 <= code < 3 else "UNSET")
                status_messages.append(status.message or None)
                services.append(service)
                scopes.append(scope)
                # Sorted, so that equal attribute sets are equal text whatever order they were sent in.
                # A key without a value is not gathered, so the split could not tell it was here: it stays.
                out = {k for k in left_out.intersection(attrs) if attrs[k] is not None} if left_out else None
                if out:
                    attributes.append(
                        dumps({k: v for k, v in attrs.items() if k not in out}, option=sort_keys).decode()
                    )
                    left_out_col.append(dumps({k: attrs[k] for k in out}, option=sort_keys).decode())
                else:
                    attributes.append(dumps(attrs, option=sort_keys).decode())
                    left_out_col.append(None)
                resources.append(resource_json)
                events_col.append(dumps(_events(s.events)).decode() if s.events else None)
                links_col.append(dumps(_links(s.links)).decode() if s.links else None)
                span_attrs.append(attrs)
                resource_of.append(resource_index)

    spans = pa.RecordBatch.from_arrays(
        [pa.array(values, field.type) for values, field in zip(columns, WALK_SCHEMA, strict=True)], schema=WALK_SCHEMA
    )
    scores, first_tokens = span_scores.of_spans(spans)
    return Walked(
        spans,
        _gathered(span_attrs, span_keys),
        _gathered(resource_attrs, resource_keys),
        rejections,
        scores,
        first_tokens,
    )


def _gathered(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, KeyValues]:
    # Every key seen (one C-level pass), then only the requested ones among them are gathered.
    present = set().union(*rows).intersection(keys)
    return {key: gather([row.get(key) for row in rows]) for key in sorted(present)}


def _accepted(s: Any, rejections: Rejections) -> bool:
    """Whether a span passes the checks, in order; a rejected one is counted with its reason."""
    tid, sid, parent = s.trace_id, s.span_id, s.parent_span_id
    start, end = s.start_time_unix_nano, s.end_time_unix_nano
    if len(tid) != 16 or tid == ZERO_TRACE:
        rejections.add(SpanRejectReason.INVALID_TRACE_ID, _id_problem("trace", tid, 16))
    elif len(sid) != 8 or sid == ZERO_SPAN:
        rejections.add(SpanRejectReason.INVALID_SPAN_ID, _id_problem("span", sid, 8))
    elif parent and len(parent) != 8:
        rejections.add(
            SpanRejectReason.INVALID_PARENT_SPAN_ID, f"parent span ids must be 64 bit, received {len(parent) * 8} bits"
        )
    elif start == 0:
        rejections.add(SpanRejectReason.MISSING_START_TIME, "start_time_unix_nano is 0")
    elif start > MAX_TIME_NS or end > MAX_TIME_NS:
        rejections.add(SpanRejectReason.INVALID_TIME, "span times must be below 2^63 ns")
    elif end < start:
        rejections.add(
            SpanRejectReason.END_BEFORE_START, f"end_time_unix_nano is {start - end} ns before start_time_unix_nano"
        )
    else:
        return True
    return False


def _id_problem(what: str, value: bytes, size: int) -> str:
    if len(value) == size:
        return f"{what} ids must not be all zeros"
    return f"{what} ids must be {size * 8} bit, received {len(value) * 8} bits"


def _events(raw_events: Any) -> list[dict[str, Any]]:
    events = [Span.Event.FromString(raw) for raw in raw_events]
    return [
        {"name": e.name, "time_unix_nano": e.time_unix_nano, "attributes": attributes_dict(e.attributes)}
        for e in events
    ]


def _links(raw_links: Any) -> list[dict[str, Any]]:
    links = [Span.Link.FromString(raw) for raw in raw_links]
    return [
        {"trace_id": k.trace_id.hex(), "span_id": k.span_id.hex(), "attributes": attributes_dict(k.attributes)}
        for k in links
    ]
