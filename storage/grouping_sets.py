"""A request summary's GROUPING SETS as SQL, the same in DuckDB's and ClickHouse's dialects."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from storage.ports import RequestSummary


@dataclass(frozen=True)
class GroupingSql:
    columns: list[str]  # every column some set groups by, in first-seen order
    names: str  # those columns, quoted, comma-separated ("" with none)
    which: str  # the index of the row's grouping set: an integer expression
    sets: str  # the GROUPING SETS list


def grouping_sql(read: RequestSummary, quote: Callable[[str], str]) -> GroupingSql:
    """The summary's grouping in SQL; `quote` checks and quotes a column name."""
    if len(set(map(frozenset, read.grouping_sets))) != len(read.grouping_sets):
        raise ValueError("each grouping set must group by different columns")
    grouped = list(dict.fromkeys(c for s in read.grouping_sets for c in s))
    # GROUPING(c1..cn) sets bit n-1-j when cj is not grouped (both engines): each set has its own mask.
    masks = [sum(1 << (len(grouped) - 1 - j) for j, c in enumerate(grouped) if c not in s) for s in read.grouping_sets]
    names = ", ".join(map(quote, grouped))
    which = (
        f"CASE GROUPING({names}) " + " ".join(f"WHEN {m} THEN {i}" for i, m in enumerate(masks)) + " END"
        if grouped
        else "0"
    )
    sets = ", ".join(f"({', '.join(map(quote, s))})" for s in read.grouping_sets)
    return GroupingSql(grouped, names, which, sets)
