"""Detectors: one results table per detector, alerts.

The windowed `llm_requests_between` macro and the `llm_request_scores_between` macro this revision once
defined are the request model's (storage/request_model/duckdb), applied over the newest tables.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_WINDOW = "window_start TIMESTAMP NOT NULL, window_end TIMESTAMP NOT NULL, evaluated_at TIMESTAMP NOT NULL"

_TABLES = {
    "token_latency": f"""{_WINDOW}, model VARCHAR, deployment VARCHAR, tenant_id VARCHAR, grouping VARCHAR NOT NULL,
        n BIGINT NOT NULL, tpot_p50 DOUBLE, tpot_p99 DOUBLE, baseline_n BIGINT, baseline_p99 DOUBLE, ratio DOUBLE,
        reason VARCHAR, prefill_share DOUBLE, cache_hit_mean DOUBLE, baseline_cache_hit_mean DOUBLE,
        queue_share DOUBLE, breached BOOLEAN NOT NULL""",
    "cache_curve": f"""{_WINDOW}, bucket VARCHAR NOT NULL, n BIGINT NOT NULL, latency_p50 DOUBLE,
        latency_p99 DOUBLE, tpot_p99 DOUBLE, score_name VARCHAR, score_mean DOUBLE, score_n BIGINT""",
    "traffic_pattern": f"""{_WINDOW}, pattern VARCHAR NOT NULL, n BIGINT NOT NULL, latency_p50 DOUBLE,
        latency_p99 DOUBLE, tpot_p99 DOUBLE, score_name VARCHAR, score_mean DOUBLE, score_n BIGINT""",
    "traffic_pattern_labels": f"""{_WINDOW}, trace_id VARCHAR NOT NULL, span_id VARCHAR NOT NULL,
        end_time TIMESTAMP NOT NULL, pattern VARCHAR NOT NULL, signal VARCHAR NOT NULL""",
    "tenant_fairness": f"""{_WINDOW}, tenant_id VARCHAR, n BIGINT NOT NULL, latency_p99 DOUBLE, ttft_p99 DOUBLE,
        aggregate_p99 DOUBLE, aggregate_ttft_p99 DOUBLE, ratio DOUBLE, jain_index DOUBLE, score_name VARCHAR,
        score_p_low DOUBLE, aggregate_score_p_low DOUBLE""",
}


def upgrade() -> None:
    for name, columns in _TABLES.items():
        op.execute(f"CREATE TABLE {name} ({columns})")
    op.execute(
        """
        CREATE TABLE alerts (
            alert_id     VARCHAR NOT NULL,
            detector     VARCHAR NOT NULL,
            fingerprint  VARCHAR NOT NULL,
            severity     VARCHAR NOT NULL,
            state        VARCHAR NOT NULL,
            labels       JSON NOT NULL,
            summary      VARCHAR NOT NULL,
            value        DOUBLE,
            threshold    DOUBLE,
            window_start TIMESTAMP NOT NULL,
            window_end   TIMESTAMP NOT NULL,
            started_at   TIMESTAMP NOT NULL,
            resolved_at  TIMESTAMP,
            updated_at   TIMESTAMP NOT NULL
        )
        """
    )
    # Consecutive breaching evaluations per fingerprint, for a detector's `for_evaluations` hold-down.
    op.execute(
        """
        CREATE TABLE alert_conditions (
            fingerprint VARCHAR NOT NULL, detector VARCHAR NOT NULL, breaches INTEGER NOT NULL,
            last_evaluated TIMESTAMP NOT NULL
        )
        """
    )
    op.execute(
        """
        CREATE TABLE detector_runs (
            detector VARCHAR NOT NULL, evaluated_at TIMESTAMP NOT NULL, window_start TIMESTAMP NOT NULL,
            window_end TIMESTAMP NOT NULL, outcome VARCHAR NOT NULL, seconds DOUBLE NOT NULL, rows BIGINT,
            conditions INTEGER, error VARCHAR, ran_at TIMESTAMP NOT NULL
        )
        """
    )


def downgrade() -> None:
    for name in ("detector_runs", "alert_conditions", "alerts", *_TABLES):
        op.execute(f"DROP TABLE {name}")
