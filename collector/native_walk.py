"""The compiled walk (native/, a Rust extension built by scripts/setup where cargo exists), when present.

It returns what `collector.span_walk.walk` returns for the same bytes, through Arrow's C data
interface; `AVAILABLE` says whether it was built into this environment.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from collector.normalize import KeyValues
from collector.reasons import Rejections, SpanRejectReason
from collector.span_walk import Walked, malformed

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
        spans, span_values, span_json, resource_values, resource_json, rejected = _native.walk_traces(
            payload, list(span_keys), list(resource_keys), list(left_out)
        )
    except ValueError as exc:
        raise malformed(exc) from None
    rejections = Rejections()
    for reason, count, example in rejected:
        rejections.counts[SpanRejectReason(reason)] += count
        rejections.examples[SpanRejectReason(reason)] = example
    return Walked(
        pa.record_batch(spans),
        _values(span_values, span_json),
        _values(resource_values, resource_json),
        rejections,
    )


def _values(batch: Any, json_keys: list[str]) -> dict[str, KeyValues]:
    values = pa.record_batch(batch)
    mixed = set(json_keys)
    return {name: KeyValues(values.column(name), name in mixed) for name in values.schema.names}
