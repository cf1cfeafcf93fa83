"""token_latency figures: what the slow requests' engines were doing (joined engine metrics), behind the new
reasons preemption, kv_pressure and batch_tokens.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_COLUMNS = (("preempted_share", "DOUBLE"), ("kv_usage_p50", "DOUBLE"), ("step_tokens_p50", "DOUBLE"))


def upgrade() -> None:
    for name, sql_type in _COLUMNS:
        op.execute(f"ALTER TABLE token_latency ADD COLUMN {name} {sql_type}")


def downgrade() -> None:
    for name, _ in reversed(_COLUMNS):
        op.execute(f"ALTER TABLE token_latency DROP COLUMN {name}")
