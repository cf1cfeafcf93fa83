"""Derived columns are stored as NULL with a bit in `columns_derived`, and `spans` derives them when read.

`tpot_ms` and `cache_hit_ratio` are usually normalization's derivations from other columns (vLLM sends
neither): about 7 bytes a span each, stored for nothing. The decoder now stores such a value as NULL and
sets its bit (model/derived_columns.py); the `spans` view reads the column through the rule's SQL
(storage/request_model/duckdb/00_spans.sql, which this revision once edited).

Rows stored before keep their values, with no bit (NULL). No row is copied on the way up; the way down
writes every derived value back into its column first.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-24
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# The rules as this migration defined them (model/derived_columns.py's read_sql), for the way down.
_AFTER_FIRST = "(output_tokens::DOUBLE - 1.0)"
_READS = {
    "tpot_ms": f"CASE WHEN columns_derived & 1 <> 0 THEN CASE WHEN output_tokens >= 2 THEN coalesce(decode_ms / "
    f"{_AFTER_FIRST}, CASE WHEN e2e_ms >= ttft_ms THEN (e2e_ms - ttft_ms) / {_AFTER_FIRST} END) END ELSE tpot_ms END",
    "cache_hit_ratio": "CASE WHEN columns_derived & 2 <> 0 THEN CASE WHEN input_tokens > 0 THEN "
    "least(greatest(cached_input_tokens::DOUBLE / input_tokens::DOUBLE, 0.0), 1.0) END ELSE cache_hit_ratio END",
}


def upgrade() -> None:
    op.execute("ALTER TABLE span_rows ADD COLUMN columns_derived UTINYINT")


def downgrade() -> None:
    sets = ", ".join(f"{column} = {sql}" for column, sql in _READS.items())
    op.execute(f"UPDATE span_rows SET {sets} WHERE columns_derived <> 0")
    op.execute("ALTER TABLE span_rows DROP COLUMN columns_derived")
