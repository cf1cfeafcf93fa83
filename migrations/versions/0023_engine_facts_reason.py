"""Settled spans say why engine facts are missing.

`span_rows` gains `engine_facts_reason`: stored with the other settled engine facts, NULL when its replica's
facts are complete, else `no_replica`, `no_points_for_replica`, `stale` or `source_behind`
(docs/engine-metrics.md). A span may now settle before every source has reported past it, once its own
replica's has, or with what exists after a bounded wait, and an analyst must be able to tell which. Spans
settled before it hold NULL.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE span_rows ADD COLUMN engine_facts_reason VARCHAR")


def downgrade() -> None:
    op.execute("ALTER TABLE span_rows DROP COLUMN engine_facts_reason")
