"""Hand-built OTLP requests for tests: exact control over ids, times and attribute types."""

from __future__ import annotations

import os
import time
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span

# An hour ago, on the hour: recent enough that retention (7 days by default) keeps it.
T0 = (int(time.time()) // 3600 - 1) * 3600 * 1_000_000_000


class Pairs(list[tuple[str, Any]]):
    """A kvlist value given as (key, value) pairs, so a key may repeat."""


def any_value(value: Any) -> AnyValue:
    out = AnyValue()
    if value is None:
        pass  # an AnyValue with no value set
    elif isinstance(value, Pairs):
        out.kvlist_value.values.extend(KeyValue(key=k, value=any_value(v)) for k, v in value)
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, bytes):
        out.bytes_value = value
    elif isinstance(value, list):
        out.array_value.values.extend(any_value(v) for v in value)
    elif isinstance(value, dict):
        out.kvlist_value.values.extend(KeyValue(key=k, value=any_value(v)) for k, v in value.items())
    else:
        out.string_value = str(value)
    return out


def kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()]


def span(
    name: str = "llm_request",
    *,
    trace_id: bytes | None = None,
    span_id: bytes | None = None,
    parent_span_id: bytes = b"",
    start: int = T0,
    duration_ns: int = 2_000_000_000,
    end: int | None = None,
    kind: int = Span.SPAN_KIND_SERVER,
    attributes: dict[str, Any] | None = None,
    status_code: int = 0,
    status_message: str = "",
) -> Span:
    s = Span(
        trace_id=os.urandom(16) if trace_id is None else trace_id,
        span_id=os.urandom(8) if span_id is None else span_id,
        parent_span_id=parent_span_id,
        name=name,
        kind=kind,  # type: ignore[arg-type]
        start_time_unix_nano=start,
        end_time_unix_nano=start + duration_ns if end is None else end,
    )
    s.attributes.extend(kvs(attributes or {}))
    s.status.code = status_code  # type: ignore[assignment]
    s.status.message = status_message
    return s


def request(
    spans: list[Span], resource: dict[str, Any] | None = None, scope: str = "tests"
) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(kvs({"service.name": "test-svc", **(resource or {})}))
    ss = rs.scope_spans.add()
    ss.scope.name = scope
    ss.spans.extend(spans)
    return req


# --- engine metrics ------------------------------------------------------------------------------------


def gauge(name: str, points: list[tuple[int, float]], labels: dict[str, Any] | None = None) -> Metric:
    """A Gauge with one point per (time_ns, value)."""
    m = Metric(name=name)
    for at, value in points:
        dp = m.gauge.data_points.add(time_unix_nano=at, as_double=value)
        dp.attributes.extend(kvs(labels or {}))
    return m


def counter(
    name: str,
    points: list[tuple[int, float]],
    labels: dict[str, Any] | None = None,
    *,
    start: int = 0,
    delta: bool = False,
    monotonic: bool = True,
) -> Metric:
    """A Sum (monotonic cumulative by default) with one point per (time_ns, value)."""
    m = Metric(name=name)
    m.sum.is_monotonic = monotonic
    m.sum.aggregation_temporality = (
        AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
        if delta
        else AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    )
    for at, value in points:
        dp = m.sum.data_points.add(time_unix_nano=at, start_time_unix_nano=start, as_double=value)
        dp.attributes.extend(kvs(labels or {}))
    return m


def histogram(
    name: str, points: list[tuple[int, float, int]], labels: dict[str, Any] | None = None, *, start: int = 0
) -> Metric:
    """A cumulative explicit-bucket Histogram with one point per (time_ns, sum, count)."""
    m = Metric(name=name)
    m.histogram.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    for at, total, count in points:
        dp = m.histogram.data_points.add(
            time_unix_nano=at, start_time_unix_nano=start, sum=total, count=count, explicit_bounds=[1.0, 10.0]
        )
        dp.bucket_counts.extend([0, count, 0])
        dp.attributes.extend(kvs(labels or {}))
    return m


def metrics_request(metrics: list[Metric], resource: dict[str, Any] | None = None) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend(kvs(resource or {}))
    rm.scope_metrics.add().metrics.extend(metrics)
    return req
