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

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector import native_walk, otlp_json, span_walk
from collector.anyvalue import attributes_dict
from collector.decode_metrics import metric_points, parse_metrics
from collector.engine_names import EngineNames
from collector.errors import MalformedPayload
from collector.normalize import (
    FIELDS,
    LANGFUSE_COMPLETION_START,
    NormalizeConfig,
    Plan,
    SpanBatch,
    build_plan,
    first_token_ms,
    normalize_batch,
)
from collector.reasons import LogRejectReason, MetricUnjoined, Rejections
from collector.scores import EVALUATION_EVENT, Score, from_evaluation, score_table
from collector.span_walk import ZERO_SPAN, ZERO_TRACE, Walked
from model.attribute_split import gathered_keys, left_out, split
from model.columns import DERIVED, MAX_TIME_NS, MOVED, SPAN_BATCH_SCHEMA
from model.derived_columns import leave_derived, leave_duration


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


class Decoder(StrEnum):
    """Which walk decodes trace requests: the compiled one (native/) or the Python reference."""

    NATIVE = "native"
    PYTHON = "python"


DEFAULT_DECODER = Decoder.NATIVE if native_walk.AVAILABLE else Decoder.PYTHON


def choose_decoder(setting: str) -> Decoder:
    """The decoder for `ingest.decoder`: auto, native or python."""
    if setting == "auto":
        return DEFAULT_DECODER
    if setting == Decoder.NATIVE and not native_walk.AVAILABLE:
        raise ValueError(
            "ingest.decoder is 'native' but the compiled decoder is not installed: run scripts/setup with cargo "
            "(Rust) on PATH, or set ingest.decoder to auto"
        )
    return Decoder(setting)


_WALKS = {Decoder.NATIVE: native_walk.walk, Decoder.PYTHON: span_walk.walk}


@cache
def default_plan() -> Plan:
    return build_plan(NormalizeConfig())


def decode(
    signal: Signal,
    payload: bytes,
    encoding: Encoding,
    plan: Plan | None = None,
    names: EngineNames | None = None,
    *,
    decoder: Decoder | None = None,
    split_attributes: bool = False,
) -> Decoded:
    """Decode one export request of any signal."""
    if signal is Signal.LOGS:
        return decode_logs(payload, encoding)
    if signal is Signal.METRICS:
        return decode_metrics(payload, encoding, plan, names)
    return decode_traces(payload, encoding, plan, decoder, split_attributes=split_attributes)


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


def _parse(payload: bytes, encoding: Encoding, message: type[Message]) -> Any:
    if encoding is Encoding.JSON:
        return otlp_json.parse(payload, message)
    try:
        return message.FromString(payload)
    except DecodeError as exc:
        raise MalformedPayload(f"not a valid OTLP protobuf {message.DESCRIPTOR.name}: {exc}") from None


def decode_traces(
    payload: bytes,
    encoding: Encoding,
    plan: Plan | None = None,
    decoder: Decoder | None = None,
    *,
    split_attributes: bool = False,
) -> Decoded:
    """Decode, validate and normalize one OTLP trace export request (by default with DEFAULT_DECODER).

    With `split_attributes` the spans' `attributes` leave out what a canonical column holds exactly, and an
    `attributes_moved` column says what (model/attribute_split.py): the form DuckDB stores."""
    if encoding is Encoding.JSON:
        # OTLP/JSON is re-encoded once so that both encodings share the one walk.
        payload = otlp_json.parse(payload, ExportTraceServiceRequest).SerializeToString()
    plan = plan or default_plan()
    keys = gathered_keys(plan.walk_span_keys) if split_attributes else plan.walk_span_keys
    out = left_out(keys) if split_attributes else ()
    walked = _WALKS[decoder or DEFAULT_DECODER](payload, keys, plan.walk_resource_keys, out)
    return finish(walked, plan, split_attributes=split_attributes)


def finish(walked: Walked, plan: Plan, *, split_attributes: bool = False) -> Decoded:
    """First-token times and the canonical LLM columns of a walked request: the one implementation,
    whichever walk ran (both read the scores and the first-token events: collector/span_scores.py)."""
    spans = walked.spans
    attributes = spans["attributes"]
    left_out_json = spans["left_out"]
    names, kinds, durations = spans["name"], spans["kind"], spans["duration_ms"]
    llm, is_llm, roles = normalize_batch(
        plan,
        SpanBatch(
            walked.span_values,
            walked.resource_values,
            spans["resource_index"],
            names,
            kinds,
            durations,
            _with_completion_start(walked),
        ),
    )
    if split_attributes:
        # The moves compare sent values with the columns as normalized, before derived ones are left out.
        attributes, moved = split(attributes, left_out_json, walked.span_values, llm)
        llm, derived = leave_derived(llm)
        spans = spans.set_column(
            spans.schema.get_field_index("duration_ms"),
            "duration_ms",
            leave_duration(spans["start_time"], spans["end_time"], spans["duration_ms"]),
        )
    stored = [attributes if name == "attributes" else spans[name] for name in spans.schema.names
              if name not in _WALK_ONLY]  # fmt: skip
    table = pa.Table.from_arrays([*stored, is_llm, roles, *(llm[name] for name in FIELDS)], schema=SPAN_BATCH_SCHEMA)
    if split_attributes:
        table = table.append_column(MOVED, moved).append_column(DERIVED, derived)
    return Decoded(Signal.TRACES, table, walked.scores, walked.rejections)


def _with_completion_start(walked: Walked) -> pa.Array:
    """The first-token times from events, else from Langfuse's completion start where a span has one."""
    completion_start = walked.span_values.get(LANGFUSE_COMPLETION_START)
    if completion_start is None:
        return walked.first_tokens
    rows = pc.indices_nonzero(pc.and_(pc.is_valid(completion_start.values), pc.is_null(walked.first_tokens)))
    if not len(rows):
        return walked.first_tokens
    first: list[float | None] = walked.first_tokens.to_pylist()
    starts = walked.spans["start_time"].cast(pa.int64())
    sent = completion_start.pylist()
    for i in rows.to_pylist():
        first[i] = first_token_ms(None, sent[i], starts[i].as_py())
    return pa.array(first, pa.float64())


# The walk's columns the decoded batch does not carry: what normalization and the split read.
_WALK_ONLY = ("resource_index", "left_out")


def decode_logs(payload: bytes, encoding: Encoding) -> Decoded:
    """Decode one OTLP logs export request, keeping the `gen_ai.evaluation.result` events as scores."""
    request = _parse(payload, encoding, ExportLogsServiceRequest)
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
                if len(tid) != 16 or tid == ZERO_TRACE or len(sid) != 8 or sid == ZERO_SPAN:
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
