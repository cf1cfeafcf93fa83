"""Incidents, and the bad requests a cluster holds.

`incidents` keeps one row per fault episode (docs/incidents.md): the alerts and clusters it ties together, its
title, summary, cause, scope, impact and what the engines showed in its first hour against the hour before.
`clusters.bad` is how many of a cluster's requests showed its symptom, which an incident's impact adds up;
clusters found before it hold NULL.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE incidents (
            incident_id VARCHAR PRIMARY KEY,
            state VARCHAR NOT NULL,
            started_at TIMESTAMP NOT NULL,
            updated_at TIMESTAMP NOT NULL,
            resolved_at TIMESTAMP,
            severity VARCHAR NOT NULL,
            title VARCHAR NOT NULL,
            summary VARCHAR NOT NULL,
            cause JSON NOT NULL,
            scope JSON NOT NULL,
            impact JSON NOT NULL,
            engine JSON NOT NULL,
            alert_ids VARCHAR[] NOT NULL,
            cluster_ids VARCHAR[] NOT NULL,
            change_ids VARCHAR[] NOT NULL,
            suggested_fix VARCHAR,
            example_trace_ids VARCHAR[] NOT NULL
        )
        """
    )
    op.execute("ALTER TABLE clusters ADD COLUMN bad BIGINT")


def downgrade() -> None:
    op.execute("ALTER TABLE clusters DROP COLUMN bad")
    op.execute("DROP TABLE incidents")
