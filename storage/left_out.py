"""Leaving a detector's breached windows out of a summary (ports.Breached), the same on both backends.

The breached figures rows of the summary's window are read first (a handful: one per window and group
that breached) and merged into ranges per group; the summary then leaves out the requests in them with one
predicate over the request model. Read this way rather than joined, the predicate holds plain values, so
the ClickHouse summary computed in a loaded evaluation gets it as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import pyarrow as pa

from storage.ports import MAX_LEFT_OUT, Breached, LeftOut, RequestSummary
from storage.quoted_names import column_name


def breached_sql(leave_out: Breached, start: str, end: str) -> str:
    """The figures rows that breached in windows overlapping [start, end) (placeholders of the backend)."""
    columns = ", ".join(column_name(c) for c in (*leave_out.keys, *leave_out.optional))
    return (
        f"SELECT window_start, window_end, {columns} FROM {column_name(leave_out.detector)} "
        f"WHERE breached AND window_start < {end} AND window_end > {start}"
    )


def resolved(read: RequestSummary, rows: pa.Table) -> RequestSummary:
    """The read with its breached rows as ranges: contiguous windows of a group merged, the newest kept."""
    leave_out = read.leave_out
    if leave_out is None:
        return read
    columns = (*leave_out.keys, *leave_out.optional)
    merged: dict[tuple[Any, ...], list[list[datetime]]] = {}
    for row in sorted(rows.to_pylist(), key=lambda r: r["window_start"]):
        group = tuple(row[c] for c in columns)
        spans = merged.setdefault(group, [])
        if spans and row["window_start"] <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], row["window_end"])
        else:
            spans.append([row["window_start"], row["window_end"]])
    ranges = sorted(
        (LeftOut(start, end, tuple(zip(columns, group, strict=True))) for group, spans in merged.items()
         for start, end in spans),
        key=lambda r: (r.end, r.start),
    )  # fmt: skip
    return replace(read, leave_out=replace(leave_out, ranges=tuple(ranges[-MAX_LEFT_OUT:])))


def columns(read: RequestSummary) -> list[str]:
    """The request model's columns the predicate reads."""
    return [] if read.leave_out is None else ["end_time", *read.leave_out.keys, *read.leave_out.optional]


def predicate(leave_out: Breached, param: Callable[[object], str]) -> str:
    """`NOT (...)` over the request model's columns, or '' when nothing is left out; `param` turns a value
    into the backend's placeholder (and keeps the value)."""
    if not leave_out.ranges:
        return ""
    terms = []
    for r in leave_out.ranges:
        match = [f"end_time >= {param(r.start)}", f"end_time < {param(r.end)}"]
        for column, value in r.values:
            name = column_name(column)
            if value is None:
                if column not in leave_out.optional:
                    match.append(f"{name} IS NULL")
            else:
                match.append(f"{name} = {param(value)}")
        terms.append(f"({' AND '.join(match)})")
    return f"NOT ({' OR '.join(terms)})"
