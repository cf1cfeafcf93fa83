"""`duration_ms` is stored as NULL where the times give it back, and `spans` reads it from them.

A span's duration is end − start in nanoseconds over 10^6, a full-precision double (~6.5 bytes a span
stored). The times are stored to the microsecond, so what they lost of the difference is all that is
missing: `duration_rem_ns`, −1000..1000, about 2 bytes. The decoder leaves the duration NULL wherever the
rule gives it back bit for bit (model/derived_columns.py, `leave_duration`); `duration_ms` is never
NULL as decoded, so the NULL needs no bit. The view's subquery (migration 0018) reads it through the rule,
so every expression of the view sees it as decoded.

No row is copied on the way up. The way down writes every derived duration back into its column first.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-25
"""

from alembic import op

from migrations.spans_view import definition, redefine

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# The rule as this migration defines it (model/derived_columns.py's DURATION_READ_SQL; a test holds them equal).
_READ = (
    "CASE WHEN duration_ms IS NULL THEN ((epoch_us(end_time) - epoch_us(start_time)) * 1000 + duration_rem_ns)"
    "::DOUBLE / 1e6 ELSE duration_ms END"
)
_INNER = " FROM (SELECT "  # where migration 0018's subquery starts
_PLAIN = " end_time, duration_ms, status_code,"
# How each column list ends, twice: the view's own, then the subquery's.
_LAST = ", columns_derived FROM "
_ADDED = ", columns_derived, duration_rem_ns FROM "


def _split(view: str, last: str) -> tuple[str, str]:
    """The view up to its subquery, and the subquery, each column list ending with `last`."""
    at = view.find(_INNER)
    if at < 0 or view.count(last) != 2:
        raise RuntimeError("spans is not defined as expected: it does not read span_rows through a subquery")
    return view[:at], view[at:]


def upgrade() -> None:
    outer, inner = _split(definition(), _LAST)
    if inner.count(_PLAIN) != 1:
        raise RuntimeError(f"spans is not defined as expected: {_PLAIN!r} is not in its subquery once")
    op.execute("ALTER TABLE span_rows ALTER COLUMN duration_ms DROP NOT NULL")
    op.execute("ALTER TABLE span_rows ADD COLUMN duration_rem_ns SMALLINT")
    inner = inner.replace(_PLAIN, f" end_time, {_READ} AS duration_ms, status_code,", 1)
    redefine((outer + inner).replace(_LAST, _ADDED))


def downgrade() -> None:
    # Rewritten rather than UPDATEd: DuckDB cannot set NOT NULL in a transaction with updates outstanding.
    op.execute(f"ALTER TABLE span_rows ALTER COLUMN duration_ms TYPE DOUBLE USING {_READ}")
    outer, inner = _split(definition(), _ADDED)
    start = inner.find(" end_time, CASE ")
    end = inner.find(" AS duration_ms, status_code,", start)
    if start < 0 or end < 0 or "duration_rem_ns" not in inner[start:end]:
        raise RuntimeError("spans is not defined as expected: it does not read duration_ms from the times")
    inner = inner[:start] + _PLAIN + inner[end + len(" AS duration_ms, status_code,") :]
    redefine((outer + inner).replace(_ADDED, _LAST))
    op.execute("ALTER TABLE span_rows DROP COLUMN duration_rem_ns")
    op.execute("ALTER TABLE span_rows ALTER COLUMN duration_ms SET NOT NULL")
