"""slo_burn: its figures table, and the per-minute counts that keep its 30-day windows incremental.

`slo_burn` holds, per evaluation, SLO, group and trailing window, the good and total counts, the burn
rate and the budget left. `slo_burn_minutes` holds each evaluation's own minutes: judged and good
requests per SLO, group and minute of end_time, and whether the minute was good as a time slice. Later
evaluations sum these instead of rescanning spans; DuckDB's min-max statistics on `minute` bound that read.
The analysts' view of them, `slo_status`, which this revision once defined, is the request model's
(storage/request_model/duckdb/80_slo_status.sql).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-23
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_WINDOW = "window_start TIMESTAMP NOT NULL, window_end TIMESTAMP NOT NULL, evaluated_at TIMESTAMP NOT NULL"
_GROUP = "slo VARCHAR NOT NULL, tenant_id VARCHAR, deployment VARCHAR, model VARCHAR"


def upgrade() -> None:
    op.execute(
        f"""CREATE TABLE slo_burn ({_WINDOW}, {_GROUP}, burn_window VARCHAR NOT NULL, window_seconds BIGINT NOT NULL,
            good BIGINT NOT NULL, total BIGINT NOT NULL, burn_rate DOUBLE, objective DOUBLE NOT NULL,
            budget_remaining DOUBLE, breached BOOLEAN NOT NULL, severity VARCHAR)"""
    )
    op.execute(
        f"""CREATE TABLE slo_burn_minutes ({_WINDOW}, {_GROUP}, minute TIMESTAMP NOT NULL, good BIGINT NOT NULL,
            total BIGINT NOT NULL, good_slice BOOLEAN NOT NULL)"""
    )


def downgrade() -> None:
    op.execute("DROP TABLE slo_burn_minutes")
    op.execute("DROP TABLE slo_burn")
