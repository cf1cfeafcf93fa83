"""Request-level failures and how each maps onto gRPC codes and HTTP statuses (OTLP spec, 'Failures')."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from collector.reasons import RequestRefusal


class ExportError(Exception):
    """A whole export request failed; `refusal` says why and decides the status the client sees."""

    refusal: RequestRefusal = RequestRefusal.UNAVAILABLE

    def __init__(self, message: str, *, items: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        # How many spans or log records the request carried, when known: counted as refused in metrics.
        self.items = items


class MalformedPayload(ExportError):
    refusal = RequestRefusal.MALFORMED


class UnsupportedMediaType(ExportError):
    refusal = RequestRefusal.UNSUPPORTED_MEDIA_TYPE


class PayloadTooLarge(ExportError):
    refusal = RequestRefusal.TOO_LARGE


class Overloaded(ExportError):
    refusal = RequestRefusal.OVERLOADED


class Unavailable(ExportError):
    refusal = RequestRefusal.UNAVAILABLE


class BodyTimedOut(ExportError):
    refusal = RequestRefusal.TIMED_OUT


@dataclass(frozen=True)
class Mapping:
    grpc_code: grpc.StatusCode
    http_status: int
    # Retryable failures carry a retry hint (gRPC RetryInfo, HTTP Retry-After) so exporters back off
    # instead of dropping data; non-retryable ones must not, or clients would resend garbage forever.
    retryable: bool


STATUS: dict[RequestRefusal, Mapping] = {
    RequestRefusal.MALFORMED: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400, retryable=False),
    RequestRefusal.UNSUPPORTED_MEDIA_TYPE: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 415, retryable=False),
    RequestRefusal.TOO_LARGE: Mapping(grpc.StatusCode.RESOURCE_EXHAUSTED, 413, retryable=False),
    RequestRefusal.OVERLOADED: Mapping(grpc.StatusCode.UNAVAILABLE, 503, retryable=True),
    RequestRefusal.UNAVAILABLE: Mapping(grpc.StatusCode.UNAVAILABLE, 503, retryable=True),
    # HTTP only (gRPC has its own flow control): a client that stalls mid-body is not waiting for an answer.
    RequestRefusal.TIMED_OUT: Mapping(grpc.StatusCode.DEADLINE_EXCEEDED, 408, retryable=False),
}
