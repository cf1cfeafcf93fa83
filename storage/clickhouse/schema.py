"""Tailwatch's tables on ClickHouse, and the `otel_traces` table of the Collector's `clickhouseexporter`.

Every Tailwatch table has the columns the DuckDB migrations give it (read from a migrated in-memory DuckDB,
so a migration that adds a column adds it here too); what this module adds is ClickHouse's part: the
engine, the sorting key, partitions and TTL. Tables whose rows are replaced are ReplacingMergeTree with a
`_version` and read with `final = 1`; the rest are MergeTree. Spans live twice: the OpenTelemetry layout in
`otel_traces` (what Grafana, SigNoz-style tools and the user's own queries read) and the canonical request
columns in `spans`, keyed by trace and span, which the detectors read.

`cluster` turns on the cluster-aware form: every statement `ON CLUSTER` and Replicated* engines. The tables
that grow with the span rate are sharded: each shard stores its rows in `<name>_local`, and `<name>` is a
`Distributed` table over them, so every read (Tailwatch's and an analyst's) names the same table on one node
or many. Tailwatch's own small tables (figures, alerts, the lease) are one replica set across the whole
cluster instead, so any node reads them whole and the lease's conditional write is one (docs/scale-out.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from model.columns import SPAN_COLUMNS
from storage.clickhouse.client import ClickHouse
from storage.ports import OtelTraces
from storage.span_layout import SPAN_ROWS, STORED_ONLY

SCHEMA_VERSION = 1

# DuckDB column types as ClickHouse stores them. JSON is text in both (the analyst's JSON functions differ).
_TYPES = {
    "VARCHAR": "String",
    "JSON": "String",
    "BIGINT": "Int64",
    "INTEGER": "Int32",
    "DOUBLE": "Float64",
    "BOOLEAN": "Bool",
    "TIMESTAMP": "DateTime64(6, 'UTC')",
    "VARCHAR[]": "Array(String)",
    "MAP(VARCHAR, DOUBLE)": "Map(String, Float64)",
}
_CONTAINERS = ("Array(", "Map(")

# The wide JSON columns of a span are in otel_traces' maps; `spans` keeps the columns the request model reads.
SPAN_JSON_COLUMNS = ("attributes", "resource", "events", "links")


@dataclass(frozen=True)
class Layout:
    """ClickHouse's part of one table's definition."""

    order_by: str
    replacing: bool = False  # rows are replaced by a newer `_version` with the same sorting key
    partition_by: str | None = None
    ttl_column: str | None = None  # retention: rows older than the configured days are dropped by part
    skip: tuple[str, ...] = ()
    # The writer's retried inserts land here, and the server drops a block it has seen (a deduplication
    # window). Every other table has rows deleted and the same rows written again on purpose (a window
    # evaluated again), which such a window would drop as a retry.
    retried: bool = False


_FIGURES = Layout("(window_end, window_start)", partition_by="toYYYYMM(window_end)")

LAYOUTS: dict[str, Layout] = {
    "spans": Layout(
        "(end_time, trace_id, span_id)",
        replacing=True,
        partition_by="toDate(end_time)",
        ttl_column="end_time",
        skip=SPAN_JSON_COLUMNS + STORED_ONLY,
        retried=True,
    ),
    "span_scores": Layout(
        "(trace_id, span_id, name, source, observed_at)",
        replacing=True,
        partition_by="toDate(observed_at)",
        retried=True,
    ),
    "engine_metrics": Layout("(time, name)", partition_by="toDate(time)", ttl_column="time", retried=True),
    "alerts": Layout("(alert_id)", replacing=True),
    "incidents": Layout("(incident_id)", replacing=True),
    "changes": Layout("(change_id)", replacing=True),
    "alert_conditions": Layout("(detector, fingerprint)"),
    "detector_runs": Layout("(detector, evaluated_at)", partition_by="toYYYYMM(evaluated_at)"),
    "scrape_targets": Layout("(url)", replacing=True),
}
# DuckDB's own bookkeeping: the schema's revision, and how far its writer's ingest spool is committed.
NOT_IN_CLICKHOUSE = frozenset({"alembic_version", "ingest_spool"})
# DuckDB stores `duration_ms` NULL where its view reads it from the times; ClickHouse stores every value.
_REQUIRED_SPAN_COLUMNS = frozenset(c.name for c in SPAN_COLUMNS if c.required)


def versioned(table: pa.Table) -> pa.Table:
    """Rows of a ReplacingMergeTree with the `_version` that makes them replace what is stored: the newest wins."""
    return table.append_column("_version", pa.repeat(pa.scalar(time.time_ns(), pa.uint64()), table.num_rows))


def layout(table: str) -> Layout:
    """A table's layout: a detector's results (keyed by window) unless named above."""
    return LAYOUTS.get(table, _FIGURES)


def clickhouse_type(duckdb_type: str, nullable: bool) -> str:
    if duckdb_type not in _TYPES:
        raise ValueError(f"no ClickHouse type for DuckDB's {duckdb_type}")
    typ = _TYPES[duckdb_type]
    return f"Nullable({typ})" if nullable and not typ.startswith(_CONTAINERS) else typ


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # ClickHouse's


def tables_of(rows: Iterable[tuple[str, str, str, bool]]) -> dict[str, list[Column]]:
    """Every Tailwatch table of the migrated schema (`RequestEvaluator.table_columns`: table, column, DuckDB type,
    nullable), with its columns as ClickHouse types."""
    tables: dict[str, list[Column]] = {}
    for stored, name, typ, stored_nullable in rows:
        table = "spans" if stored == SPAN_ROWS else stored  # DuckDB's `spans` is a view of its stored rows
        if table in NOT_IN_CLICKHOUSE or name in layout(table).skip:
            continue
        nullable = name not in _REQUIRED_SPAN_COLUMNS if table == "spans" else stored_nullable
        tables.setdefault(table, []).append(Column(name, clickhouse_type(typ, nullable)))
    return tables


def _quote(name: str) -> str:
    return f"`{name}`"


# A sharded table's sharding key: the rows that replace one another (a span's versions, a score's) share a trace,
# so they meet on one shard, where FINAL sees them together; a request's client and server spans do too.
SHARDED: dict[str, str] = {
    "spans": "cityHash64(trace_id)",
    "span_scores": "cityHash64(trace_id)",
    "engine_metrics": "rand()",
}
OTEL_SHARDING = "cityHash64(TraceId)"
_LOCAL = "_local"


def stored_in(name: str, cluster: str | None, *, sharded: bool | None = None) -> str:
    """The table that holds `name`'s rows on this node: its shard's local table where it is sharded (what DDL,
    TTL and deletes name), else the table itself."""
    return f"{name}{_LOCAL}" if cluster and (name in SHARDED if sharded is None else sharded) else name


def delete_rows(table: str, where: str, cluster: str | None, *, sharded: bool | None = None) -> str:
    """A DELETE of `table`'s rows. A Distributed table takes none: on a cluster every shard deletes from its own
    table (each replica of a shard runs it; the second finds nothing left). An unsharded replicated table
    replicates the delete itself."""
    stored = stored_in(table, cluster, sharded=sharded)
    return f"DELETE FROM {_quote(stored)}{on_cluster(cluster) if stored != table else ''} WHERE {where}"


def distributed(name: str, cluster: str, key: str) -> str:
    local = _quote(name + _LOCAL)
    return (
        f"CREATE TABLE IF NOT EXISTS {_quote(name)}{on_cluster(cluster)} AS {local} "
        f"ENGINE = Distributed({_quote(cluster)}, currentDatabase(), {local}, {key})"
    )


def create_table(name: str, columns: Iterable[Column], *, cluster: str | None, ttl_days: float | None) -> list[str]:
    """The table's CREATE, and on a cluster the Distributed table over a sharded one."""
    spec = layout(name)
    body = [f"    {_quote(c.name)} {c.type}" for c in columns]
    if spec.replacing:
        body.append("    `_version` UInt64 DEFAULT 0")
    if name == "spans":
        body.append("    INDEX idx_trace_id trace_id TYPE bloom_filter(0.001) GRANULARITY 1")
    engine = table_engine(name, replacing=spec.replacing, cluster=cluster)
    parts = [
        f"CREATE TABLE IF NOT EXISTS {_quote(stored_in(name, cluster))}{on_cluster(cluster)} (\n"
        + ",\n".join(body)
        + "\n)",
        f"ENGINE = {engine}",
    ]
    if spec.partition_by:
        parts.append(f"PARTITION BY {spec.partition_by}")
    parts.append(f"ORDER BY {spec.order_by}")
    if spec.ttl_column and ttl_days:
        parts.append(ttl_clause(spec.ttl_column, ttl_days))
    # Deduplication tokens on non-replicated tables need a window of remembered inserts (replicated ones
    # have it by default, and the tables replaced on purpose are written with insert_deduplicate = 0).
    parts.append(f"SETTINGS {_WINDOW_SETTING} = {_WINDOW}" if spec.retried and not cluster else "")
    created = ["\n".join(p for p in parts if p)]
    if cluster and name in SHARDED:
        created.append(distributed(name, cluster, SHARDED[name]))
    return created


_WINDOW_SETTING = "non_replicated_deduplication_window"
_WINDOW = 1000


def upgrade_table(client: ClickHouse, name: str, columns: Iterable[Column], *, cluster: str | None) -> None:
    """A table created by an earlier Tailwatch gets what this one writes: the columns a migration added since
    (a store from before them refused every insert naming them), and no deduplication window where rows are
    replaced on purpose (tables created before it was taken off)."""
    have = {
        str(r[0])
        for r in client.rows(
            "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {t:String}",
            {"t": stored_in(name, cluster)},
        )
    }
    # A sharded table's Distributed table reads the columns it was told of: it gets the new ones too, after the
    # local table that holds them.
    altered = list(dict.fromkeys([stored_in(name, cluster), name]))
    for column in columns:
        if column.name not in have:
            for table in altered:
                client.command(f"ALTER TABLE {_quote(table)}{on_cluster(cluster)} ADD COLUMN IF NOT EXISTS "
                               f"{_quote(column.name)} {column.type}")  # fmt: skip
    if cluster or layout(name).retried:
        return
    [(query,)] = client.rows(
        "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = {t:String}",
        {"t": name},
    )
    if f"{_WINDOW_SETTING} = {_WINDOW}" in str(query):
        client.command(f"ALTER TABLE {_quote(name)} MODIFY SETTING {_WINDOW_SETTING} = 0")


def ttl_clause(column: str, days: float) -> str:
    return f"TTL toDateTime({column}) + toIntervalSecond({int(days * 86400)})"


def keep_ttl(client: ClickHouse, table: str, column: str, days: float | None, cluster: str | None) -> None:
    """A table created with another retention gets this one: otherwise a longer `retention_days` would still
    see ClickHouse drop rows at the old age. Existing rows are not rewritten (the retention job deletes at
    the cutoff); parts written from now on carry the new TTL. `table` is the one holding the rows."""
    if not days:
        return
    engine = client.command(
        "SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = {t:String}", {"t": table}
    )
    if f"toIntervalSecond({int(days * 86400)})" not in str(engine):
        client.command(
            f"ALTER TABLE {_quote(table)}{on_cluster(cluster)} MODIFY {ttl_clause(column, days)}",
            settings={"materialize_ttl_after_modify": 0},
        )


def table_engine(name: str, *, replacing: bool, cluster: str | None, sharded: bool | None = None) -> str:
    """MergeTree or ReplacingMergeTree(_version), Replicated on a cluster: a sharded table has one replica set a
    shard, the others one across the cluster (`all` for the shard in the Keeper path), so every node holds them
    whole and an insert token taken on one node is seen by all."""
    if not cluster:
        return "ReplacingMergeTree(_version)" if replacing else "MergeTree()"
    shard = "{shard}" if (name in SHARDED if sharded is None else sharded) else "all"
    path = f"'/clickhouse/tables/{shard}/{{database}}/" + name + "', '{replica}'"
    return f"ReplicatedReplacingMergeTree({path}, _version)" if replacing else f"ReplicatedMergeTree({path})"


def create_replaced(name: str, columns: str, order_by: str, cluster: str | None) -> str:
    """A small table of rows replaced by key (a lease, a cursor): `columns` as DDL, `_version` added."""
    engine = table_engine(name, replacing=True, cluster=cluster)
    return (
        f"CREATE TABLE IF NOT EXISTS {_quote(name)}{on_cluster(cluster)} ({columns}, _version UInt64) "
        f"ENGINE = {engine} ORDER BY {order_by}"
    )


def on_cluster(cluster: str | None) -> str:
    return f" ON CLUSTER {_quote(cluster)}" if cluster else ""


# The OpenTelemetry Collector clickhouseexporter's traces table, as it creates it (column for column), so a
# team's existing table and one Tailwatch creates are read the same way.
OTEL_TRACES_COLUMNS: dict[str, str] = {
    "Timestamp": "DateTime64(9)",
    "TraceId": "String",
    "SpanId": "String",
    "ParentSpanId": "String",
    "TraceState": "String",
    "SpanName": "LowCardinality(String)",
    "SpanKind": "LowCardinality(String)",
    "ServiceName": "LowCardinality(String)",
    "ResourceAttributes": "Map(LowCardinality(String), String)",
    "ScopeName": "String",
    "ScopeVersion": "String",
    "SpanAttributes": "Map(LowCardinality(String), String)",
    "Duration": "UInt64",
    "StatusCode": "LowCardinality(String)",
    "StatusMessage": "String",
    "Events.Timestamp": "Array(DateTime64(9))",
    "Events.Name": "Array(LowCardinality(String))",
    "Events.Attributes": "Array(Map(LowCardinality(String), String))",
    "Links.TraceId": "Array(String)",
    "Links.SpanId": "Array(String)",
    "Links.TraceState": "Array(String)",
    "Links.Attributes": "Array(Map(LowCardinality(String), String))",
}


_DEDUP_WINDOW = f", {_WINDOW_SETTING} = {_WINDOW}"


def create_otel_traces(table: str, *, cluster: str | None, ttl_days: float | None) -> list[str]:
    """The exporter's table as its DDL makes it, created for `otel_traces: follow` when missing (and the table a
    store from before the view was fed), sharded by trace on a cluster."""
    ttl = ttl_clause("Timestamp", ttl_days) if ttl_days else ""
    engine = table_engine(table, replacing=False, cluster=cluster, sharded=True)
    created = f"""
CREATE TABLE IF NOT EXISTS {_quote(stored_in(table, cluster, sharded=True))}{on_cluster(cluster)} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (Timestamp DateTime64(9), Name LowCardinality(String),
                   Attributes Map(LowCardinality(String), String)) CODEC(ZSTD(1)),
    Links Nested (TraceId String, SpanId String, TraceState String,
                  Attributes Map(LowCardinality(String), String)) CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = {engine}
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))
{ttl}
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1{"" if cluster else _DEDUP_WINDOW}
"""
    return [created, distributed(table, cluster, OTEL_SHARDING)] if cluster else [created]


class SchemaMismatch(Exception):
    """An existing table lacks a column Tailwatch reads, or has it with another type."""


def check_otel_traces(client: ClickHouse, table: str) -> None:
    """Refuse an existing `otel_traces` whose columns are not the exporter's, naming the first that differs."""
    rows = client.arrow(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String}",
        {"t": table},
    ).to_pylist()
    have = {r["name"]: r["type"] for r in rows}
    for name, typ in OTEL_TRACES_COLUMNS.items():
        if name not in have:
            raise SchemaMismatch(
                f"{table} has no column {name} ({typ}): it is not the OpenTelemetry Collector clickhouseexporter's "
                f"traces layout that Tailwatch reads"
            )
        if _plain(have[name]) != _plain(typ):
            raise SchemaMismatch(
                f"{table}.{name} is {have[name]}, where the clickhouseexporter layout Tailwatch reads has {typ}"
            )


def _plain(typ: str) -> str:
    # LowCardinality is storage, not meaning; a time zone on the timestamp does not change what is read.
    out = typ.replace("LowCardinality(String)", "String")
    return out.replace("DateTime64(9, 'UTC')", "DateTime64(9)")


# Tailwatch's receivers insert each group of decoded spans once, into a Null table (it keeps nothing);
# materialized views fan the rows out to `spans` and, unless the user's own Collector fills it, to
# `otel_traces` in the exporter's layout: one insert, and the server does the reshaping.
INGEST_TABLE = "spans_ingest"


def _time9(column: str) -> str:
    return f"toDateTime64({column}, 9)"


def _micros(column: str) -> str:
    # Nanoseconds to microseconds rounded half away from zero, as DuckDB stores an Arrow nanosecond timestamp
    # (ClickHouse's own conversion truncates): the same span has the same times on both engines.
    ns = f"toUnixTimestamp64Nano({column})"
    return f"fromUnixTimestamp64Micro(if({ns} >= 0, intDiv({ns} + 500, 1000), -intDiv(500 - {ns}, 1000)), 'UTC')"


def _string_map(json_column: str) -> str:
    # The exporter stores every attribute value as text: a string as itself, anything else as its JSON.
    # The JSON is parsed once: the key-value pairs are mapped, then cast to the Map they already are.
    return (
        f"CAST(arrayMap(kv -> (kv.1, if(startsWith(kv.2, '\"'), JSONExtractString(kv.2), kv.2)), "
        f"JSONExtractKeysAndValuesRaw(ifNull({json_column}, '{{}}'))), 'Map(String, String)')"
    )


def _pascal(column: str) -> str:
    # SERVER -> Server, STATUS OK -> Ok: pdata's names, which the exporter writes.
    return f"concat(upper(substring({column}, 1, 1)), lower(substring({column}, 2)))"


def otel_select(source: str) -> str:
    """Spans of `source` (the ingest table, or `spans` itself) in the exporter's columns and types."""
    events = "JSONExtractArrayRaw(ifNull(events, '[]'))"
    links = "JSONExtractArrayRaw(ifNull(links, '[]'))"
    event_attributes = _string_map("JSONExtractRaw(e, 'attributes')")
    link_attributes = _string_map("JSONExtractRaw(l, 'attributes')")
    columns = {
        "Timestamp": _time9("start_time"),
        "TraceId": "trace_id",
        "SpanId": "span_id",
        "ParentSpanId": "ifNull(parent_span_id, '')",
        "TraceState": "''",
        "SpanName": "name",
        "SpanKind": _pascal("kind"),
        "ServiceName": "ifNull(service_name, '')",
        "ResourceAttributes": _string_map("resource"),
        "ScopeName": "ifNull(scope_name, '')",
        "ScopeVersion": "''",
        "SpanAttributes": _string_map("attributes"),
        "Duration": "toUInt64(greatest(toUnixTimestamp64Nano(end_time) - toUnixTimestamp64Nano(start_time), 0))",
        "StatusCode": _pascal("status_code"),
        "StatusMessage": "ifNull(status_message, '')",
        "Events.Timestamp": f"arrayMap(e -> fromUnixTimestamp64Nano(toInt64(JSONExtractUInt(e, 'time_unix_nano'))), "
        f"{events})",
        "Events.Name": f"arrayMap(e -> JSONExtractString(e, 'name'), {events})",
        "Events.Attributes": f"arrayMap(e -> {event_attributes}, {events})",
        "Links.TraceId": f"arrayMap(l -> JSONExtractString(l, 'trace_id'), {links})",
        "Links.SpanId": f"arrayMap(l -> JSONExtractString(l, 'span_id'), {links})",
        "Links.TraceState": f"arrayMap(l -> '', {links})",
        "Links.Attributes": f"arrayMap(l -> {link_attributes}, {links})",
    }
    listed = ",\n    ".join(
        f"CAST({expr} AS {OTEL_TRACES_COLUMNS[name]}) AS {_quote(name)}" for name, expr in columns.items()
    )
    return f"SELECT\n    {listed}\nFROM {source}"


def create_otel_view(table: str, *, cluster: str | None) -> str:
    """`otel_traces: write` on a new store: the exporter's layout as a view of `spans` read with FINAL, so each
    span is in it once whatever the retries (a table fed at ingest holds a regrouped retry twice)."""
    return f"CREATE VIEW IF NOT EXISTS {_quote(table)}{on_cluster(cluster)} AS {otel_select('spans FINAL')}"


SPANS_VIEW = f"{INGEST_TABLE}_to_spans"


def spans_view_query(spans: list[Column]) -> str:
    """What the view into `spans` stores of an ingested span: every column, the JSON ones too, so the console's
    trace view has a span's attributes whether or not an `otel_traces` is kept."""
    stored = ", ".join(
        f"{_micros(f'`{c.name}`')} AS `{c.name}`" if "DateTime64" in c.type else f"`{c.name}`" for c in spans
    )
    return f"SELECT {stored} FROM {INGEST_TABLE}"


def ingest_statements(spans: list[Column], *, otel_table: str | None, cluster: str | None) -> list[str]:
    """The Null table receivers insert into and the views that store its rows."""
    columns = ",\n".join(f"    `{c.name}` {c.type.replace('DateTime64(6', 'DateTime64(9')}" for c in spans)
    out = [
        f"CREATE TABLE IF NOT EXISTS {INGEST_TABLE}{on_cluster(cluster)} (\n{columns}\n) ENGINE = Null",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {SPANS_VIEW}{on_cluster(cluster)} TO spans "
        f"AS {spans_view_query(spans)}",
    ]
    if otel_table:
        out.append(
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {INGEST_TABLE}_to_otel_traces{on_cluster(cluster)} "
            f"TO `{otel_table}`\nAS {otel_select(INGEST_TABLE)}"
        )
    return out


def create_all(
    client: ClickHouse,
    tables: dict[str, list[Column]],
    spans_with_json: list[Column],
    *,
    otel_table: str,
    otel_traces: OtelTraces,
    cluster: str | None = None,
    ttl_days: float | None = None,
) -> bool:
    """Create what is missing; an existing `otel_traces` must be the exporter's layout (with `otel_traces: off`
    Tailwatch neither writes nor reads one). Whether receivers feed an `otel_traces` table (a store whose
    `write` table predates the view), which retention then deletes from too."""
    json_columns = [c for c in spans_with_json if c.name in SPAN_JSON_COLUMNS]
    for name, read in tables.items():
        # `spans` stores the JSON columns the request model never reads (evaluator.tables leaves them out).
        columns = [*read, *json_columns] if name == "spans" else read
        for statement in create_table(name, columns, cluster=cluster, ttl_days=ttl_days):
            client.command(statement)
        upgrade_table(client, name, columns, cluster=cluster)
        if (column := layout(name).ttl_column) is not None:
            keep_ttl(client, stored_in(name, cluster), column, ttl_days, cluster)
    fed: str | None = None  # an otel table receivers feed: a store from before `write` made it a view of spans
    if otel_traces != "off":
        engine = client.rows(
            "SELECT engine FROM system.tables WHERE database = currentDatabase() AND name = {t:String}",
            {"t": otel_table},
        )
        if not engine:
            created = (
                [create_otel_view(otel_table, cluster=cluster)]
                if otel_traces == "write"
                else create_otel_traces(otel_table, cluster=cluster, ttl_days=ttl_days)
            )
            for statement in created:
                client.command(statement)
        elif engine[0][0] == "View" and otel_traces == "follow":
            raise SchemaMismatch(
                f"{otel_table} is Tailwatch's view of spans (made by otel_traces: write), not a table a Collector "
                "fills: set storage.clickhouse.otel_table to the Collector's table"
            )
        elif engine[0][0] != "View" and otel_traces == "write":
            fed = otel_table
        check_otel_traces(client, otel_table)
        if fed:  # a table the user's Collector fills keeps the retention the user gave it
            keep_ttl(client, stored_in(fed, cluster, sharded=True), "Timestamp", ttl_days, cluster)
    if fed is None:  # the view is the database's, not a process's: a store that fed otel_traces stops
        client.command(f"DROP VIEW IF EXISTS {INGEST_TABLE}_to_otel_traces{on_cluster(cluster)}")
    for statement in ingest_statements(spans_with_json, otel_table=fed, cluster=cluster):
        client.command(statement)
    [(stored,)] = client.rows(
        "SELECT as_select FROM system.tables WHERE database = currentDatabase() AND name = {t:String}",
        {"t": SPANS_VIEW},
    )
    if not re.search(r"\battributes\b", str(stored)):  # a store from before spans kept the JSON columns
        query = spans_view_query(spans_with_json)
        client.command(f"ALTER TABLE {SPANS_VIEW}{on_cluster(cluster)} MODIFY QUERY {query}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS tailwatch_schema{on_cluster(cluster)} "
        "(version UInt32, applied_at DateTime DEFAULT now()) "
        f"ENGINE = {table_engine('tailwatch_schema', replacing=False, cluster=cluster)} ORDER BY version"
    )
    have = client.command("SELECT count() FROM tailwatch_schema WHERE version = {v:UInt32}", {"v": SCHEMA_VERSION})
    if not int(have):
        client.command("INSERT INTO tailwatch_schema (version) VALUES ({v:UInt32})", {"v": SCHEMA_VERSION})
    return fed is not None
