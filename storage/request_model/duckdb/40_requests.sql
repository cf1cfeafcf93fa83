-- `llm_requests_between(t0, t1)`: the request model as analysts and the detectors read it. The spans' model
-- (30_span_requests.sql: one row per request attempt) with the engine facts filled in:
-- - `queue_depth`: waiting requests summed over the deployment's replicas at arrival;
-- - `replica_count`: the deployment's replicas reporting at arrival;
-- - `cache_hit_ratio`: the replica's prefix-cache hits / queries over the request's lifetime;
-- - `kv_cache_usage` and `running_requests` at arrival, `preemptions` during the request, and `step_tokens`
--   (tokens per engine step during the request), which only the engines report.
-- A span's own value always wins, then the fact settled on it (20_span_engine_facts.sql), then, for a span
-- not settled yet, the live join to the engine states (10_engine_states.sql); `<column>_source` says whether
-- the value is the `span`'s or the `engine`'s.
--
-- A read that needs only one kind of engine column uses the macro that joins only that kind
-- (storage/duckdb/window_source.py picks it): `llm_requests_fleet_between` the deployment's state,
-- `llm_requests_replica_between` the replica's. The three restate the same lookups and expressions, and the
-- settling macro (20_span_engine_facts.sql) states them once more: tests/test_engine_join.py runs every join
-- rule live and settled and holds a read of one engine column equal to the whole model's.
--
-- The lookups: `a` is the replica's last state at or before the second the request started in (arrival),
-- `e` its first at or after the end of the second it ended in, `d` the deployment's at arrival. A state is
-- current for two reporting intervals after its point: `a.second - a.time <= 2 intervals` is "current at
-- arrival", and a difference over the request's lifetime needs both ends current. Times are taken to the
-- second: states are looked up once per (replica, second) and hash-joined to the requests, a fifth of the
-- cost of an as-of join of every request (ten million requests: ~6 s against ~30 s).

CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    -- A request's replica, deployment and times are those of one of the window's LLM spans (the pairing takes
    -- them from its server span, else its client span): the lookups are keyed from the spans. Only spans not
    -- yet settled are looked up: a settled window joins against empty lookups.
    keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time FROM spans
        WHERE is_llm AND engine_settled IS NULL
          AND end_time >= t0::TIMESTAMP - INTERVAL 1 HOUR AND end_time < t1::TIMESTAMP + INTERVAL 1 HOUR
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
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms,
           -- the span's own value, else its settled fact, else prefix-cache hits / queries over the request's
           -- lifetime, else the hit rate the replica reported at arrival
           coalesce(r.cache_hit_ratio, coalesce(r.engine_cache_hit_ratio, coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                  AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                             AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                               AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END))) AS cache_hit_ratio,
           -- the span's own value, else its settled fact, else waiting requests summed over the deployment's
           -- replicas at arrival
           coalesce(r.queue_depth, coalesce(r.engine_queue_depth, (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END))) AS queue_depth,
           -- the span's own value, else its settled fact, else the deployment's replicas reporting at arrival
           coalesce(r.replica_count, coalesce(r.engine_replica_count, (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END))) AS replica_count,
           r.batch_size, r.prefill_tokens_in_batch, r.quantization, r.finish_reason, r.tenant_id, r.provider,
           r.operation,
           CASE WHEN r.queue_depth IS NOT NULL THEN 'span' WHEN coalesce(r.engine_queue_depth, (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END)) IS NOT NULL THEN 'engine' END
               AS queue_depth_source,
           CASE WHEN r.replica_count IS NOT NULL THEN 'span' WHEN coalesce(r.engine_replica_count, (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END)) IS NOT NULL THEN 'engine' END
               AS replica_count_source,
           CASE WHEN r.cache_hit_ratio IS NOT NULL THEN 'span' WHEN coalesce(r.engine_cache_hit_ratio, coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                  AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                             AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                               AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END)) IS NOT NULL THEN 'engine' END
               AS cache_hit_ratio_source,
           -- the replica's KV-cache usage at arrival: the settled fact, else the live join
           coalesce(r.engine_kv_cache_usage, CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.kv_cache_usage END) AS kv_cache_usage,
           -- the replica's running requests at arrival: the settled fact, else the live join
           coalesce(r.engine_running_requests, CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN CAST(round(a.running) AS BIGINT) END) AS running_requests,
           -- the replica's preemptions during the request: the settled fact, else the live join
           coalesce(r.engine_preemptions, CAST(round((CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                        AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                         THEN e.preemptions - a.preemptions END)) AS BIGINT)) AS preemptions,
           -- tokens per engine step during the request: the settled fact, else the live join
           coalesce(r.engine_step_tokens, CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                  AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                   THEN e.steps - a.steps END) > 0
                        THEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                  AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                   THEN e.step_tokens - a.step_tokens END)
                             / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                    AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                     THEN e.steps - a.steps END) END) AS step_tokens
    FROM r
    LEFT JOIN arrival AS a
      ON r.engine_settled IS NULL AND a.replica_id = r.replica_id AND a.second = date_trunc('second', r.start_time)
    LEFT JOIN departure AS e
      ON r.engine_settled IS NULL AND e.replica_id = r.replica_id
     AND e.second = date_trunc('second', r.end_time) + INTERVAL 1 SECOND
    LEFT JOIN fleet AS d
      ON r.engine_settled IS NULL AND d.deployment = r.deployment AND d.second = date_trunc('second', r.start_time);

CREATE OR REPLACE MACRO llm_requests_fleet_between(t0, t1) AS TABLE
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    -- A request's replica, deployment and times are those of one of the window's LLM spans (the pairing takes
    -- them from its server span, else its client span): the lookups are keyed from the spans. Only spans not
    -- yet settled are looked up: a settled window joins against empty lookups.
    keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time FROM spans
        WHERE is_llm AND engine_settled IS NULL
          AND end_time >= t0::TIMESTAMP - INTERVAL 1 HOUR AND end_time < t1::TIMESTAMP + INTERVAL 1 HOUR
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
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms, r.cache_hit_ratio,
           -- the span's own value, else its settled fact, else waiting requests summed over the deployment's
           -- replicas at arrival
           coalesce(r.queue_depth, coalesce(r.engine_queue_depth, (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END))) AS queue_depth,
           -- the span's own value, else its settled fact, else the deployment's replicas reporting at arrival
           coalesce(r.replica_count, coalesce(r.engine_replica_count, (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END))) AS replica_count,
           r.batch_size, r.prefill_tokens_in_batch, r.quantization, r.finish_reason, r.tenant_id, r.provider,
           r.operation,
           CASE WHEN r.queue_depth IS NOT NULL THEN 'span' WHEN coalesce(r.engine_queue_depth, (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END)) IS NOT NULL THEN 'engine' END
               AS queue_depth_source,
           CASE WHEN r.replica_count IS NOT NULL THEN 'span' WHEN coalesce(r.engine_replica_count, (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END)) IS NOT NULL THEN 'engine' END
               AS replica_count_source
    FROM r
    LEFT JOIN fleet AS d
      ON r.engine_settled IS NULL AND d.deployment = r.deployment AND d.second = date_trunc('second', r.start_time);

CREATE OR REPLACE MACRO llm_requests_replica_between(t0, t1) AS TABLE
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    -- A request's replica, deployment and times are those of one of the window's LLM spans (the pairing takes
    -- them from its server span, else its client span): the lookups are keyed from the spans. Only spans not
    -- yet settled are looked up: a settled window joins against empty lookups.
    keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time FROM spans
        WHERE is_llm AND engine_settled IS NULL
          AND end_time >= t0::TIMESTAMP - INTERVAL 1 HOUR AND end_time < t1::TIMESTAMP + INTERVAL 1 HOUR
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
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time >= k.second)
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms,
           -- the span's own value, else its settled fact, else prefix-cache hits / queries over the request's
           -- lifetime, else the hit rate the replica reported at arrival
           coalesce(r.cache_hit_ratio, coalesce(r.engine_cache_hit_ratio, coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                  AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                             AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                               AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END))) AS cache_hit_ratio,
           r.queue_depth, r.replica_count, r.batch_size, r.prefill_tokens_in_batch, r.quantization, r.finish_reason,
           r.tenant_id, r.provider, r.operation,
           CASE WHEN r.cache_hit_ratio IS NOT NULL THEN 'span' WHEN coalesce(r.engine_cache_hit_ratio, coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                  AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                             AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                               AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END)) IS NOT NULL THEN 'engine' END
               AS cache_hit_ratio_source,
           -- the replica's KV-cache usage at arrival: the settled fact, else the live join
           coalesce(r.engine_kv_cache_usage, CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.kv_cache_usage END) AS kv_cache_usage,
           -- the replica's running requests at arrival: the settled fact, else the live join
           coalesce(r.engine_running_requests, CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN CAST(round(a.running) AS BIGINT) END) AS running_requests,
           -- the replica's preemptions during the request: the settled fact, else the live join
           coalesce(r.engine_preemptions, CAST(round((CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                        AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                         THEN e.preemptions - a.preemptions END)) AS BIGINT)) AS preemptions,
           -- tokens per engine step during the request: the settled fact, else the live join
           coalesce(r.engine_step_tokens, CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                  AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                   THEN e.steps - a.steps END) > 0
                        THEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                  AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                   THEN e.step_tokens - a.step_tokens END)
                             / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                    AND e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))
                                     THEN e.steps - a.steps END) END) AS step_tokens
    FROM r
    LEFT JOIN arrival AS a
      ON r.engine_settled IS NULL AND a.replica_id = r.replica_id AND a.second = date_trunc('second', r.start_time)
    LEFT JOIN departure AS e
      ON r.engine_settled IS NULL AND e.replica_id = r.replica_id
     AND e.second = date_trunc('second', r.end_time) + INTERVAL 1 SECOND;

-- Every request of all stored time.
CREATE OR REPLACE VIEW llm_requests AS
SELECT * FROM llm_requests_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);
