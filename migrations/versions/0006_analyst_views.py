"""Curated analyst views: the analyses people ask for, each a view and a `_between(t0, t1)` table macro.

The views and macros are the request model's (storage/request_model/duckdb/70_analyst_views.sql), applied
over the newest tables; this revision defined them once, with the string-taking bounds of
`llm_requests_between`, and now changes no table. It stays so that the history reads as it happened.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21
"""

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
