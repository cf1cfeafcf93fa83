"""Clusters list the clusters that are the same requests.

`clusters` gains `same_requests`: a JSON array of the clusters that passed in the same window and are the
reported cluster's bad requests seen through another dimension or symptom (`{"signature": {...}, "symptom":
"..."}` each, best first; `[]` when none), so one cause is one row. Rows stored before it hold NULL.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE clusters ADD COLUMN same_requests JSON")


def downgrade() -> None:
    op.execute("ALTER TABLE clusters DROP COLUMN same_requests")
