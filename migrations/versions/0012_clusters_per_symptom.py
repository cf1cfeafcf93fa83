"""Clusters per symptom, kept on evidence; alerts say what explains them.

`clusters` gains `symptom` (error, tpot_tail, latency_tail or score:<name>), `p_value` (the chance of so
many bad requests in a group that size by chance alone: Fisher's exact test, one-sided), `excess` (bad requests beyond
chance, what clusters are ranked by) and `candidates` (how many were tried in the window). `alerts` gains
`explanation`: the cluster that explains a firing alert's group, or why none passed the evidence test.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-23
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_CLUSTERS = (("symptom", "VARCHAR"), ("p_value", "DOUBLE"), ("excess", "DOUBLE"), ("candidates", "BIGINT"))


def upgrade() -> None:
    for name, sql_type in _CLUSTERS:
        op.execute(f"ALTER TABLE clusters ADD COLUMN {name} {sql_type}")
    op.execute("ALTER TABLE alerts ADD COLUMN explanation VARCHAR")


def downgrade() -> None:
    op.execute("ALTER TABLE alerts DROP COLUMN explanation")
    for name, _ in reversed(_CLUSTERS):
        op.execute(f"ALTER TABLE clusters DROP COLUMN {name}")
