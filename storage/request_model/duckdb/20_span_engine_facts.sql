-- Settling: each LLM span's engine facts, computed once the engine metrics around it have arrived and stored
-- beside it (`engine_*` columns, `engine_settled`), so that reads of settled windows join nothing
-- (storage/duckdb/engine_facts.py runs it; docs/engine-metrics.md).
--
-- Every unsettled LLM span that ended in [t0, t1), with the facts of its own replica, deployment and times,
-- by the same rules as the live join of 40_requests.sql: what the engines said, NULL when they said nothing,
-- never the span's own value. `row_id` is the stored row, so that the writer's update finds it without
-- comparing ids; it reads `span_rows`, whose rows have ids (a view's do not).
--
-- The lookups: `a` is the replica's last state at or before the second the span started in (arrival), `e`
-- its first at or after the end of the second it ended in, `d` the deployment's at arrival. A state is
-- current for two reporting intervals after its point: `a.second - a.time <= 2 intervals` is "current at
-- arrival", and a difference over the span's lifetime needs both ends current.
CREATE OR REPLACE MACRO span_engine_facts_between(t0, t1) AS TABLE
    WITH keys AS NOT MATERIALIZED (
        SELECT rowid AS row_id, replica_id, deployment, start_time, end_time FROM span_rows
        WHERE is_llm AND engine_settled IS NULL AND end_time >= t0::TIMESTAMP AND end_time < t1::TIMESTAMP
    ),
    -- The states a window's requests can use: from two reporting intervals before the earliest arrival to two
    -- after the latest end. Bounded by the requests, not the window's margins, so a 5-minute window reads
    -- minutes of engine points, not hours.
    reach AS MATERIALIZED (
        SELECT lo - margin AS lo, hi + margin AS hi
        FROM (SELECT min(start_time) AS lo, max(end_time) AS hi FROM keys) AS span,
        LATERAL (
            SELECT CAST(2e6 * coalesce(max(interval_s), 0) AS BIGINT) * INTERVAL 1 MICROSECOND AS margin
            FROM engine_metrics WHERE time >= span.lo - INTERVAL 2 HOUR AND time < span.hi + INTERVAL 2 HOUR
        )
    ),
    states AS MATERIALIZED (SELECT * FROM engine_states_between((SELECT lo FROM reach), (SELECT hi FROM reach))),
    -- One row per (replica, second) the window's spans need: the replica's last state at or before the
    -- second a request started in (`arrival`), its first at or after the end of the second it ended in
    -- (`departure`). Looked up once per second and hash-joined to the requests: a fifth of the cost of an
    -- as-of join of every request. Empty when no engine reported in reach, so a fleet without engine
    -- metrics pays next to nothing.
    arrival AS (
        SELECT k.*, s.* EXCLUDE (replica_id) FROM (
            SELECT DISTINCT replica_id, date_trunc('second', r.start_time) AS second FROM keys AS r
            WHERE replica_id IS NOT NULL AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time <= k.second),
    departure AS (
        SELECT k.*, s.* EXCLUDE (replica_id) FROM (
            SELECT DISTINCT replica_id, date_trunc('second', r.end_time) + INTERVAL 1 SECOND AS second FROM keys AS r
            WHERE replica_id IS NOT NULL AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time >= k.second),
    -- The deployment's totals (engine_deployment_states_between's body, over the states read above), and
    -- their value at each second a request of the deployment started in.
    deployments AS MATERIALIZED (
        WITH s AS (
            SELECT *, lag(time) OVER r AS prev_time, lag(waiting) OVER r AS prev_waiting, lead(time) OVER r AS next_time
            FROM states
            WHERE deployment IS NOT NULL
            WINDOW r AS (PARTITION BY deployment, replica_id ORDER BY time)
        ),
        events AS (
            SELECT deployment, time,
                   coalesce(waiting, 0)
                   - CASE WHEN time - prev_time <= (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
                          THEN coalesce(prev_waiting, 0) ELSE 0 END AS d_waiting,
                   CASE WHEN time - prev_time <= (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
                        THEN 0 ELSE 1 END AS d_replicas
            FROM s
            UNION ALL
            SELECT deployment, time + (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND), -coalesce(waiting, 0), -1
            FROM s
            WHERE next_time IS NULL OR next_time - time > (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
        )
        SELECT deployment, time,
               sum(d_waiting) OVER d AS waiting,
               sum(d_replicas) OVER d AS replicas
        FROM events
        WINDOW d AS (PARTITION BY deployment ORDER BY time RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    ),
    fleet AS (
        SELECT k.*, s.* EXCLUDE (deployment) FROM (
            SELECT DISTINCT deployment, date_trunc('second', r.start_time) AS second FROM keys AS r
            WHERE deployment IS NOT NULL AND EXISTS (SELECT 1 FROM deployments)
        ) AS k
        ASOF LEFT JOIN deployments AS s ON s.deployment = k.deployment AND s.time <= k.second)
    SELECT r.row_id,
           -- waiting requests summed over the deployment's replicas at arrival
           (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END) AS queue_depth,
           -- the deployment's replicas reporting at arrival
           (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END) AS replica_count,
           -- prefix-cache hits / queries over the request's lifetime, else the hit rate the replica reported at
           -- arrival
           coalesce(
               CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                              AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                               THEN e.cache_queries - a.cache_queries END) > 0
                    THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                         AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                          THEN e.cache_hits - a.cache_hits END)
                                    / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                           AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                            THEN e.cache_queries - a.cache_queries END)) END,
               CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END) AS cache_hit_ratio,
           -- the replica's KV-cache usage at arrival
           CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.kv_cache_usage END AS kv_cache_usage,
           -- the replica's running requests at arrival
           CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN CAST(round(a.running) AS BIGINT) END AS running_requests,
           -- the replica's preemptions during the request
           CAST(round((CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                    AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                     THEN e.preemptions - a.preemptions END)) AS BIGINT) AS preemptions,
           -- tokens per engine step during the request
           CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                              AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                               THEN e.steps - a.steps END) > 0
                    THEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                              AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                               THEN e.step_tokens - a.step_tokens END)
                         / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                 THEN e.steps - a.steps END) END AS step_tokens
    FROM keys AS r
    LEFT JOIN arrival AS a ON a.replica_id = r.replica_id AND a.second = date_trunc('second', r.start_time)
    LEFT JOIN departure AS e
      ON e.replica_id = r.replica_id AND e.second = date_trunc('second', r.end_time) + INTERVAL 1 SECOND
    LEFT JOIN fleet AS d ON d.deployment = r.deployment AND d.second = date_trunc('second', r.start_time);
