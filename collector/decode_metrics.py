"""OTLP metrics requests → engine metric points (`engine_metrics`).

Gauge, Sum (cumulative or delta, monotonic or not) and explicit-bucket Histogram points are kept;
exponential histograms and summaries are counted as ignored, as are points flagged "no recorded
value" (the Prometheus staleness marker the Collector forwards). Pure, like the trace decoder.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, DataPointFlags

from collector.anyvalue import attributes_dict
from collector.engine_names import EngineNames, Kind
from collector.engine_points import Origin, Point, PointColumns, Temporality
from collector.errors import MalformedPayload
from collector.normalize import Plan
from collector.reasons import MetricRejectReason

_NO_RECORDED_VALUE = DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
_DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def walk_metrics(request: Any, points: PointColumns) -> int:
    """Feed every data point of a parsed request to `points`; returns how many were ignored."""
    ignored = 0
    for rm in request.resource_metrics:
        origin = points.origin(attributes_dict(rm.resource.attributes))
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                name = metric.name
                if kind == "gauge":
                    ignored += _numbers(points, origin, (name, Kind.GAUGE, Temporality.GAUGE), metric.gauge.data_points)
                elif kind == "sum":
                    s = metric.sum
                    temporality = Temporality.DELTA if s.aggregation_temporality == _DELTA else Temporality.CUMULATIVE
                    if s.is_monotonic:
                        arrived = Kind.COUNTER
                    elif temporality == Temporality.CUMULATIVE:
                        # An up-down counter's cumulative value is a level: it is read as a gauge.
                        arrived, temporality = Kind.GAUGE, Temporality.GAUGE
                    else:
                        arrived = Kind.COUNTER
                    ignored += _numbers(points, origin, (name, arrived, temporality), s.data_points)
                elif kind == "histogram":
                    h = metric.histogram
                    temporality = Temporality.DELTA if h.aggregation_temporality == _DELTA else Temporality.CUMULATIVE
                    for dp in h.data_points:
                        if dp.flags & _NO_RECORDED_VALUE:
                            ignored += 1
                            continue
                        total = dp.sum if dp.HasField("sum") else float("nan")
                        labels = attributes_dict(dp.attributes)
                        point = Point(name, Kind.HISTOGRAM, temporality, dp.time_unix_nano, dp.start_time_unix_nano,
                                      labels, total, float(dp.count))  # fmt: skip
                        points.add(origin, point)
                elif kind == "exponential_histogram":
                    ignored += len(metric.exponential_histogram.data_points)
                elif kind == "summary":
                    ignored += len(metric.summary.data_points)
    return ignored


def _numbers(points: PointColumns, origin: Origin, metric: tuple[str, Kind, str], data: Any) -> int:
    name, arrived, temporality = metric
    ignored = 0
    for dp in data:
        if dp.flags & _NO_RECORDED_VALUE:
            ignored += 1
            continue
        which = dp.WhichOneof("value")
        if which is None:
            points.reject(MetricRejectReason.MISSING_VALUE, f"{name}: a point has neither as_double nor as_int")
            continue
        value = float(getattr(dp, which))
        labels = attributes_dict(dp.attributes)
        points.add(origin, Point(name, arrived, temporality, dp.time_unix_nano, dp.start_time_unix_nano, labels, value))
    return ignored


def parse_metrics(payload: bytes) -> ExportMetricsServiceRequest:
    try:
        return ExportMetricsServiceRequest.FromString(payload)
    except DecodeError as exc:
        raise MalformedPayload(f"not a valid OTLP protobuf ExportMetricsServiceRequest: {exc}") from None


def metric_points(request: Any, plan: Plan, names: EngineNames) -> tuple[PointColumns, int]:
    points = PointColumns(names, plan, "otlp")
    ignored = walk_metrics(request, points)
    return points, ignored
