"""The spans' `attributes` column compressed with ZSTD: about 2.1 times fewer bytes per stored span.

The attributes JSON was about seventy percent of a stored span: DuckDB picks dictionary + FSST for every
string column, which takes the JSON of a span with twenty attributes from ~750 bytes to ~260. ZSTD over
the same column takes it to ~120 (docs/benchmarks.md, storage cost). DuckDB compresses at checkpoint,
so inserts cost the same; reading the column decompresses it, and the other columns are read as before.

DuckDB cannot change a column's compression in place, so the table is rebuilt once: the upgrade needs
free space for a second copy of the spans while it runs. No view or macro reads `spans` while it does: the
request model is dropped before a migration and applied again at the newest revision.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-23
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_PLAIN = "attributes JSON,"
_ZSTD = "attributes JSON USING COMPRESSION ZSTD,"  # as DuckDB writes it back


def _rebuild(before: str, after: str) -> None:
    """Recreate `spans` from its own definition with `before` replaced by `after`, keeping every row."""
    definition = str(
        op.get_bind().exec_driver_sql("SELECT sql FROM duckdb_tables() WHERE table_name = 'spans'").fetchall()[0][0]
    )
    if before not in definition:
        raise RuntimeError(f"spans is not defined as expected: {before!r} not found in {definition!r}")
    rebuilt = definition.replace("CREATE TABLE spans(", "CREATE TABLE spans_rebuilt(", 1).replace(before, after, 1)
    op.execute(rebuilt)
    op.execute("INSERT INTO spans_rebuilt SELECT * FROM spans")
    op.execute("DROP TABLE spans")
    op.execute("ALTER TABLE spans_rebuilt RENAME TO spans")


def upgrade() -> None:
    _rebuild(_PLAIN, _ZSTD)


def downgrade() -> None:
    _rebuild(_ZSTD, _PLAIN)
