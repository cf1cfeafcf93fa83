"""Reading an `otel_traces` table someone else's Collector fills, in the shape the decoders' walk produces.

The rows come back as the walk's columns (collector/span_walk.py WALK_SCHEMA) and the attribute keys the
normalization plan reads, so the one normalization (collector.decode.finish) turns them into Tailwatch's
spans exactly as it does spans arriving over OTLP. The exporter keeps every attribute value as text; the
plan's converters read numbers from text as they do from numbers.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from storage.clickhouse.client import ClickHouse
from storage.clickhouse.schema import create_replaced, versioned

_CURSOR = "tailwatch_follow_cursor"
# Rows are read by end time; their start bounds what is scanned (the table is sorted and partitioned by it). A
# span that lasted longer than this is not followed: no LLM request does.
LONGEST_SPAN_HOURS = 24


class ClickHouseOtelTraces:
    def __init__(self, client: ClickHouse, table: str, cluster: str | None = None) -> None:
        self._client = client
        self._table = table
        client.command(
            create_replaced(_CURSOR, "otel_table String, cursor DateTime64(9, 'UTC')", "otel_table", cluster)
        )

    def oldest(self) -> datetime | None:
        value = self._client.arrow(f"SELECT min(Timestamp) AS t FROM `{self._table}`").column(0)[0].as_py()
        return None if value is None or value.year <= 1970 else value

    def cursor(self) -> datetime | None:
        rows = (
            self._client.arrow(f"SELECT cursor FROM {_CURSOR} WHERE otel_table = {{t:String}}", {"t": self._table})
            .column(0)
            .to_pylist()
        )
        return rows[0] if rows else None

    def advance(self, to: datetime) -> None:
        row = {"otel_table": [self._table], "cursor": pa.array([to], pa.timestamp("ns"))}
        self._client.insert(_CURSOR, versioned(pa.table(row)))

    def walk_rows(
        self, since: datetime, until: datetime, span_keys: tuple[str, ...], resource_keys: tuple[str, ...]
    ) -> pa.Table:
        """Spans that ended in [since, until): the walk's columns, then `s<i>` for span_keys[i] and `r<i>` for
        resource_keys[i] (NULL where the span lacks the key). By end, not start: a Collector writes a span when
        it ends, so a 3-minute request lands long after later, shorter ones that started after it."""
        params: dict[str, object] = {"since": since, "until": until}
        gathered = []
        for prefix, column, keys in (("s", "SpanAttributes", span_keys), ("r", "ResourceAttributes", resource_keys)):
            for i, key in enumerate(keys):
                params[f"{prefix}{i}"] = key
                gathered.append(
                    f"if(mapContains({column}, {{{prefix}{i}:String}}), {column}[{{{prefix}{i}:String}}], NULL) "
                    f"AS {prefix}{i}"
                )
        events = (
            "arrayMap((t, n, a) -> CAST((toUnixTimestamp64Nano(t), n, a), "
            "'Tuple(time_unix_nano Int64, name String, attributes Map(String, String))'), "
            "`Events.Timestamp`, `Events.Name`, `Events.Attributes`)"
        )
        links = (
            "arrayMap((t, s, a) -> CAST((t, s, a), 'Tuple(trace_id String, span_id String, "
            "attributes Map(String, String))'), `Links.TraceId`, `Links.SpanId`, `Links.Attributes`)"
        )
        status = "upper(replaceRegexpOne(StatusCode, '^(STATUS_CODE_)', ''))"
        sql = f"""
            SELECT TraceId AS trace_id, SpanId AS span_id, nullIf(ParentSpanId, '') AS parent_span_id,
                   SpanName AS name, upper(replaceRegexpOne(SpanKind, '^(SPAN_KIND_)', '')) AS kind,
                   Timestamp AS start_time, Timestamp + toIntervalNanosecond(Duration) AS end_time,
                   Duration / 1e6 AS duration_ms, if({status} = '', 'UNSET', {status}) AS status_code,
                   nullIf(StatusMessage, '') AS status_message, nullIf(ServiceName, '') AS service_name,
                   nullIf(ScopeName, '') AS scope_name, toJSONString(SpanAttributes) AS attributes,
                   toJSONString(ResourceAttributes) AS resource,
                   if(empty(`Events.Name`), NULL, toJSONString({events})) AS events,
                   if(empty(`Links.SpanId`), NULL, toJSONString({links})) AS links
                   {"".join(", " + g for g in gathered)}
            FROM `{self._table}`
            WHERE Timestamp >= {{since:DateTime64(9)}} - INTERVAL {LONGEST_SPAN_HOURS} HOUR
              AND Timestamp < {{until:DateTime64(9)}}
              AND Timestamp + toIntervalNanosecond(Duration) >= {{since:DateTime64(9)}}
              AND Timestamp + toIntervalNanosecond(Duration) < {{until:DateTime64(9)}}
              AND TraceId <> '' AND SpanId <> ''
        """
        return self._client.arrow(sql, params, {"output_format_json_named_tuples_as_objects": 1})
