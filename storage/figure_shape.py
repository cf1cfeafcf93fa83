"""A range of figures shaped to what a page can draw, the newest always in it (both backends).

A week of 5-minute windows over many tenants or replicas holds more rows than a chart can use or a page
should fetch. Cut oldest first under a row cap, the range silently ended early: its newest windows, the
ones an operator came to see, were the ones dropped. Instead, when a range holds more rows than the cap,
every `stride`-th window is kept counting back from the newest, so the whole range is drawn at a coarser
grain (figures are not merged: a p99 of p99s is no p99); whatever still exceeds the cap is cut from the
oldest end. The answer says both, and the console says so on the page.
"""

from __future__ import annotations

import pyarrow as pa


def stride(rows: int, limit: int) -> int:
    """Every how many windows to keep so that `rows` spread evenly over them come to at most `limit`."""
    return max(1, -(-rows // max(limit, 1)))


def thinned(in_range: str, rows: int, limit: int, series: bool) -> tuple[str, int]:
    """`in_range` (a `FROM … WHERE …` over the figures table) keeping every stride-th window counting back from
    the newest, and the stride; as it was, and 1, when the rows fit or are not a time series (`series`: the
    rows carry window_end). The condition repeats `in_range`, so its parameters come twice."""
    step = stride(rows, limit)
    if step == 1 or not series:
        return in_range, 1
    return (
        f"{in_range} AND window_end IN (SELECT window_end FROM (SELECT window_end, row_number() OVER "
        f"(ORDER BY window_end DESC) - 1 AS back FROM (SELECT DISTINCT window_end {in_range})) "
        f"WHERE back % {step} = 0)",
        step,
    )


def oldest_first(newest_first: pa.Table) -> pa.Table:
    """Rows read newest first (so a cap cuts the oldest) in the order a page draws them."""
    return newest_first.take(pa.array(range(newest_first.num_rows - 1, -1, -1), pa.int64()))
