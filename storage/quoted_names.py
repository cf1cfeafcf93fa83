"""Column names of the request model, checked and quoted for SQL: the same in DuckDB's and ClickHouse's dialects."""

from __future__ import annotations

import re

_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def column_name(name: str) -> str:
    # Column names come from detector code and from config (clusters' extra_dimensions): they are
    # checked and quoted, never pasted.
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a column name of the request model")
    return f'"{name}"'
