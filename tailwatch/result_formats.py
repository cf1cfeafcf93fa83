"""Query results as JSON, CSV, Arrow IPC and a terminal table: one encoding for the API and the CLI."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import uuid
from typing import Any

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.csv as pa_csv

ARROW_STREAM = "application/vnd.apache.arrow.stream"
FORMATS = {"json": "application/json", "csv": "text/csv", "arrow": ARROW_STREAM}
TRUNCATED_HEADER = "X-Tailwatch-Truncated"


def _default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, pa.MonthDayNano):
        return _duration(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def _duration(value: pa.MonthDayNano) -> str:
    """A DuckDB INTERVAL as ISO 8601: months and days are calendar units and stay apart from seconds."""
    return f"P{value.months}M{value.days}DT{value.nanoseconds / 1e9:g}S"


def _plain(value: Any, kind: pa.DataType) -> Any:
    """Arrow MAPs come out of to_pylist as lists of pairs; JSON readers expect objects."""
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {str(k): _plain(v, kind.item_type) for k, v in value}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [_plain(v, kind.value_type) for v in value]
    if pa.types.is_struct(kind):
        return {f.name: _plain(value[f.name], f.type) for f in kind}
    if pa.types.is_interval(kind):
        return _duration(value)
    return value


def _nested(kind: pa.DataType) -> bool:
    # Intervals too: neither CSV nor a terminal table has a type for months-days-nanoseconds.
    return bool(pa.types.is_nested(kind) or pa.types.is_interval(kind))


def rows(table: pa.Table) -> list[list[Any]]:
    """Rows of plain Python values: nested values as lists and dicts."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        values = column.to_pylist()
        columns.append([_plain(v, field.type) for v in values] if _nested(field.type) else values)
    return [list(row) for row in zip(*columns, strict=True)] if columns else []


def records(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as objects keyed by column name, for JSON bodies that are not query results."""
    return [dict(zip(table.column_names, row, strict=True)) for row in rows(table)]


def dumps(body: Any) -> bytes:
    """JSON as every endpoint writes it: naive timestamps marked UTC, NaN and infinities as null."""
    return orjson.dumps(body, default=_default, option=orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z)


def to_json(table: pa.Table, types: list[str], truncated: bool) -> bytes:
    """The contract's shape: columns with their DuckDB types, rows as arrays, and the truncated flag."""
    body = {
        "columns": [{"name": name, "type": kind} for name, kind in zip(table.column_names, types, strict=True)],
        "rows": rows(table),
        "truncated": truncated,
    }
    # Timestamps are UTC without an offset in storage; say so on the wire.
    return dumps(body)


def _flat(table: pa.Table) -> pa.Table:
    # CSV has no nested values: lists, maps and structs become their JSON text, intervals ISO 8601.
    for i, field in enumerate(table.schema):
        if _nested(field.type):
            plain = [_plain(v, field.type) for v in table.column(i).to_pylist()]
            text = [v if v is None or isinstance(v, str) else orjson.dumps(v, default=_default).decode() for v in plain]
            table = table.set_column(i, field.name, pa.array(text, pa.string()))
    return table


def to_csv(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pa_csv.write_csv(_flat(table), sink)
    return sink.getvalue()


def to_arrow_stream(table: pa.Table, truncated: bool) -> bytes:
    """An Arrow IPC stream; the truncated flag also rides in the schema metadata for readers of the bytes alone."""
    schema = table.schema.with_metadata({**(table.schema.metadata or {}), b"truncated": str(truncated).lower()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table.replace_schema_metadata(schema.metadata))
    return bytes(sink.getvalue().to_pybytes())


def to_text(table: pa.Table) -> str:
    """A table for a terminal, every row and column shown."""
    frame = pl.from_arrow(_flat(table))
    if not isinstance(frame, pl.DataFrame):  # a table always gives a DataFrame; this tells the type checker
        raise TypeError(f"polars gave a {type(frame).__name__} for an Arrow table")
    with pl.Config(
        tbl_rows=-1,
        tbl_cols=-1,
        tbl_width_chars=32_767,  # never wrap a cell (the most polars takes): a wide table scrolls
        fmt_str_lengths=200,
        tbl_hide_dataframe_shape=True,
        tbl_hide_column_data_types=True,
    ):
        return str(frame)
