"""`ingest_spool`: how far the ingest spool is committed, updated in the same transaction as the spans.

The writer acknowledges a trace batch from the ingest spool when it is behind (storage/spool.py); at start
it replays the records past `committed_through` (a spool offset, in bytes). One row, 0 for a new database.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-25
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().exec_driver_sql("CREATE TABLE ingest_spool (committed_through BIGINT NOT NULL)")
    op.get_bind().exec_driver_sql("INSERT INTO ingest_spool VALUES (0)")


def downgrade() -> None:
    op.get_bind().exec_driver_sql("DROP TABLE ingest_spool")
