"""The request model with no live join: `llm_requests_settled_between(t0, t1)`.

The macro is the request model's (storage/request_model/duckdb/45_settled_requests.sql), applied over the
newest tables; this revision defined it once and now changes no table. It stays so that the history reads
as it happened.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-23
"""

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
