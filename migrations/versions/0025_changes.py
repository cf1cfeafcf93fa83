"""Changes: what changed in the fleet, found from the data itself.

`changes` keeps one row per change (docs/changes.md): a deployment's replicas replaced (`rollout`), a version or
serving attribute changed on running replicas (`version`, `config`), or its replica count stepped (`scale`), with
the replicas and deployment it touched and the attributes that differ before and after. Rows are found again on
every pass over the lookback and kept in place by their id; none is deleted.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE changes (
            change_id VARCHAR PRIMARY KEY,
            "at" TIMESTAMP NOT NULL,
            kind VARCHAR NOT NULL,
            scope JSON NOT NULL,
            "before" JSON NOT NULL,
            "after" JSON NOT NULL,
            summary VARCHAR NOT NULL,
            found_at TIMESTAMP NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE changes")
