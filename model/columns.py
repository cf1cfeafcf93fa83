"""The canonical columns: one table of every column of `spans` and `span_scores`, its type, unit and meaning.

This is the one place a canonical column's type is written. The batches the decoder hands to storage
(Arrow tables, column names as in the database), normalize's FIELDS and the type each is cast to are all
derived from SPAN_COLUMNS and SCORE_COLUMNS. Storage inserts by name, so a column added here needs a
migration adding it to the table too: tests/test_schema.py fails until the migrated tables and this model
agree on every name, type and NOT NULL. Units and meanings are the ones docs/sql.md gives analysts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pyarrow as pa

# Storage holds signed 64-bit nanoseconds: a uint64 time at or past 2^63 (valid OTLP, one flipped bit from a real
# timestamp) has no timestamp, so the item carrying it is rejected alone.
MAX_TIME_NS = (1 << 63) - 1

SPAN_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUS_CODES = ("UNSET", "OK", "ERROR")


class Origin(StrEnum):
    """What fills a column."""

    OTLP = "otlp"  # the decoder, from the OTLP message itself
    ATTRIBUTES = "attributes"  # normalization, from attributes in priority order (normalize.FIELDS), then derived
    CLASSIFIED = "classified"  # normalization's verdict on the span: is_llm, llm_role
    STORAGE = "storage"  # the writer, at commit or when settling engine facts; not part of the decoder's batch


# The DuckDB type each Arrow type is stored as. Nanosecond Arrow timestamps land in microsecond TIMESTAMPs.
SQL_TYPES: dict[pa.DataType, str] = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.timestamp("ns"): "TIMESTAMP",
    pa.uint64(): "UBIGINT",
    pa.uint8(): "UTINYINT",
    pa.int16(): "SMALLINT",
}


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType  # in the decoder's Arrow batch
    unit: str | None
    description: str
    origin: Origin = Origin.OTLP
    required: bool = False  # NOT NULL in the table
    stored_as: str | None = None  # the table's type, when it is not SQL_TYPES[type] (JSON arrives as text)

    @property
    def sql_type(self) -> str:
        return self.stored_as or SQL_TYPES[self.type]


_TEXT, _INT, _FLOAT, _TIME = pa.string(), pa.int64(), pa.float64(), pa.timestamp("ns")
_ATTR, _UTC = Origin.ATTRIBUTES, "UTC timestamp"

# `spans`, in the decoder's batch order: OTLP columns, the classification, then the attribute-filled LLM
# columns in normalization's slot order. Where each LLM value comes from: docs/columns.md.
SPAN_COLUMNS: tuple[Column, ...] = (
    Column("trace_id", _TEXT, None, "Trace id, lower-case hex.", required=True),
    Column("span_id", _TEXT, None, "Span id, lower-case hex.", required=True),
    Column("parent_span_id", _TEXT, None, "Parent span's id; NULL for a root span."),
    Column("name", _TEXT, None, "Span name.", required=True),
    Column("kind", _TEXT, None, "INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER or UNSPECIFIED.", required=True),
    Column("start_time", _TIME, _UTC, "Span start.", required=True),
    Column("end_time", _TIME, _UTC, "Span end; detector windows, the _between macros and retention use it.",
           required=True),
    Column("duration_ms", _FLOAT, "ms", "end_time − start_time, from the nanosecond OTLP times.", required=True),
    Column("status_code", _TEXT, None, "UNSET, OK or ERROR.", required=True),
    Column("status_message", _TEXT, None, "Status message, or NULL."),
    Column("service_name", _TEXT, None, "Resource attribute service.name."),
    Column("scope_name", _TEXT, None, "Instrumentation scope name (e.g. vllm.tracing.otel)."),
    Column("attributes", _TEXT, None, "Every span attribute as received (bytes base64; a repeated key keeps the "
           "last value).", stored_as="JSON"),
    Column("resource", _TEXT, None, "Every resource attribute as received.", stored_as="JSON"),
    Column("events", _TEXT, None, "[{name, time_unix_nano, attributes}], or NULL.", stored_as="JSON"),
    Column("links", _TEXT, None, "[{trace_id, span_id, attributes}], or NULL.", stored_as="JSON"),
    Column("is_llm", pa.bool_(), None, "True when the span is a model inference request.",
           Origin.CLASSIFIED),
    Column("llm_role", _TEXT, None, "server for an engine span, client for any other LLM span, NULL when not an "
           "LLM span.", Origin.CLASSIFIED),
    Column("operation", _TEXT, None, "Operation or span kind as sent, lower-cased: chat, llm, embedding, tool, …",
           _ATTR),
    Column("provider", _TEXT, None, "Model provider or system, lower-cased (e.g. openai).", _ATTR),
    Column("model", _TEXT, None, "The served model, else the requested one.", _ATTR),
    Column("input_tokens", _INT, "tokens", "Prompt tokens, cached ones included.", _ATTR),
    Column("output_tokens", _INT, "tokens", "Generated tokens.", _ATTR),
    Column("cached_input_tokens", _INT, "tokens", "Prompt tokens served from the KV/prefix cache.", _ATTR),
    Column("ttft_ms", _FLOAT, "ms", "Time to first token.", _ATTR),
    Column("tpot_ms", _FLOAT, "ms per output token", "Decode latency per output token after the first.", _ATTR),
    Column("queue_ms", _FLOAT, "ms", "Time queued before the engine scheduled the request.", _ATTR),
    Column("prefill_ms", _FLOAT, "ms", "Time in model prefill.", _ATTR),
    Column("decode_ms", _FLOAT, "ms", "Time in model decode.", _ATTR),
    Column("e2e_ms", _FLOAT, "ms", "End-to-end request latency as the engine reports it; for LLM spans without "
           "it, the span's duration.", _ATTR),
    Column("finish_reason", _TEXT, None, "Why generation stopped (first reason sent), e.g. stop, length.", _ATTR),
    Column("cache_hit_ratio", _FLOAT, "0..1", "Share of the prompt served from the cache: an explicit ratio "
           "attribute, else cached_input_tokens / input_tokens.", _ATTR),
    Column("queue_depth", _INT, "count (requests)", "Requests waiting in the queue when the request arrived.",
           _ATTR),
    Column("replica_count", _INT, "count (replicas)", "Replicas of the deployment when the request arrived.",
           _ATTR),
    Column("batch_size", _INT, "count (requests)", "Requests in the engine batch the request ran in.", _ATTR),
    Column("prefill_tokens_in_batch", _INT, "tokens", "Prefill tokens in the batch the request was decoded in.",
           _ATTR),
    Column("quantization", _TEXT, None, "Quantization of the served model, lower-cased (e.g. fp16, fp8, awq).",
           _ATTR),
    Column("tenant_id", _TEXT, None, "Tenant: the first key of normalize.tenant_keys present; NULL when none is.",
           _ATTR),
    Column("replica_id", _TEXT, None, "Replica (process, pod or host): the first key of normalize.replica_keys "
           "present.", _ATTR),
    Column("deployment", _TEXT, None, "Deployment: service.name (the SDK placeholder unknown_service… counts as "
           "absent), else the span attribute deployment.", _ATTR),
    Column("ingested_at", _TIME, _UTC, "When the span was committed (arrival time).", Origin.STORAGE,
           required=True),
    # Settled engine facts (docs/engine-metrics.md): what the engines said for this span's replica,
    # fleet and times, stored once its engine metrics have arrived; never the span's own values.
    Column("engine_settled", pa.bool_(), None, "True once the span's engine facts are stored; NULL until then.",
           Origin.STORAGE),
    Column("engine_queue_depth", _INT, "count (requests)", "The most waiting requests of the span's fleet while it "
           "waited.", Origin.STORAGE),
    Column("engine_replica_count", _INT, "count (replicas)", "The most replicas of the span's fleet reporting while it "
           "waited.", Origin.STORAGE),
    Column("engine_cache_hit_ratio", _FLOAT, "0..1", "The replica's prefix-cache hits / queries during the span.",
           Origin.STORAGE),
    Column("engine_kv_cache_usage", _FLOAT, "0..1", "The replica's most KV-cache usage while the span waited.",
           Origin.STORAGE),
    Column("engine_running_requests", _INT, "count (requests)", "The replica's most running requests while the span "
           "waited.", Origin.STORAGE),
    Column("engine_preemptions", _INT, "count", "The replica's preemptions during the span.", Origin.STORAGE),
    Column("engine_step_tokens", _FLOAT, "tokens", "The replica's tokens per engine step during the span.",
           Origin.STORAGE),
    Column("engine_facts_reason", _TEXT, None, "Why some of the span's settled engine facts are missing: "
           "no_replica, no_points_for_replica, stale or source_behind; NULL when none is.", Origin.STORAGE),
    # How DuckDB stores `attributes` (storage/duckdb/stored_attributes.py): what no column reproduces, and a
    # bit for each attribute written back from its column when read.
    Column("attributes_rest", _TEXT, None, "The attributes no canonical column reproduces (DuckDB's storage of "
           "`attributes`).", Origin.STORAGE, stored_as="JSON"),
    Column("attributes_moved", pa.uint64(), None, "One bit for each attribute `attributes` writes back from its "
           "canonical column (DuckDB's storage of `attributes`).", Origin.STORAGE),
    Column("columns_derived", pa.uint8(), None, "One bit for each of tpot_ms and cache_hit_ratio the view derives "
           "when read (stored NULL; model/derived_columns.py).", Origin.STORAGE),
    Column("duration_rem_ns", pa.int16(), "ns", "Where `duration_ms` is stored NULL: the nanoseconds the "
           "microsecond start_time and end_time lost of it (model/derived_columns.py).", Origin.STORAGE),
)  # fmt: skip

# `span_scores`: one row per quality score, keyed by the judged span.
SCORE_COLUMNS: tuple[Column, ...] = (
    Column("trace_id", _TEXT, None, "Trace of the judged span.", required=True),
    Column("span_id", _TEXT, None, "The judged span.", required=True),
    Column("name", _TEXT, None, "Score name, e.g. json_adherence, groundedness.", required=True),
    Column("score", _FLOAT, "0..1", "Value as sent (a boolean counts as 1 or 0); the detectors expect 0..1."),
    Column("label", _TEXT, None, "Label as sent, or NULL."),
    Column("explanation", _TEXT, None, "Explanation as sent, or NULL."),
    Column("source", _TEXT, None, "attribute, event or log.", required=True),
    Column("observed_at", _TIME, _UTC, "Time of the event or log record; for an attribute, the span's end_time.",
           required=True),
    Column("ingested_at", _TIME, _UTC, "When the score was committed.", Origin.STORAGE, required=True),
)  # fmt: skip


# `engine_metrics`: one row per serving-engine metric point (OTLP metrics, or a scraped /metrics page).
# A histogram point is stored as two rows, `<name>_sum` and `<name>_count`, as Prometheus exposes them.
ENGINE_METRIC_COLUMNS: tuple[Column, ...] = (
    Column("time", _TIME, _UTC, "When the value was observed (the scrape's time).", required=True),
    Column("start_time", _TIME, _UTC, "Start of a cumulative series (a change means the counter was reset); "
           "NULL for gauges and scrapes without _created."),
    Column("name", _TEXT, None, "Metric name as received (histograms: with _sum or _count).", required=True),
    Column("metric", _TEXT, None, "The canonical engine metric it maps to (docs/engine-metrics.md), NULL when "
           "unknown or of another type: kept, not joined.", Origin.ATTRIBUTES),
    Column("kind", _TEXT, None, "gauge, cumulative (a monotonic counter) or delta.", required=True),
    Column("value", _FLOAT, None, "The value; counters in their own unit (tokens, preemptions, …).",
           required=True),
    Column("replica_id", _TEXT, None, "Replica: the first key of normalize.replica_keys present (a span: key reads "
           "the point's labels).", _ATTR),
    Column("deployment", _TEXT, None, "Deployment: normalize.deployment_keys, as for spans.", _ATTR),
    Column("model", _TEXT, None, "The point's model_name (or model) label.", _ATTR),
    Column("engine", _TEXT, None, "The data-parallel engine index label (vLLM engine), or NULL.", _ATTR),
    Column("source", _TEXT, None, "otlp or scrape.", required=True),
    Column("interval_s", _FLOAT, "s", "How often the series reports (metrics.interval_seconds); a value older "
           "than two intervals is no longer current.", required=True),
    Column("attributes", _TEXT, None, "The point's labels as received.", stored_as="JSON"),
    Column("resource", _TEXT, None, "Resource attributes (scrapes: the target's job, instance, replica).",
           stored_as="JSON"),
    Column("ingested_at", _TIME, _UTC, "When the point was committed.", Origin.STORAGE, required=True),
)  # fmt: skip


def batch_schema(columns: tuple[Column, ...]) -> pa.Schema:
    """The Arrow schema of the decoder's batch for a table: every column but the ones storage stamps."""
    return pa.schema([(c.name, c.type) for c in columns if c.origin is not Origin.STORAGE])


SPAN_BATCH_SCHEMA = batch_schema(SPAN_COLUMNS)
# What a decoder asked to split attributes adds to SPAN_BATCH_SCHEMA (model/attribute_split.py): which
# attributes its `attributes` leaves out because their columns hold them. A batch without it left none out.
MOVED = pa.field("attributes_moved", pa.uint64())
# And which derived columns it stored as NULL for the reader to derive (model/derived_columns.py).
DERIVED = pa.field("columns_derived", pa.uint8())
SCORE_BATCH_SCHEMA = batch_schema(SCORE_COLUMNS)
ENGINE_METRIC_BATCH_SCHEMA = batch_schema(ENGINE_METRIC_COLUMNS)

# Normalization's slots: the attribute-filled LLM columns, in order, and the Arrow type of each.
LLM_COLUMNS = [(c.name, c.type) for c in SPAN_COLUMNS if c.origin is Origin.ATTRIBUTES]
LLM_FIELDS = tuple(name for name, _ in LLM_COLUMNS)
LLM_TYPES: dict[str, pa.DataType] = dict(LLM_COLUMNS)

# Request-model columns that engine metrics fill (a span's own value wins) or alone provide (migration
# 0009), by the state they come from: the fleet's while the request waited, or the replica's.
# The join costs a read something only when it asks for one of them, and only the state it needs.
ENGINE_FLEET = ("queue_depth", "replica_count", "queue_depth_source", "replica_count_source")
ENGINE_REPLICA = (
    "cache_hit_ratio", "cache_hit_ratio_source", "kv_cache_usage", "running_requests", "preemptions", "step_tokens",
    "engine_facts_reason",
)  # fmt: skip
ENGINE_JOINED = (*ENGINE_FLEET, *ENGINE_REPLICA)
