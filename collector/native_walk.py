"""The compiled walk (native/, a Rust extension built by scripts/setup where cargo exists), when present.

It returns what `collector.span_walk.walk` returns for the same bytes, through Arrow's C data
interface; `AVAILABLE` says whether it was built into this environment.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from collector import span_scores
from collector.normalize import KeyValues
from collector.reasons import Rejections, SpanRejectReason
from collector.scores import score_table
from collector.span_walk import Walked, malformed
from model.columns import SCORE_BATCH_SCHEMA

_native: Any
try:
    import tailwatch_native as _native  # type: ignore[import-not-found,no-redef,unused-ignore]
except ImportError:  # no Rust toolchain where this was installed: the Python walk serves
    _native = None

AVAILABLE = _native is not None


def walk(
    payload: bytes, span_keys: tuple[str, ...], resource_keys: tuple[str, ...], left_out: tuple[str, ...] = ()
) -> Walked:
    """Walk one serialized ExportTraceServiceRequest in the compiled decoder."""
    if _native is None:
        raise RuntimeError("the compiled decoder is not installed (scripts/setup builds it where cargo exists)")
    try:
        spans, span_values, span_json, resource_values, resource_json, rejected, scores, first, left = (
            _native.walk_traces(payload, list(span_keys), list(resource_keys), list(left_out))
        )
    except ValueError as exc:
        raise malformed(exc) from None
    rejections = Rejections()
    for reason, count, example in rejected:
        rejections.counts[SpanRejectReason(reason)] += count
        rejections.examples[SpanRejectReason(reason)] = example
    batch = pa.record_batch(spans)
    return Walked(
        batch,
        _values(span_values, span_json),
        _values(resource_values, resource_json),
        rejections,
        _scores(batch, pa.Table.from_batches([pa.record_batch(scores)]), left),
        pa.record_batch(first).column(0),
    )


def _scores(spans: pa.RecordBatch, compiled: pa.Table, left: list[int]) -> pa.Table:
    """The compiled walk's scores with those of the spans it left to the reference, in row order."""
    if left:
        _, found = span_scores.read(spans, left)
        theirs = score_table([score for _, score in found])
        theirs = theirs.append_column("row", pa.array([row for row, _ in found], pa.int32()))
        compiled = pa.concat_tables([compiled, theirs.cast(compiled.schema)])
        compiled = compiled.take(pc.sort_indices(compiled["row"]))  # stable: a span's own order stays
    return compiled.drop_columns(["row"]).cast(SCORE_BATCH_SCHEMA)


def _values(batch: Any, json_keys: list[str]) -> dict[str, KeyValues]:
    values = pa.record_batch(batch)
    mixed = set(json_keys)
    return {name: KeyValues(values.column(name), name in mixed) for name in values.schema.names}
