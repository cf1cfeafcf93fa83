"""llm_requests: a client request retried inside one client span gives one row per attempt, never two rows
with the same id.

The rule is the request model's (storage/request_model/duckdb/30_span_requests.sql, attempts), applied over
the newest tables; this revision defined it once, in the `llm_requests_between` macro, and now changes no
table. It stays so that the history reads as it happened.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-21
"""

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
