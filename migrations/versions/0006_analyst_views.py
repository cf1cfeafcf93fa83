"""Curated analyst views: the analyses people ask for, each a view and a `_between(t0, t1)` table macro.

The view covers all stored time; the macro bounds the underlying `llm_requests_between` scan, which is
what makes a query over one day of a month-long table fast (a filter on the view's window_start cannot
reach the scan, because a bucket start cannot be inverted into an end_time range).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21
"""

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


# 0003's request pairing, unchanged but for its bounds: the SQL its `_requests_sql(low, high)` built,
# frozen here as text with `{low}` and `{high}` for the bounds. A revision never imports another one:
# each keeps meaning what it meant when it landed.
_PAIRING_0003 = """
        WITH llm AS NOT MATERIALIZED (
            -- An hour of margin: a client span can end well after the server span it contains.
            SELECT trace_id, span_id, llm_role, status_code, name, kind, start_time, end_time, duration_ms,
                service_name, replica_id, deployment, model, input_tokens, output_tokens, cached_input_tokens,
                ttft_ms, tpot_ms, queue_ms, prefill_ms, decode_ms, e2e_ms, cache_hit_ratio, queue_depth,
                replica_count, batch_size, prefill_tokens_in_batch, quantization, finish_reason, tenant_id,
                provider, operation FROM spans
            WHERE is_llm AND end_time >= {low} - INTERVAL 1 HOUR AND end_time < {high} + INTERVAL 1 HOUR
        ),
        pairs AS (
            SELECT s.trace_id, s.span_id AS server_span_id, c.span_id AS client_span_id,
                c.status_code AS c_status_code, c.name AS c_name, c.kind AS c_kind, c.start_time AS c_start_time,
                c.end_time AS c_end_time, c.duration_ms AS c_duration_ms, c.service_name AS c_service_name,
                c.replica_id AS c_replica_id, c.deployment AS c_deployment, c.model AS c_model,
                c.input_tokens AS c_input_tokens, c.output_tokens AS c_output_tokens,
                c.cached_input_tokens AS c_cached_input_tokens, c.ttft_ms AS c_ttft_ms, c.tpot_ms AS c_tpot_ms,
                c.queue_ms AS c_queue_ms, c.prefill_ms AS c_prefill_ms, c.decode_ms AS c_decode_ms,
                c.e2e_ms AS c_e2e_ms, c.cache_hit_ratio AS c_cache_hit_ratio, c.queue_depth AS c_queue_depth,
                c.replica_count AS c_replica_count, c.batch_size AS c_batch_size,
                c.prefill_tokens_in_batch AS c_prefill_tokens_in_batch, c.quantization AS c_quantization,
                c.finish_reason AS c_finish_reason, c.tenant_id AS c_tenant_id, c.provider AS c_provider,
                c.operation AS c_operation
            FROM llm AS s
            JOIN llm AS c
              ON c.trace_id = s.trace_id
             AND s.llm_role = 'server' AND c.llm_role = 'client'
             AND s.start_time >= c.start_time - INTERVAL 1 SECOND
             AND s.end_time <= c.end_time + INTERVAL 1 SECOND
            QUALIFY row_number() OVER (
                PARTITION BY s.trace_id, s.span_id ORDER BY c.start_time DESC, c.span_id
            ) = 1
        ),
        claimed AS (SELECT DISTINCT trace_id, client_span_id FROM pairs)
        -- A paired server row carries its client's figures; a paired client row is dropped.
        SELECT
            x.trace_id,
            coalesce(p.client_span_id, x.span_id) AS span_id,
            CASE WHEN x.llm_role = 'server' THEN x.span_id END AS server_span_id,
            coalesce(p.client_span_id, CASE WHEN x.llm_role = 'client' THEN x.span_id END) AS client_span_id,
            CASE WHEN 'ERROR' IN (x.status_code, p.c_status_code) THEN 'ERROR'
                 WHEN 'OK' IN (x.status_code, p.c_status_code) THEN 'OK' ELSE 'UNSET' END AS status_code,
            coalesce(x.name, p.c_name) AS name,
            coalesce(x.kind, p.c_kind) AS kind,
            coalesce(x.start_time, p.c_start_time) AS start_time,
            coalesce(x.end_time, p.c_end_time) AS end_time,
            coalesce(x.duration_ms, p.c_duration_ms) AS duration_ms,
            coalesce(x.service_name, p.c_service_name) AS service_name,
            coalesce(x.replica_id, p.c_replica_id) AS replica_id,
            coalesce(x.deployment, p.c_deployment) AS deployment,
            coalesce(x.model, p.c_model) AS model,
            coalesce(x.input_tokens, p.c_input_tokens) AS input_tokens,
            coalesce(x.output_tokens, p.c_output_tokens) AS output_tokens,
            coalesce(x.cached_input_tokens, p.c_cached_input_tokens) AS cached_input_tokens,
            coalesce(x.ttft_ms, p.c_ttft_ms) AS ttft_ms,
            coalesce(x.tpot_ms, p.c_tpot_ms) AS tpot_ms,
            coalesce(x.queue_ms, p.c_queue_ms) AS queue_ms,
            coalesce(x.prefill_ms, p.c_prefill_ms) AS prefill_ms,
            coalesce(x.decode_ms, p.c_decode_ms) AS decode_ms,
            coalesce(x.e2e_ms, p.c_e2e_ms) AS e2e_ms,
            coalesce(x.cache_hit_ratio, p.c_cache_hit_ratio) AS cache_hit_ratio,
            coalesce(x.queue_depth, p.c_queue_depth) AS queue_depth,
            coalesce(x.replica_count, p.c_replica_count) AS replica_count,
            coalesce(x.batch_size, p.c_batch_size) AS batch_size,
            coalesce(x.prefill_tokens_in_batch, p.c_prefill_tokens_in_batch) AS prefill_tokens_in_batch,
            coalesce(x.quantization, p.c_quantization) AS quantization,
            coalesce(x.finish_reason, p.c_finish_reason) AS finish_reason,
            coalesce(p.c_tenant_id, x.tenant_id) AS tenant_id,
            coalesce(p.c_provider, x.provider) AS provider,
            coalesce(p.c_operation, x.operation) AS operation
        FROM llm AS x
        LEFT JOIN pairs AS p ON p.trace_id = x.trace_id AND p.server_span_id = x.span_id
        -- An anti-join written as a join against the small set of claimed clients: NOT EXISTS made
        -- DuckDB deduplicate every (trace_id, span_id) of the window first.
        LEFT JOIN claimed AS k ON k.trace_id = x.trace_id AND k.client_span_id = x.span_id
        WHERE x.end_time >= {low} AND x.end_time < {high} AND k.client_span_id IS NULL
    """


def _requests_between(low: str, high: str) -> str:
    pairing = _PAIRING_0003.format(low=low, high=high)
    return f"CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE {pairing}"


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
