"""traffic_pattern labels stored per arrival second.

A request's pattern depends only on its deployment, its arrival second and its replica_count, so the
labels are stored once per such key (a day is ~170k rows, not ten million) and the request model joins
them back (`request_traffic_patterns`, storage/request_model/duckdb/60_traffic_patterns.sql, which this
revision once defined). The per-request rows of 0003 cannot be folded back without the requests' keys; they
are derived figures, so they are dropped and the next pass over a window writes them again.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_WINDOW = "window_start TIMESTAMP NOT NULL, window_end TIMESTAMP NOT NULL, evaluated_at TIMESTAMP NOT NULL"


def upgrade() -> None:
    op.execute("DROP TABLE traffic_pattern_labels")
    op.execute(
        f"""CREATE TABLE traffic_pattern_labels ({_WINDOW}, deployment VARCHAR, arrival_second TIMESTAMP NOT NULL,
            replica_count BIGINT, requests BIGINT NOT NULL, pattern VARCHAR NOT NULL, signal VARCHAR NOT NULL)"""
    )


def downgrade() -> None:
    op.execute("DROP TABLE traffic_pattern_labels")
    op.execute(
        f"""CREATE TABLE traffic_pattern_labels ({_WINDOW}, trace_id VARCHAR NOT NULL, span_id VARCHAR NOT NULL,
            end_time TIMESTAMP NOT NULL, pattern VARCHAR NOT NULL, signal VARCHAR NOT NULL)"""
    )
