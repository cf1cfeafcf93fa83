"""Closed sets of reasons a span or a request is turned away, used as metric labels."""

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum


class SpanRejectReason(StrEnum):
    """Why one span of an otherwise valid request was rejected (reported as partial success)."""

    INVALID_TRACE_ID = "invalid_trace_id"
    """trace_id is not 16 bytes, or is all zeros (OTLP: 'an all-zero trace id is invalid')."""
    INVALID_SPAN_ID = "invalid_span_id"
    """span_id is not 8 bytes, or is all zeros."""
    INVALID_PARENT_SPAN_ID = "invalid_parent_span_id"
    """parent_span_id is present but not 8 bytes."""
    MISSING_START_TIME = "missing_start_time"
    """start_time_unix_nano is 0: the span cannot be placed in any window."""
    END_BEFORE_START = "end_before_start"
    """end_time_unix_nano is earlier than start_time_unix_nano."""
    INVALID_TIME = "invalid_time"
    """start_time_unix_nano or end_time_unix_nano is at or beyond 2^63 ns, past any timestamp storage holds."""


class RequestRefusal(StrEnum):
    """Why a whole export request was refused; its spans were not stored."""

    MALFORMED = "malformed"
    """The body is not a valid OTLP message in its declared encoding (400 / INVALID_ARGUMENT)."""
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    """Content-Type or Content-Encoding the receiver does not speak (415)."""
    TOO_LARGE = "too_large"
    """Body, or its decompressed form, exceeds the configured limit (413 / RESOURCE_EXHAUSTED)."""
    OVERLOADED = "overloaded"
    """The ingest queue is full; the client should retry later (503 / UNAVAILABLE with a retry hint)."""
    UNAVAILABLE = "unavailable"
    """The service is shutting down or a decoder worker failed; retryable."""
    TIMED_OUT = "timed_out"
    """OTLP/HTTP: the body did not arrive within ingest.http_read_timeout_seconds (408, connection closed)."""


class LogRejectReason(StrEnum):
    """Why one log record was rejected (only evaluation events are stored; others are accepted and dropped)."""

    MISSING_SPAN_CONTEXT = "missing_span_context"
    """A gen_ai.evaluation.result record without a valid trace_id and span_id cannot be joined to a span."""
    INVALID_EVALUATION = "invalid_evaluation"
    """A gen_ai.evaluation.result record without gen_ai.evaluation.name."""
    INVALID_TIME = "invalid_time"
    """An evaluation record whose time_unix_nano (or observed_time_unix_nano) is at or beyond 2^63 ns."""


class MetricRejectReason(StrEnum):
    """Why one metric data point was rejected (reported as partial success in rejected_data_points)."""

    MISSING_NAME = "missing_name"
    """The metric has no name, so the point cannot be told apart from any other."""
    MISSING_TIME = "missing_time"
    """time_unix_nano is 0: the point cannot be placed in time."""
    INVALID_TIME = "invalid_time"
    """time_unix_nano (or start_time_unix_nano) is at or beyond 2^63 ns, past any timestamp storage holds."""
    MISSING_VALUE = "missing_value"
    """A number point with neither as_double nor as_int set."""
    NON_FINITE_VALUE = "non_finite_value"
    """The value (or a histogram's sum) is NaN or infinite."""


class MetricUnjoined(StrEnum):
    """Why a stored metric point is kept for SQL but not joined to requests."""

    UNKNOWN_NAME = "unknown_name"
    """No canonical engine metric has this name (docs/engine-metrics.md; metrics.names adds names)."""
    TYPE_MISMATCH = "type_mismatch"
    """The name is known but arrived as another type (e.g. a counter where a gauge is expected)."""


@dataclass
class Rejections:
    """Items turned away from one request, by reason, with the first explanation seen for each."""

    counts: Counter[StrEnum] = field(default_factory=Counter)
    examples: dict[StrEnum, str] = field(default_factory=dict)

    def add(self, reason: StrEnum, explanation: str) -> None:
        self.counts[reason] += 1
        self.examples.setdefault(reason, explanation)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def message(self, noun: str = "span") -> str:
        """One sentence for the OTLP partial-success `error_message`."""
        parts = [f"{n} {r.value} ({self.examples[r]})" for r, n in sorted(self.counts.items())]
        return f"rejected {self.total} {noun}(s): " + "; ".join(parts)
