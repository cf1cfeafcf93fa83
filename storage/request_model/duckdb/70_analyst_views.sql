-- Curated analyst views: the analyses people ask for, each a view over all stored time and a `_between(t0, t1)`
-- table macro (docs/sql.md).
--
-- The macro bounds the underlying `llm_requests_between` scan, which is what makes a query over one day of a
-- month-long table fast: a filter on the view's window_start cannot reach the scan, because a bucket start
-- cannot be inverted into an end_time range.
--
-- Score means are a MAP of every score name per group, so a new score name needs no new column:
-- score_means['json_adherence'].

-- Per-output-token decode latency, the token_latency detector's figure, per 5-minute window.
CREATE OR REPLACE MACRO token_latency_5m_between(t0, t1) AS TABLE
    SELECT time_bucket(INTERVAL 5 MINUTE, end_time) AS window_start,
           time_bucket(INTERVAL 5 MINUTE, end_time) + INTERVAL 5 MINUTE AS window_end,
           model, deployment, count(*) AS requests, count(tpot_ms) AS tpot_n,
           quantile_cont(tpot_ms, 0.5) AS tpot_p50_ms, quantile_cont(tpot_ms, 0.99) AS tpot_p99_ms,
           quantile_cont(e2e_ms, 0.99) AS e2e_p99_ms
    FROM llm_requests_between(t0, t1)
    GROUP BY ALL;

CREATE OR REPLACE VIEW token_latency_5m AS
SELECT * FROM token_latency_5m_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);

-- The cache-hit-ratio bucket curve, per hour. The buckets are the cache_curve detector's default edges.
CREATE OR REPLACE MACRO cache_curve_hourly_between(t0, t1) AS TABLE
    WITH grouped AS (
        SELECT trace_id, span_id, time_bucket(INTERVAL 1 HOUR, end_time) AS window_start,
               CASE WHEN cache_hit_ratio > 0.85 THEN 'high' WHEN cache_hit_ratio >= 0.55 THEN 'medium'
                    WHEN cache_hit_ratio IS NOT NULL THEN 'low' END AS bucket,
               e2e_ms, tpot_ms
        FROM llm_requests_between(t0, t1) WHERE cache_hit_ratio IS NOT NULL
    ),
    score_means AS (
        SELECT window_start, bucket, map(list(name ORDER BY name), list(mean ORDER BY name)) AS score_means
        FROM (
            SELECT window_start, bucket, s.name, avg(s.score) AS mean
            FROM grouped AS g JOIN llm_request_scores_between(t0, t1) AS s USING (trace_id, span_id)
            WHERE s.score IS NOT NULL
            GROUP BY ALL
        )
        GROUP BY ALL
    )
    SELECT g.window_start, g.window_start + INTERVAL 1 HOUR AS window_end, g.bucket, count(*) AS requests,
           quantile_cont(g.e2e_ms, 0.5) AS e2e_p50_ms, quantile_cont(g.e2e_ms, 0.99) AS e2e_p99_ms,
           quantile_cont(g.tpot_ms, 0.99) AS tpot_p99_ms, any_value(m.score_means) AS score_means
    FROM grouped AS g LEFT JOIN score_means AS m USING (window_start, bucket)
    GROUP BY g.window_start, g.bucket;

CREATE OR REPLACE VIEW cache_curve_hourly AS
SELECT * FROM cache_curve_hourly_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);

-- Each tenant's tail against everyone's, per 5-minute window (tenant_fairness's comparison).
CREATE OR REPLACE MACRO tenant_latency_5m_between(t0, t1) AS TABLE
    WITH r AS (
        SELECT time_bucket(INTERVAL 5 MINUTE, end_time) AS window_start, tenant_id, e2e_ms, ttft_ms
        FROM llm_requests_between(t0, t1)
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
    FROM tenants AS t JOIN everyone AS e USING (window_start);

CREATE OR REPLACE VIEW tenant_latency_5m AS
SELECT * FROM tenant_latency_5m_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);

-- Requests by the traffic_pattern detector's labels (60_traffic_patterns.sql), per hour and deployment.
CREATE OR REPLACE MACRO traffic_pattern_hourly_between(t0, t1) AS TABLE
    WITH grouped AS (
        SELECT trace_id, span_id, time_bucket(INTERVAL 1 HOUR, end_time) AS window_start, deployment,
               pattern, e2e_ms, tpot_ms
        FROM request_traffic_patterns_between(t0, t1)
    ),
    score_means AS (
        SELECT window_start, deployment, pattern, map(list(name ORDER BY name), list(mean ORDER BY name)) AS score_means
        FROM (
            SELECT window_start, deployment, pattern, s.name, avg(s.score) AS mean
            FROM grouped AS g JOIN llm_request_scores_between(t0, t1) AS s USING (trace_id, span_id)
            WHERE s.score IS NOT NULL
            GROUP BY ALL
        )
        GROUP BY ALL
    )
    SELECT g.window_start, g.window_start + INTERVAL 1 HOUR AS window_end, g.deployment, g.pattern,
           count(*) AS requests, quantile_cont(g.e2e_ms, 0.5) AS e2e_p50_ms,
           quantile_cont(g.e2e_ms, 0.99) AS e2e_p99_ms, quantile_cont(g.tpot_ms, 0.99) AS tpot_p99_ms,
           any_value(m.score_means) AS score_means
    FROM grouped AS g
    LEFT JOIN score_means AS m
      ON m.window_start = g.window_start AND m.deployment IS NOT DISTINCT FROM g.deployment
     AND m.pattern = g.pattern
    GROUP BY g.window_start, g.deployment, g.pattern;

CREATE OR REPLACE VIEW traffic_pattern_hourly AS
SELECT * FROM traffic_pattern_hourly_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);

-- Each replica against the fleet, per hour (replica_skew's comparison).
CREATE OR REPLACE MACRO replica_comparison_hourly_between(t0, t1) AS TABLE
    WITH grouped AS (
        SELECT trace_id, span_id, time_bucket(INTERVAL 1 HOUR, end_time) AS window_start, replica_id,
               status_code, e2e_ms, tpot_ms
        FROM llm_requests_between(t0, t1)
    ),
    fleet AS (
        SELECT window_start, count(*) AS fleet_requests, avg((status_code = 'ERROR')::INT) AS fleet_error_rate,
               quantile_cont(e2e_ms, 0.99) AS fleet_e2e_p99_ms, quantile_cont(tpot_ms, 0.99) AS fleet_tpot_p99_ms
        FROM grouped GROUP BY window_start
    ),
    score_means AS (
        SELECT window_start, replica_id, map(list(name ORDER BY name), list(mean ORDER BY name)) AS score_means
        FROM (
            SELECT window_start, replica_id, s.name, avg(s.score) AS mean
            FROM grouped AS g JOIN llm_request_scores_between(t0, t1) AS s USING (trace_id, span_id)
            WHERE s.score IS NOT NULL
            GROUP BY ALL
        )
        GROUP BY ALL
    )
    SELECT g.window_start, g.window_start + INTERVAL 1 HOUR AS window_end, g.replica_id, count(*) AS requests,
           avg((g.status_code = 'ERROR')::INT) AS error_rate, quantile_cont(g.e2e_ms, 0.99) AS e2e_p99_ms,
           quantile_cont(g.tpot_ms, 0.99) AS tpot_p99_ms, any_value(f.fleet_requests) AS fleet_requests,
           any_value(f.fleet_error_rate) AS fleet_error_rate, any_value(f.fleet_e2e_p99_ms) AS fleet_e2e_p99_ms,
           any_value(f.fleet_tpot_p99_ms) AS fleet_tpot_p99_ms, any_value(m.score_means) AS score_means
    FROM grouped AS g
    JOIN fleet AS f USING (window_start)
    LEFT JOIN score_means AS m ON m.window_start = g.window_start AND m.replica_id IS NOT DISTINCT FROM g.replica_id
    GROUP BY g.window_start, g.replica_id;

CREATE OR REPLACE VIEW replica_comparison_hourly AS
SELECT * FROM replica_comparison_hourly_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);
