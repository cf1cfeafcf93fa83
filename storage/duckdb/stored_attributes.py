"""A span's attributes stored without the values its canonical columns already hold.

With `storage.attributes: split` the decoder leaves out of a span's `attributes` each value a canonical
column holds exactly, and says which in `attributes_moved`, one bit per entry of `MOVES`
(model/attribute_split.py, where "exactly" is defined). The writer stores them as they come, in
`attributes_rest` and `attributes_moved`; `spans` is a view over the stored rows (`span_rows`) whose
`attributes` puts the moved values back from their columns. A batch decoded whole (`storage.attributes:
whole`, or another caller's) has no `attributes_moved` and is stored with no bit set.

What an analyst reads does not change: `->`, `->>` and every JSON function answer as they would of the
JSON as sent. What changes is the raw text of `attributes`: the moved keys come after the others, and
their numbers are written as DuckDB writes them.

Adding an entry to `MOVES` needs its pair in the `spans` view's `attributes`
(storage/request_model/duckdb/00_spans.sql), which is `rebuild_sql()` (tests/test_stored_attributes.py holds
the two equal). The canonical column of a moved value must never be rewritten in place; settling engine facts
writes `engine_*` columns only.
"""

from __future__ import annotations

from functools import cache

import pyarrow as pa

from model.attribute_split import BITS, MOVES, Move
from model.columns import DERIVED, MOVED
from model.derived_columns import DURATION_REM, DURATION_REM_SQL
from storage.span_layout import SPAN_ROWS


def _value_sql(move: Move) -> str:
    """The attribute's value as its columns give it back (model/attribute_split.py's `_given_back`)."""
    over = [move.column] if move.plus is None else [move.column, move.plus]
    return " + ".join(f"{c} / {move.per}" if move.per != 1 else c for c in over)


@cache  # one statement per batch shape, not one built per commit
def insert_spans_sql(view: str, columns: tuple[str, ...]) -> str:
    """INSERT a registered batch of spans (`view`, with `columns` as the decoder writes them, `attributes_moved`
    among them: see `with_moved`) stamped with the one parameter, `ingested_at`."""
    kept = [c for c in columns if c not in ("attributes", MOVED.name, DERIVED.name)]
    names = ", ".join(kept)
    return (
        f"INSERT INTO {SPAN_ROWS} ({names}, attributes_rest, {MOVED.name}, {DERIVED.name}, {DURATION_REM}, "
        f"ingested_at) SELECT {names}, attributes, {MOVED.name}, {DERIVED.name}, {DURATION_REM_SQL}, ? FROM {view}"
    )


def with_moved(spans: pa.Table) -> pa.Table:
    """A decoded batch with `attributes_moved`: as the decoder split it, or no bit set when it came whole (so
    batches of both forms commit together)."""
    if MOVED.name in spans.schema.names:
        return spans
    spans = spans.append_column(MOVED, pa.repeat(pa.scalar(0, MOVED.type), spans.num_rows))
    return spans.append_column(DERIVED, pa.repeat(pa.scalar(0, DERIVED.type), spans.num_rows))


def rebuild_sql() -> str:
    """The `spans` view's `attributes`: `attributes_rest` with every moved value written back from its column, as text
    (no JSON parse): the rest's closing brace gives way to the moved pairs."""
    pairs = ", ".join(
        f"CASE WHEN attributes_moved & {BITS[m.key]} <> 0 THEN '\"{m.key}\":' || to_json({_value_sql(m)})::VARCHAR END"
        for m in MOVES
    )
    rest = "attributes_rest::VARCHAR"
    opening = f"CASE WHEN {rest} = '{{}}' THEN '{{' ELSE left({rest}, -1) || ',' END"
    return (
        "CASE WHEN attributes_moved IS NULL OR attributes_moved = 0 THEN attributes_rest "
        f"ELSE ({opening} || concat_ws(',', {pairs}) || '}}')::JSON END"
    )
