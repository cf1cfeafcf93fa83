"""traffic_pattern labels stored per arrival second, joined back to requests by a macro and a view.

A request's pattern depends only on its deployment, its arrival second and its replica_count, so the
labels are stored once per such key (a day is ~170k rows, not ten million) and the per-request view
joins them back. The per-request rows of 0003 cannot be folded back without the requests' keys; they
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

_REQUEST_LABELS = """
    SELECT l.window_start, l.window_end, l.pattern, l.signal, r.*
    FROM llm_requests_between({low}, {high}) AS r
    JOIN traffic_pattern_labels AS l
      ON l.deployment IS NOT DISTINCT FROM r.deployment
     AND l.arrival_second = date_trunc('second', r.start_time)
     AND l.replica_count IS NOT DISTINCT FROM r.replica_count
     AND r.end_time >= l.window_start AND r.end_time < l.window_end
"""


def upgrade() -> None:
    op.execute("DROP TABLE traffic_pattern_labels")
    op.execute(
        f"""CREATE TABLE traffic_pattern_labels ({_WINDOW}, deployment VARCHAR, arrival_second TIMESTAMP NOT NULL,
            replica_count BIGINT, requests BIGINT NOT NULL, pattern VARCHAR NOT NULL, signal VARCHAR NOT NULL)"""
    )
    op.execute(
        "CREATE MACRO request_traffic_patterns_between(t0, t1) AS TABLE " + _REQUEST_LABELS.format(low="t0", high="t1")
    )
    op.execute(
        "CREATE VIEW request_traffic_patterns AS "
        "SELECT * FROM request_traffic_patterns_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP)"
    )


def downgrade() -> None:
    op.execute("DROP VIEW request_traffic_patterns")
    op.execute("DROP MACRO TABLE request_traffic_patterns_between")
    op.execute("DROP TABLE traffic_pattern_labels")
    op.execute(
        f"""CREATE TABLE traffic_pattern_labels ({_WINDOW}, trace_id VARCHAR NOT NULL, span_id VARCHAR NOT NULL,
            end_time TIMESTAMP NOT NULL, pattern VARCHAR NOT NULL, signal VARCHAR NOT NULL)"""
    )
