"""LLM request model: llm_role on spans, and span_scores.

The `llm_requests` and `llm_request_scores` views this revision once defined are the request model's
(storage/request_model/duckdb), applied over the newest tables; revisions hold tables and data moves only.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE spans ADD COLUMN llm_role VARCHAR")
    op.execute(
        """
        CREATE TABLE span_scores (
            trace_id    VARCHAR NOT NULL,
            span_id     VARCHAR NOT NULL,
            name        VARCHAR NOT NULL,
            score       DOUBLE,
            label       VARCHAR,
            explanation VARCHAR,
            source      VARCHAR NOT NULL,
            observed_at TIMESTAMP NOT NULL,
            ingested_at TIMESTAMP NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE span_scores")
    op.execute("ALTER TABLE spans DROP COLUMN llm_role")
