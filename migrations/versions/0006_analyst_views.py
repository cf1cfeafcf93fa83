"""Curated analyst views: the analyses people ask for, each a view and a `_between(t0, t1)` table macro.

The view covers all stored time; the macro bounds the underlying `llm_requests_between` scan, which is
what makes a query over one day of a month-long table fast (a filter on the view's window_start cannot
reach the scan, because a bucket start cannot be inverted into an end_time range).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21
"""

import importlib

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_CACHE_BUCKET = """CASE WHEN cache_hit_ratio > 0.85 THEN 'high' WHEN cache_hit_ratio >= 0.55 THEN 'medium'
    WHEN cache_hit_ratio IS NOT NULL THEN 'low' END"""

# Means of every score name per group, as a MAP so a new score name needs no new column:
# score_means['json_adherence']. {keys} are the group columns shared by `groups` and `scores`.
_SCORE_MEANS = """
    score_means AS (
        SELECT {keys}, map(list(name ORDER BY name), list(mean ORDER BY name)) AS score_means
        FROM (
            SELECT {keys}, s.name, avg(s.score) AS mean
            FROM grouped AS g JOIN llm_request_scores_between({t0}, {t1}) AS s USING (trace_id, span_id)
            WHERE s.score IS NOT NULL
            GROUP BY ALL
        )
        GROUP BY ALL
    )"""

_ANALYSES = {
    # Per-output-token decode latency, the token_latency detector's figure, per 5-minute window.
    "token_latency_5m": """
        SELECT time_bucket(INTERVAL 5 MINUTE, end_time) AS window_start,
               time_bucket(INTERVAL 5 MINUTE, end_time) + INTERVAL 5 MINUTE AS window_end,
               model, deployment, count(*) AS requests, count(tpot_ms) AS tpot_n,
               quantile_cont(tpot_ms, 0.5) AS tpot_p50_ms, quantile_cont(tpot_ms, 0.99) AS tpot_p99_ms,
               quantile_cont(e2e_ms, 0.99) AS e2e_p99_ms
        FROM llm_requests_between({t0}, {t1})
        GROUP BY ALL""",
    # The cache-hit-ratio bucket curve (cache_curve's buckets), per hour.
    "cache_curve_hourly": f"""
        WITH grouped AS (
            SELECT trace_id, span_id, time_bucket(INTERVAL 1 HOUR, end_time) AS window_start,
                   {_CACHE_BUCKET} AS bucket, e2e_ms, tpot_ms
            FROM llm_requests_between({{t0}}, {{t1}}) WHERE cache_hit_ratio IS NOT NULL
        ),
        {_SCORE_MEANS.format(keys="window_start, bucket", t0="{t0}", t1="{t1}")}
        SELECT g.window_start, g.window_start + INTERVAL 1 HOUR AS window_end, g.bucket, count(*) AS requests,
               quantile_cont(g.e2e_ms, 0.5) AS e2e_p50_ms, quantile_cont(g.e2e_ms, 0.99) AS e2e_p99_ms,
               quantile_cont(g.tpot_ms, 0.99) AS tpot_p99_ms, any_value(m.score_means) AS score_means
        FROM grouped AS g LEFT JOIN score_means AS m USING (window_start, bucket)
        GROUP BY g.window_start, g.bucket""",
    # Each tenant's tail against everyone's, per 5-minute window (tenant_fairness's comparison).
    "tenant_latency_5m": """
        WITH r AS (
            SELECT time_bucket(INTERVAL 5 MINUTE, end_time) AS window_start, tenant_id, e2e_ms, ttft_ms
            FROM llm_requests_between({t0}, {t1})
        ),
        everyone AS (
            SELECT window_start, count(*) AS aggregate_requests,
                   quantile_cont(e2e_ms, 0.99) AS aggregate_e2e_p99_ms,
                   quantile_cont(ttft_ms, 0.99) AS aggregate_ttft_p99_ms
            FROM r GROUP BY window_start
        ),
        tenants AS (
            SELECT window_start, tenant_id, count(*) AS requests, quantile_cont(e2e_ms, 0.99) AS e2e_p99_ms,
                   quantile_cont(ttft_ms, 0.99) AS ttft_p99_ms
            FROM r GROUP BY window_start, tenant_id
        )
        SELECT t.window_start, t.window_start + INTERVAL 5 MINUTE AS window_end, t.tenant_id, t.requests,
               t.e2e_p99_ms, t.ttft_p99_ms, e.aggregate_requests, e.aggregate_e2e_p99_ms, e.aggregate_ttft_p99_ms,
               t.e2e_p99_ms / nullif(e.aggregate_e2e_p99_ms, 0) AS e2e_p99_ratio
        FROM tenants AS t JOIN everyone AS e USING (window_start)""",
    # Requests by the traffic_pattern detector's labels, per hour of end time and deployment.
    "traffic_pattern_hourly": f"""
        WITH grouped AS (
            SELECT trace_id, span_id, time_bucket(INTERVAL 1 HOUR, end_time) AS window_start, deployment,
                   pattern, e2e_ms, tpot_ms
            FROM request_traffic_patterns_between({{t0}}, {{t1}})
        ),
        {_SCORE_MEANS.format(keys="window_start, deployment, pattern", t0="{t0}", t1="{t1}")}
        SELECT g.window_start, g.window_start + INTERVAL 1 HOUR AS window_end, g.deployment, g.pattern,
               count(*) AS requests, quantile_cont(g.e2e_ms, 0.5) AS e2e_p50_ms,
               quantile_cont(g.e2e_ms, 0.99) AS e2e_p99_ms, quantile_cont(g.tpot_ms, 0.99) AS tpot_p99_ms,
               any_value(m.score_means) AS score_means
        FROM grouped AS g
        LEFT JOIN score_means AS m
          ON m.window_start = g.window_start AND m.deployment IS NOT DISTINCT FROM g.deployment
         AND m.pattern = g.pattern
        GROUP BY g.window_start, g.deployment, g.pattern""",
    # Each replica against the fleet, per hour (replica_skew's comparison).
    "replica_comparison_hourly": f"""
        WITH grouped AS (
            SELECT trace_id, span_id, time_bucket(INTERVAL 1 HOUR, end_time) AS window_start, replica_id,
                   status_code, e2e_ms, tpot_ms
            FROM llm_requests_between({{t0}}, {{t1}})
        ),
        fleet AS (
            SELECT window_start, count(*) AS fleet_requests, avg((status_code = 'ERROR')::INT) AS fleet_error_rate,
                   quantile_cont(e2e_ms, 0.99) AS fleet_e2e_p99_ms, quantile_cont(tpot_ms, 0.99) AS fleet_tpot_p99_ms
            FROM grouped GROUP BY window_start
        ),
        {_SCORE_MEANS.format(keys="window_start, replica_id", t0="{t0}", t1="{t1}")}
        SELECT g.window_start, g.window_start + INTERVAL 1 HOUR AS window_end, g.replica_id, count(*) AS requests,
               avg((g.status_code = 'ERROR')::INT) AS error_rate, quantile_cont(g.e2e_ms, 0.99) AS e2e_p99_ms,
               quantile_cont(g.tpot_ms, 0.99) AS tpot_p99_ms, any_value(f.fleet_requests) AS fleet_requests,
               any_value(f.fleet_error_rate) AS fleet_error_rate, any_value(f.fleet_e2e_p99_ms) AS fleet_e2e_p99_ms,
               any_value(f.fleet_tpot_p99_ms) AS fleet_tpot_p99_ms, any_value(m.score_means) AS score_means
        FROM grouped AS g
        JOIN fleet AS f USING (window_start)
        LEFT JOIN score_means AS m ON m.window_start = g.window_start AND m.replica_id IS NOT DISTINCT FROM g.replica_id
        GROUP BY g.window_start, g.replica_id""",
}


# 0003's request pairing, unchanged but for its bounds. A landed revision never changes, so reusing its
# SQL builder restates exactly that snapshot.
_PAIRING = importlib.import_module("migrations.versions.0003_detectors")


def _requests_between(low: str, high: str) -> str:
    return f"CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE {_PAIRING._requests_sql(low, high)}"


def upgrade() -> None:
    # Analysts write llm_requests_between('2026-11-20', '2026-11-21'): without the casts a string minus
    # an INTERVAL is a binder error. Every macro built on this one takes strings with it.
    op.execute(_requests_between("t0::TIMESTAMP", "t1::TIMESTAMP"))
    for name, sql in _ANALYSES.items():
        op.execute(f"CREATE MACRO {name}_between(t0, t1) AS TABLE {sql.format(t0='t0', t1='t1')}")
        op.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP)")


def downgrade() -> None:
    for name in _ANALYSES:
        op.execute(f"DROP VIEW {name}")
        op.execute(f"DROP MACRO TABLE {name}_between")
    op.execute(_requests_between("t0", "t1"))
