"""Following an `otel_traces` table a Collector fills: its new rows become Tailwatch spans.

For teams whose OpenTelemetry Collector already writes spans to ClickHouse with the clickhouseexporter:
Tailwatch's receivers stay off and this job reads the rows that ended since its cursor (held back by a
lag, so the Collector's batches have landed; by end, because a span is written when it ends), turns them
into the walk's shape and hands them to the one normalization the OTLP decoders use, then to the sink. The
cursor moves only once the sink stored a chunk; a chunk read again is stored again harmlessly (spans are
keyed by trace and span).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa

from collector import span_scores
from collector.decode import finish
from collector.normalize import KeyValues, Plan
from collector.reasons import Rejections
from collector.span_walk import WALK_SCHEMA, Walked
from storage.ports import OtelTracesRows, SpanSink

log = logging.getLogger(__name__)
CHUNK = timedelta(minutes=1)


def walked(rows: pa.Table, span_keys: tuple[str, ...], resource_keys: tuple[str, ...]) -> Walked:
    """The walk's result for rows read from otel_traces: each span is its own resource row."""
    n = rows.num_rows
    # Nothing is left out of the attributes (ClickHouse stores them whole).
    made = {"resource_index": pa.array(np.arange(n, dtype=np.int32)), "left_out": pa.nulls(n, pa.string())}
    columns = [made[f.name] if f.name in made else rows.column(f.name).cast(f.type) for f in WALK_SCHEMA]
    batch = pa.RecordBatch.from_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns],
                                       schema=WALK_SCHEMA)  # fmt: skip

    def gathered(prefix: str, keys: tuple[str, ...]) -> dict[str, KeyValues]:
        out = {}
        for i, key in enumerate(keys):
            values = rows.column(f"{prefix}{i}").combine_chunks().cast(pa.string())
            if values.null_count < n:
                out[key] = KeyValues(values)
        return out

    return Walked(
        batch, gathered("s", span_keys), gathered("r", resource_keys), Rejections(), *span_scores.of_spans(batch)
    )


class Follower:
    def __init__(
        self,
        rows: OtelTracesRows,
        sink: SpanSink,
        plan: Plan,
        *,
        lag: timedelta,
        start: Callable[[], datetime],
    ) -> None:
        self._rows = rows
        self._sink = sink
        self._plan = plan
        self._lag = lag
        self._start = start  # where a first run begins when the table holds older rows

    def run_once(self, now: datetime) -> int:
        """Store the rows that ended up to `now - lag`; returns how many spans were handed on."""
        keys = (self._plan.walk_span_keys, self._plan.walk_resource_keys)
        cursor = self._rows.cursor()
        if cursor is None:
            oldest = self._rows.oldest()
            cursor = max(oldest, self._start()) if oldest is not None else None
        until = now - self._lag
        stored = 0
        while cursor is not None and cursor < until:
            high = min(cursor + CHUNK, until)
            rows = self._rows.walk_rows(cursor, high, *keys)
            if rows.num_rows:
                decoded = finish(walked(rows, *keys), self._plan)
                future = self._sink.try_submit(decoded.spans, decoded.scores)
                if future is None:  # the sink is full: the next run goes on from here
                    break
                future.result()
                stored += rows.num_rows
            self._rows.advance(high)
            cursor = high
        return stored
