"""OTLP response bodies shared by both transports: success (possibly partial) and rpc.Status failures."""

from __future__ import annotations

from google.protobuf import json_format
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from collector.decode import Encoding, Signal
from collector.errors import STATUS, ExportError
from collector.pipeline import ExportResult

# Per signal: the response message, its partial-success message, and the field counting what was rejected.
_RESPONSES: dict[Signal, tuple[type[Message], type[Message], str]] = {
    Signal.TRACES: (ExportTraceServiceResponse, ExportTracePartialSuccess, "rejected_spans"),
    Signal.LOGS: (ExportLogsServiceResponse, ExportLogsPartialSuccess, "rejected_log_records"),
    Signal.METRICS: (ExportMetricsServiceResponse, ExportMetricsPartialSuccess, "rejected_data_points"),
}


def export_response(signal: Signal, result: ExportResult) -> Message:
    """Full success is an empty response; any rejection is reported as partial success (OTLP spec)."""
    response_type, partial_type, rejected_field = _RESPONSES[signal]
    response = response_type()
    if result.rejected:
        partial = partial_type(**{rejected_field: result.rejected, "error_message": result.message})
        response.partial_success.CopyFrom(partial)  # type: ignore[attr-defined]
    return response


def error_status(exc: ExportError, retry_after_seconds: int) -> status_pb2.Status:
    """google.rpc.Status for a refused request; retryable refusals carry RetryInfo."""
    mapping = STATUS[exc.refusal]
    status = status_pb2.Status(code=mapping.grpc_code.value[0], message=exc.message)
    if mapping.retryable:
        detail = AnyProto()
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=Duration(seconds=retry_after_seconds)))
        status.details.append(detail)
    return status


def encode(message: Message, encoding: Encoding) -> tuple[bytes, str]:
    """Serialize a response in the request's encoding; returns (body, content type)."""
    if encoding is Encoding.JSON:
        return json_format.MessageToJson(message, indent=None).encode(), "application/json"
    return message.SerializeToString(), "application/x-protobuf"
