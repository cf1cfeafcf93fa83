"""`duration_ms` is stored as NULL where the times give it back, and `spans` reads it from them.

A span's duration is end − start in nanoseconds over 10^6, a full-precision double (~6.5 bytes a span
stored). The times are stored to the microsecond, so what they lost of the difference is all that is
missing: `duration_rem_ns`, −1000..1000, about 2 bytes. The decoder leaves the duration NULL wherever the
rule gives it back bit for bit (model/derived_columns.py, `leave_duration`); `duration_ms` is never
NULL as decoded, so the NULL needs no bit. The `spans` view reads it through the rule
(storage/request_model/duckdb/00_spans.sql, which this revision once edited), so every expression of the
view sees it as decoded.

No row is copied on the way up. The way down writes every derived duration back into its column first.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-25
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# The rule as this migration defined it (model/derived_columns.py's DURATION_READ_SQL), for the way down.
_READ = (
    "CASE WHEN duration_ms IS NULL THEN ((epoch_us(end_time) - epoch_us(start_time)) * 1000 + duration_rem_ns)"
    "::DOUBLE / 1e6 ELSE duration_ms END"
)


def upgrade() -> None:
    op.execute("ALTER TABLE span_rows ALTER COLUMN duration_ms DROP NOT NULL")
    op.execute("ALTER TABLE span_rows ADD COLUMN duration_rem_ns SMALLINT")


def downgrade() -> None:
    # Rewritten rather than UPDATEd: DuckDB cannot set NOT NULL in a transaction with updates outstanding.
    op.execute(f"ALTER TABLE span_rows ALTER COLUMN duration_ms TYPE DOUBLE USING {_READ}")
    op.execute("ALTER TABLE span_rows DROP COLUMN duration_rem_ns")
    op.execute("ALTER TABLE span_rows ALTER COLUMN duration_ms SET NOT NULL")
