"""Ingest counters: every received, rejected, refused and stored item is counted, never logged per item."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from collector.reasons import LogRejectReason, MetricRejectReason, MetricUnjoined, RequestRefusal, SpanRejectReason

if TYPE_CHECKING:
    from collector.decode import Decoded, Decoder
    from collector.errors import ExportError


class IngestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decoder = Gauge(
            "tailwatch_trace_decoder_info",
            "1 for the trace decoder in use: native (compiled) or python (the reference).",
            ["decoder"],
            registry=registry,
        )
        self.decoder_processes = Gauge(
            "tailwatch_decoder_processes",
            "Decoder processes the service runs; 0 when it decodes in threads of its own process.",
            registry=registry,
        )
        self.requests = Counter(
            "tailwatch_export_requests",
            "OTLP export requests by transport, signal (traces, logs, metrics) and outcome (ok, or why refused).",
            ["transport", "signal", "outcome"],
            registry=registry,
        )
        self.spans_received = Counter(
            "tailwatch_spans_received", "Spans decoded from export requests.", ["transport"], registry=registry
        )
        self.spans_rejected = Counter(
            "tailwatch_spans_rejected",
            "Spans rejected by validation and reported back as partial success, by reason.",
            ["reason"],
            registry=registry,
        )
        self.refused = Counter(
            "tailwatch_items_refused",
            "Decoded spans or log records of requests refused as a whole (the client retries them), by reason.",
            ["signal", "reason"],
            registry=registry,
        )
        self.logs_received = Counter(
            "tailwatch_log_records_received",
            "Log records decoded from export requests.",
            ["transport"],
            registry=registry,
        )
        self.logs_rejected = Counter(
            "tailwatch_log_records_rejected",
            "Evaluation log records rejected and reported back as partial success, by reason.",
            ["reason"],
            registry=registry,
        )
        self.logs_ignored = Counter(
            "tailwatch_log_records_ignored",
            "Valid log records that are not gen_ai.evaluation.result events: accepted, not stored.",
            registry=registry,
        )
        self.points_received = Counter(
            "tailwatch_metric_points_received",
            "Engine metric data points decoded from OTLP metrics requests.",
            ["transport"],
            registry=registry,
        )
        self.points_rejected = Counter(
            "tailwatch_metric_points_rejected",
            "Metric data points rejected and reported back as partial success, by reason.",
            ["reason"],
            registry=registry,
        )
        self.points_ignored = Counter(
            "tailwatch_metric_points_ignored",
            "Valid data points with nothing to store: summaries, exponential histograms, no-recorded-value markers.",
            registry=registry,
        )
        self.points_unjoined = Counter(
            "tailwatch_metric_points_unjoined",
            "Metric points stored for SQL but not joined to requests: unknown name, or a known name of another type.",
            ["reason"],
            registry=registry,
        )
        # Pre-create the label sets so dashboards see zeros rather than gaps.
        for metric_reason in MetricRejectReason:
            self.points_rejected.labels(metric_reason.value)
        for unjoined in MetricUnjoined:
            self.points_unjoined.labels(unjoined.value)
        for reason in SpanRejectReason:
            self.spans_rejected.labels(reason.value)
        for log_reason in LogRejectReason:
            self.logs_rejected.labels(log_reason.value)
        for refusal in RequestRefusal:
            self.refused.labels("traces", refusal.value)

    def count_decoded(self, decoded: Decoded, transport: str) -> None:
        if decoded.metrics is not None:
            self.points_received.labels(transport).inc(decoded.received)
            self.points_ignored.inc(decoded.ignored)
            for why, n in decoded.unjoined.items():
                self.points_unjoined.labels(why.value).inc(n)
            rejected = self.points_rejected
        elif decoded.spans is not None:
            self.spans_received.labels(transport).inc(decoded.received)
            rejected = self.spans_rejected
        else:
            self.logs_received.labels(transport).inc(decoded.received)
            self.logs_ignored.inc(decoded.ignored)
            rejected = self.logs_rejected
        for reason, n in decoded.rejections.counts.items():
            rejected.labels(reason.value).inc(n)

    def count_refusal(self, signal: str, transport: str, exc: ExportError) -> None:
        self.requests.labels(transport, signal, exc.refusal.value).inc()
        if exc.items:
            self.refused.labels(signal, exc.refusal.value).inc(exc.items)

    def decoder_in_use(self, decoder: Decoder, processes: int) -> None:
        self.decoder.clear()
        self.decoder.labels(decoder.value).set(1)
        self.decoder_processes.set(processes)
