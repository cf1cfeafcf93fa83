"""What a span writer counts, the same series whichever backend it writes to (docs/ingest.md lists them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class WriterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.inserted = Counter("tailwatch_spans_stored", "Spans committed to the spans table.", registry=registry)
        self.duplicates = Counter(
            "tailwatch_spans_duplicate",
            "Spans dropped because the same (trace_id, span_id) was already stored (retried exports).",
            registry=registry,
        )
        self.commit_seconds = Histogram(
            "tailwatch_writer_commit_seconds",
            "Time to insert and commit one group of span batches.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.commit_failures = Counter(
            "tailwatch_writer_commit_failures",
            "Group commits that failed and were rolled back.",
            registry=registry,
        )
        self.queued_rows = Gauge("tailwatch_writer_queued_spans", "Spans waiting for the writer.", registry=registry)
        self.queued_bytes = Gauge(
            "tailwatch_writer_queued_bytes",
            "Bytes of the decoded batches waiting for the writer (spans, scores and metric points).",
            registry=registry,
        )
        self.scores = Counter("tailwatch_scores_stored", "Quality scores committed to span_scores.", registry=registry)
        self.points = Counter(
            "tailwatch_metric_rows_stored",
            "Engine metric rows committed to engine_metrics (a histogram point is two rows).",
            registry=registry,
        )
        self.last_commit = Gauge(
            "tailwatch_writer_last_commit_timestamp_seconds",
            "When the writer last committed a group (Unix time): stale while spans are queued means it is stuck.",
            registry=registry,
        )
        self.storage_full = Gauge(
            "tailwatch_storage_full",
            "1 while the database's filesystem is full: commits fail and spans are refused as retryable.",
            registry=registry,
        )
        self.dedup_seconds = Gauge(
            "tailwatch_dedup_window_seconds",
            "How far back retried spans are currently recognised as duplicates.",
            registry=registry,
        )
        self.spool_acknowledged = Counter(
            "tailwatch_spool_acknowledged_spans",
            "Spans acknowledged once synced to the ingest spool, before their commit (the writer was behind).",
            registry=registry,
        )
        self.spool_failures = Counter(
            "tailwatch_spool_write_failures",
            "Spool writes that failed; their requests were acknowledged at their commit instead.",
            registry=registry,
        )
