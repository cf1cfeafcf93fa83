"""Derived columns are stored as NULL with a bit in `columns_derived`, and `spans` derives them when read.

`tpot_ms` and `cache_hit_ratio` are usually normalization's derivations from other columns (vLLM sends
neither): about 7 bytes a span each, stored for nothing. The decoder now stores such a value as NULL and
sets its bit (model/derived_columns.py); the view reads the column through a subquery that puts the
value back with the rule's SQL, so every expression of the view (the attributes written back from their
columns among them) reads it derived.

Rows stored before keep their values, with no bit (NULL). No row is copied on the way up; the way down
writes every derived value back into its column first.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-24
"""

from alembic import op

from migrations.spans_view import definition, redefine

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# The rules as this migration defines them (model/derived_columns.py, read_sql; a test holds them equal).
_AFTER_FIRST = "(output_tokens::DOUBLE - 1.0)"
_READS = {
    "tpot_ms": f"CASE WHEN columns_derived & 1 <> 0 THEN CASE WHEN output_tokens >= 2 THEN coalesce(decode_ms / "
    f"{_AFTER_FIRST}, CASE WHEN e2e_ms >= ttft_ms THEN (e2e_ms - ttft_ms) / {_AFTER_FIRST} END) END ELSE tpot_ms END",
    "cache_hit_ratio": "CASE WHEN columns_derived & 2 <> 0 THEN CASE WHEN input_tokens > 0 THEN "
    "least(greatest(cached_input_tokens::DOUBLE / input_tokens::DOUBLE, 0.0), 1.0) END ELSE cache_hit_ratio END",
}
_FROM = " FROM span_rows"


def _derived_from() -> str:
    """The view's FROM: span_rows, each derived column read through its rule (every column named: DuckDB
    writes a `* REPLACE` list back in no fixed order)."""
    rows = op.get_bind().exec_driver_sql(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'span_rows' ORDER BY column_index"
    )
    names = [name for (name,) in rows.fetchall()]
    inner = ", ".join(f"{_READS[c]} AS {c}" if c in _READS else f'"{c}"' for c in names)
    return f", columns_derived FROM (SELECT {inner} FROM span_rows) AS span_rows"


def upgrade() -> None:
    view = definition()
    if not view.endswith(_FROM) or view.count(_FROM) != 1:
        raise RuntimeError(f"spans is not defined as expected: it does not end {_FROM!r}")
    op.execute("ALTER TABLE span_rows ADD COLUMN columns_derived UTINYINT")
    redefine(view.removesuffix(_FROM) + _derived_from())


def downgrade() -> None:
    sets = ", ".join(f"{column} = {sql}" for column, sql in _READS.items())
    op.execute(f"UPDATE span_rows SET {sets} WHERE columns_derived <> 0")
    view = definition()
    at = view.rfind(", columns_derived FROM (")
    if at < 0:
        raise RuntimeError("spans is not defined as expected: it does not read columns_derived")
    redefine(view[:at] + _FROM)
    op.execute("ALTER TABLE span_rows DROP COLUMN columns_derived")
