-- `llm_requests_between(t0, t1)`: the request model as analysts and the detectors read it. The spans' model
-- (30_span_requests.sql: one row per request attempt) with the engine facts filled in:
-- - `queue_depth`: the most waiting requests of the request's fleet while it waited;
-- - `replica_count`: the most of the fleet's replicas reporting while it waited;
-- - `cache_hit_ratio`: the replica's prefix-cache hits / queries over the request's lifetime;
-- - `kv_cache_usage` and `running_requests`, the most of the replica while the request waited,
--   `preemptions` during the request, and `step_tokens` (tokens per engine step during the request), which
--   only the engines report;
-- - `engine_facts_reason`: why those the replica gives are missing, NULL when none is.
-- A span's own value always wins, then the fact settled on it (20_span_engine_facts.sql), then, for a span
-- not settled yet, the live join to the engine states (10_engine_states.sql); `<column>_source` says whether
-- the value is the `span`'s or the `engine`'s.
--
-- A read that needs only one kind of engine column uses the macro that joins only that kind
-- (storage/duckdb/window_source.py picks it): `llm_requests_fleet_between` the fleet's state,
-- `llm_requests_replica_between` the replica's. The three restate the same lookups and expressions, and the
-- settling macro (20_span_engine_facts.sql) states them once more: tests/test_engine_join.py runs every join
-- rule live and settled and holds a read of one engine column equal to the whole model's.
--
-- The lookups: `a` is the replica's last state at or before the second the request started in (arrival),
-- `e` its first at or after the end of the second it ended in, `w` its states while the request waited
-- (after its arrival second, up to the second its wait ended in), `d` its fleet's totals over the same
-- seconds. A state is current for two reporting intervals after its point: `a.second - a.time <= 2
-- intervals` is "current at arrival", and a difference over the request's lifetime needs both ends current.
-- Why the wait and not the arrival alone: the head of a burst arrives before any report has seen the queue
-- it forms, and reads an idle engine at arrival; the time it then spent queued says how long the engine's
-- state held it, and that state is in the points. Times are taken to the second: states are looked up once
-- per (replica, second) and hash-joined to the requests, a fifth of the cost of an as-of join of every
-- request (ten million requests: ~6 s against ~30 s).

CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    -- A request's replica, deployment and times are those of one of the window's LLM spans (the pairing takes
    -- them from its server span, else its client span): the lookups are keyed from the spans. Only spans not
    -- yet settled are looked up: a settled window joins against empty lookups. `second` is the second a
    -- request arrived in, `wait_second` the second its wait ended in: arrival + its time in the queue (vLLM's
    -- time_in_queue), else + its time to first token less its prefill, else arrival itself; never past its end.
    keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time, date_trunc('second', start_time) AS second,
               date_trunc('second', start_time + to_microseconds(CAST(1000 * least(greatest(coalesce(queue_ms, ttft_ms - prefill_ms, 0), 0), date_diff('millisecond', start_time, end_time)) AS BIGINT))) AS wait_second
        FROM spans
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
    arrival AS MATERIALIZED (
        SELECT k.*, s.* EXCLUDE (replica_id) FROM (
            SELECT DISTINCT replica_id, second FROM keys
            WHERE replica_id IS NOT NULL AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time <= k.second),
    departure AS (
        SELECT k.*, s.* EXCLUDE (replica_id) FROM (
            SELECT DISTINCT replica_id, date_trunc('second', end_time) + INTERVAL 1 SECOND AS second FROM keys
            WHERE replica_id IS NOT NULL AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time >= k.second),
    -- The replica while the request waited: its points after the second it arrived in, up to the second its
    -- wait ended in (the point current at arrival is `arrival`'s). A request that did not wait past its
    -- arrival second has none. The most running requests and KV-cache usage seen: what the request met.
    waited AS (
        SELECT k.replica_id, k.second, k.wait_second, max(s.running) AS running,
               max(s.kv_cache_usage) AS kv_cache_usage
        FROM (
            SELECT DISTINCT replica_id, second, wait_second FROM keys
            WHERE replica_id IS NOT NULL AND wait_second > second AND EXISTS (SELECT 1 FROM states)
        ) AS k
        JOIN states AS s ON s.replica_id = k.replica_id AND s.time > k.second AND s.time <= k.wait_second
        GROUP BY k.replica_id, k.second, k.wait_second),
    -- The request's fleet. By name when the engine points carry the request's deployment (a scrape job or a
    -- scrape target's `deployment` named after the spans' service: the operator's own mapping wins); else the
    -- replicas sharing its replica's metric identity (engine_states_between's `fleet`) at arrival, or at its
    -- first point in reach when it had none by then. Neither: no fleet.
    named AS MATERIALIZED (SELECT DISTINCT deployment FROM states WHERE deployment IS NOT NULL),
    identities AS (SELECT replica_id, arg_min(fleet, time) AS fleet FROM states GROUP BY replica_id),
    fleet_keys AS MATERIALIZED (
        SELECT k.replica_id, k.deployment, k.second, k.wait_second,
               coalesce(k.deployment IN (SELECT deployment FROM named), false) AS by_name,
               CASE WHEN k.deployment IN (SELECT deployment FROM named) THEN k.deployment
                    ELSE coalesce(a.fleet, i.fleet) END AS fleet
        FROM (
            SELECT DISTINCT replica_id, deployment, second, wait_second FROM keys WHERE EXISTS (SELECT 1 FROM states)
        ) AS k
        LEFT JOIN arrival AS a ON a.replica_id = k.replica_id AND a.second = k.second
        LEFT JOIN identities AS i ON i.replica_id = k.replica_id
    ),
    -- The fleets' totals (engine_fleet_states_between's body, over the states read above, for the fleets the
    -- requests need), then what each request met: the totals current at the second it arrived in, and every
    -- change up to the second its wait ended in. The most waiting requests seen is its queue; the most
    -- replicas reporting, its replicas.
    fleet_states AS (
        SELECT true AS by_name, deployment AS fleet, replica_id, time, waiting, interval_s FROM states
        WHERE deployment IN (SELECT fleet FROM fleet_keys WHERE by_name)
        UNION ALL
        SELECT false AS by_name, fleet, replica_id, time, waiting, interval_s FROM states
        WHERE fleet IN (SELECT fleet FROM fleet_keys WHERE NOT by_name)
    ),
    fleets AS MATERIALIZED (
        WITH s AS (
            SELECT *, lag(time) OVER r AS prev_time, lag(waiting) OVER r AS prev_waiting, lead(time) OVER r AS next_time
            FROM fleet_states
            WINDOW r AS (PARTITION BY by_name, fleet, replica_id ORDER BY time)
        ),
        events AS (
            SELECT by_name, fleet, time,
                   coalesce(waiting, 0)
                   - CASE WHEN time - prev_time <= (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
                          THEN coalesce(prev_waiting, 0) ELSE 0 END AS d_waiting,
                   CASE WHEN time - prev_time <= (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
                        THEN 0 ELSE 1 END AS d_replicas
            FROM s
            UNION ALL
            SELECT by_name, fleet, time + (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND), -coalesce(waiting, 0), -1
            FROM s
            WHERE next_time IS NULL OR next_time - time > (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
        )
        SELECT by_name, fleet, time,
               sum(d_waiting) OVER d AS waiting,
               sum(d_replicas) OVER d AS replicas
        FROM events
        WINDOW d AS (PARTITION BY by_name, fleet ORDER BY time RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    ),
    fleet_at AS (
        SELECT k.*, s.waiting, s.replicas FROM (
            SELECT DISTINCT by_name, fleet, second FROM fleet_keys WHERE fleet IS NOT NULL
        ) AS k
        ASOF LEFT JOIN fleets AS s ON s.by_name = k.by_name AND s.fleet = k.fleet AND s.time <= k.second),
    fleet_waited AS (
        SELECT k.by_name, k.fleet, k.second, k.wait_second, max(s.waiting) AS waiting, max(s.replicas) AS replicas
        FROM (
            SELECT DISTINCT by_name, fleet, second, wait_second FROM fleet_keys
            WHERE fleet IS NOT NULL AND wait_second > second
        ) AS k
        JOIN fleets AS s ON s.by_name = k.by_name AND s.fleet = k.fleet AND s.time > k.second AND s.time <= k.wait_second
        GROUP BY k.by_name, k.fleet, k.second, k.wait_second),
    fleet AS (
        SELECT f.replica_id, f.deployment, f.second, f.wait_second,
               greatest(CASE WHEN fa.replicas > 0 THEN fa.waiting END, fw.waiting) AS waiting,
               greatest(fa.replicas, fw.replicas) AS replicas
        FROM fleet_keys AS f
        LEFT JOIN fleet_at AS fa ON fa.by_name = f.by_name AND fa.fleet = f.fleet AND fa.second = f.second
        LEFT JOIN fleet_waited AS fw
          ON fw.by_name = f.by_name AND fw.fleet = f.fleet AND fw.second = f.second AND fw.wait_second = f.wait_second)
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms,
           -- the span's own value, else its settled fact, else prefix-cache hits / queries over the request's
           -- lifetime, else the hit rate the replica reported at arrival
           coalesce(r.cache_hit_ratio, coalesce(r.engine_cache_hit_ratio, coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END))) AS cache_hit_ratio,
           -- the span's own value, else its settled fact, else the most waiting requests of its fleet's replicas
           -- while it waited
           coalesce(r.queue_depth, coalesce(r.engine_queue_depth, (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END))) AS queue_depth,
           -- the span's own value, else its settled fact, else its fleet's replicas reporting while it waited
           coalesce(r.replica_count, coalesce(r.engine_replica_count, (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END))) AS replica_count,
           r.batch_size, r.prefill_tokens_in_batch, r.quantization, r.finish_reason, r.tenant_id, r.provider,
           r.operation,
           CASE WHEN r.queue_depth IS NOT NULL THEN 'span' WHEN coalesce(r.engine_queue_depth, (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END)) IS NOT NULL THEN 'engine' END
               AS queue_depth_source,
           CASE WHEN r.replica_count IS NOT NULL THEN 'span' WHEN coalesce(r.engine_replica_count, (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END)) IS NOT NULL THEN 'engine' END
               AS replica_count_source,
           CASE WHEN r.cache_hit_ratio IS NOT NULL THEN 'span' WHEN coalesce(r.engine_cache_hit_ratio, coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END)) IS NOT NULL THEN 'engine' END
               AS cache_hit_ratio_source,
           -- the most KV-cache usage of the replica while the request waited: the settled fact, else the live join
           coalesce(r.engine_kv_cache_usage, greatest(CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.kv_cache_usage END, w.kv_cache_usage)) AS kv_cache_usage,
           -- the most running requests of the replica while the request waited: the settled fact, else the live join
           coalesce(r.engine_running_requests, CAST(round(greatest(CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.running END, w.running)) AS BIGINT)) AS running_requests,
           -- the replica's preemptions during the request: the settled fact, else the live join
           coalesce(r.engine_preemptions, CAST(round((CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.preemptions - a.preemptions END)) AS BIGINT)) AS preemptions,
           -- tokens per engine step during the request: the settled fact, else the live join
           coalesce(r.engine_step_tokens, CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.steps - a.steps END) > 0
                        THEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.step_tokens - a.step_tokens END)
                             / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.steps - a.steps END) END) AS step_tokens,
           -- why the engine facts are incomplete (NULL: they are not): the settled reason, else the live join's
           CASE WHEN r.engine_settled IS NOT NULL THEN r.engine_facts_reason
                ELSE CASE WHEN r.replica_id IS NULL THEN 'no_replica'
                WHEN NOT coalesce((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) AND w.replica_id IS NULL
                     AND NOT coalesce((e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'no_points_for_replica'
                WHEN NOT coalesce((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'stale'
                WHEN NOT coalesce((e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'source_behind' END END AS engine_facts_reason
    FROM r
    LEFT JOIN arrival AS a
      ON r.engine_settled IS NULL AND a.replica_id = r.replica_id AND a.second = date_trunc('second', r.start_time)
    LEFT JOIN departure AS e
      ON r.engine_settled IS NULL AND e.replica_id = r.replica_id
     AND e.second = date_trunc('second', r.end_time) + INTERVAL 1 SECOND
    LEFT JOIN waited AS w
      ON r.engine_settled IS NULL AND w.replica_id = r.replica_id AND w.second = date_trunc('second', r.start_time)
     AND w.wait_second = date_trunc('second', r.start_time + to_microseconds(CAST(1000 * least(greatest(coalesce(r.queue_ms, r.ttft_ms - r.prefill_ms, 0), 0), date_diff('millisecond', r.start_time, r.end_time)) AS BIGINT)))
    LEFT JOIN fleet AS d
      ON r.engine_settled IS NULL AND d.replica_id IS NOT DISTINCT FROM r.replica_id AND d.deployment IS NOT DISTINCT FROM r.deployment
     AND d.second = date_trunc('second', r.start_time) AND d.wait_second = date_trunc('second', r.start_time + to_microseconds(CAST(1000 * least(greatest(coalesce(r.queue_ms, r.ttft_ms - r.prefill_ms, 0), 0), date_diff('millisecond', r.start_time, r.end_time)) AS BIGINT)));

CREATE OR REPLACE MACRO llm_requests_fleet_between(t0, t1) AS TABLE
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    -- A request's replica, deployment and times are those of one of the window's LLM spans (the pairing takes
    -- them from its server span, else its client span): the lookups are keyed from the spans. Only spans not
    -- yet settled are looked up: a settled window joins against empty lookups. `second` is the second a
    -- request arrived in, `wait_second` the second its wait ended in: arrival + its time in the queue (vLLM's
    -- time_in_queue), else + its time to first token less its prefill, else arrival itself; never past its end.
    keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time, date_trunc('second', start_time) AS second,
               date_trunc('second', start_time + to_microseconds(CAST(1000 * least(greatest(coalesce(queue_ms, ttft_ms - prefill_ms, 0), 0), date_diff('millisecond', start_time, end_time)) AS BIGINT))) AS wait_second
        FROM spans
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
            SELECT DISTINCT replica_id, second FROM keys
            WHERE replica_id IS NOT NULL AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time <= k.second),
    -- The request's fleet. By name when the engine points carry the request's deployment (a scrape job or a
    -- scrape target's `deployment` named after the spans' service: the operator's own mapping wins); else the
    -- replicas sharing its replica's metric identity (engine_states_between's `fleet`) at arrival, or at its
    -- first point in reach when it had none by then. Neither: no fleet.
    named AS MATERIALIZED (SELECT DISTINCT deployment FROM states WHERE deployment IS NOT NULL),
    identities AS (SELECT replica_id, arg_min(fleet, time) AS fleet FROM states GROUP BY replica_id),
    fleet_keys AS MATERIALIZED (
        SELECT k.replica_id, k.deployment, k.second, k.wait_second,
               coalesce(k.deployment IN (SELECT deployment FROM named), false) AS by_name,
               CASE WHEN k.deployment IN (SELECT deployment FROM named) THEN k.deployment
                    ELSE coalesce(a.fleet, i.fleet) END AS fleet
        FROM (
            SELECT DISTINCT replica_id, deployment, second, wait_second FROM keys WHERE EXISTS (SELECT 1 FROM states)
        ) AS k
        LEFT JOIN arrival AS a ON a.replica_id = k.replica_id AND a.second = k.second
        LEFT JOIN identities AS i ON i.replica_id = k.replica_id
    ),
    -- The fleets' totals (engine_fleet_states_between's body, over the states read above, for the fleets the
    -- requests need), then what each request met: the totals current at the second it arrived in, and every
    -- change up to the second its wait ended in. The most waiting requests seen is its queue; the most
    -- replicas reporting, its replicas.
    fleet_states AS (
        SELECT true AS by_name, deployment AS fleet, replica_id, time, waiting, interval_s FROM states
        WHERE deployment IN (SELECT fleet FROM fleet_keys WHERE by_name)
        UNION ALL
        SELECT false AS by_name, fleet, replica_id, time, waiting, interval_s FROM states
        WHERE fleet IN (SELECT fleet FROM fleet_keys WHERE NOT by_name)
    ),
    fleets AS MATERIALIZED (
        WITH s AS (
            SELECT *, lag(time) OVER r AS prev_time, lag(waiting) OVER r AS prev_waiting, lead(time) OVER r AS next_time
            FROM fleet_states
            WINDOW r AS (PARTITION BY by_name, fleet, replica_id ORDER BY time)
        ),
        events AS (
            SELECT by_name, fleet, time,
                   coalesce(waiting, 0)
                   - CASE WHEN time - prev_time <= (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
                          THEN coalesce(prev_waiting, 0) ELSE 0 END AS d_waiting,
                   CASE WHEN time - prev_time <= (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
                        THEN 0 ELSE 1 END AS d_replicas
            FROM s
            UNION ALL
            SELECT by_name, fleet, time + (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND), -coalesce(waiting, 0), -1
            FROM s
            WHERE next_time IS NULL OR next_time - time > (CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)
        )
        SELECT by_name, fleet, time,
               sum(d_waiting) OVER d AS waiting,
               sum(d_replicas) OVER d AS replicas
        FROM events
        WINDOW d AS (PARTITION BY by_name, fleet ORDER BY time RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    ),
    fleet_at AS (
        SELECT k.*, s.waiting, s.replicas FROM (
            SELECT DISTINCT by_name, fleet, second FROM fleet_keys WHERE fleet IS NOT NULL
        ) AS k
        ASOF LEFT JOIN fleets AS s ON s.by_name = k.by_name AND s.fleet = k.fleet AND s.time <= k.second),
    fleet_waited AS (
        SELECT k.by_name, k.fleet, k.second, k.wait_second, max(s.waiting) AS waiting, max(s.replicas) AS replicas
        FROM (
            SELECT DISTINCT by_name, fleet, second, wait_second FROM fleet_keys
            WHERE fleet IS NOT NULL AND wait_second > second
        ) AS k
        JOIN fleets AS s ON s.by_name = k.by_name AND s.fleet = k.fleet AND s.time > k.second AND s.time <= k.wait_second
        GROUP BY k.by_name, k.fleet, k.second, k.wait_second),
    fleet AS (
        SELECT f.replica_id, f.deployment, f.second, f.wait_second,
               greatest(CASE WHEN fa.replicas > 0 THEN fa.waiting END, fw.waiting) AS waiting,
               greatest(fa.replicas, fw.replicas) AS replicas
        FROM fleet_keys AS f
        LEFT JOIN fleet_at AS fa ON fa.by_name = f.by_name AND fa.fleet = f.fleet AND fa.second = f.second
        LEFT JOIN fleet_waited AS fw
          ON fw.by_name = f.by_name AND fw.fleet = f.fleet AND fw.second = f.second AND fw.wait_second = f.wait_second)
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms, r.cache_hit_ratio,
           -- the span's own value, else its settled fact, else the most waiting requests of its fleet's replicas
           -- while it waited
           coalesce(r.queue_depth, coalesce(r.engine_queue_depth, (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END))) AS queue_depth,
           -- the span's own value, else its settled fact, else its fleet's replicas reporting while it waited
           coalesce(r.replica_count, coalesce(r.engine_replica_count, (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END))) AS replica_count,
           r.batch_size, r.prefill_tokens_in_batch, r.quantization, r.finish_reason, r.tenant_id, r.provider,
           r.operation,
           CASE WHEN r.queue_depth IS NOT NULL THEN 'span' WHEN coalesce(r.engine_queue_depth, (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END)) IS NOT NULL THEN 'engine' END
               AS queue_depth_source,
           CASE WHEN r.replica_count IS NOT NULL THEN 'span' WHEN coalesce(r.engine_replica_count, (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END)) IS NOT NULL THEN 'engine' END
               AS replica_count_source
    FROM r
    LEFT JOIN fleet AS d
      ON r.engine_settled IS NULL AND d.replica_id IS NOT DISTINCT FROM r.replica_id AND d.deployment IS NOT DISTINCT FROM r.deployment
     AND d.second = date_trunc('second', r.start_time) AND d.wait_second = date_trunc('second', r.start_time + to_microseconds(CAST(1000 * least(greatest(coalesce(r.queue_ms, r.ttft_ms - r.prefill_ms, 0), 0), date_diff('millisecond', r.start_time, r.end_time)) AS BIGINT)));

CREATE OR REPLACE MACRO llm_requests_replica_between(t0, t1) AS TABLE
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    -- A request's replica, deployment and times are those of one of the window's LLM spans (the pairing takes
    -- them from its server span, else its client span): the lookups are keyed from the spans. Only spans not
    -- yet settled are looked up: a settled window joins against empty lookups. `second` is the second a
    -- request arrived in, `wait_second` the second its wait ended in: arrival + its time in the queue (vLLM's
    -- time_in_queue), else + its time to first token less its prefill, else arrival itself; never past its end.
    keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time, date_trunc('second', start_time) AS second,
               date_trunc('second', start_time + to_microseconds(CAST(1000 * least(greatest(coalesce(queue_ms, ttft_ms - prefill_ms, 0), 0), date_diff('millisecond', start_time, end_time)) AS BIGINT))) AS wait_second
        FROM spans
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
            SELECT DISTINCT replica_id, second FROM keys
            WHERE replica_id IS NOT NULL AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time <= k.second),
    departure AS (
        SELECT k.*, s.* EXCLUDE (replica_id) FROM (
            SELECT DISTINCT replica_id, date_trunc('second', end_time) + INTERVAL 1 SECOND AS second FROM keys
            WHERE replica_id IS NOT NULL AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time >= k.second),
    -- The replica while the request waited: its points after the second it arrived in, up to the second its
    -- wait ended in (the point current at arrival is `arrival`'s). A request that did not wait past its
    -- arrival second has none. The most running requests and KV-cache usage seen: what the request met.
    waited AS (
        SELECT k.replica_id, k.second, k.wait_second, max(s.running) AS running,
               max(s.kv_cache_usage) AS kv_cache_usage
        FROM (
            SELECT DISTINCT replica_id, second, wait_second FROM keys
            WHERE replica_id IS NOT NULL AND wait_second > second AND EXISTS (SELECT 1 FROM states)
        ) AS k
        JOIN states AS s ON s.replica_id = k.replica_id AND s.time > k.second AND s.time <= k.wait_second
        GROUP BY k.replica_id, k.second, k.wait_second)
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms,
           -- the span's own value, else its settled fact, else prefix-cache hits / queries over the request's
           -- lifetime, else the hit rate the replica reported at arrival
           coalesce(r.cache_hit_ratio, coalesce(r.engine_cache_hit_ratio, coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END))) AS cache_hit_ratio,
           r.queue_depth, r.replica_count, r.batch_size, r.prefill_tokens_in_batch, r.quantization, r.finish_reason,
           r.tenant_id, r.provider, r.operation,
           CASE WHEN r.cache_hit_ratio IS NOT NULL THEN 'span' WHEN coalesce(r.engine_cache_hit_ratio, coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END)) IS NOT NULL THEN 'engine' END
               AS cache_hit_ratio_source,
           -- the most KV-cache usage of the replica while the request waited: the settled fact, else the live join
           coalesce(r.engine_kv_cache_usage, greatest(CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.kv_cache_usage END, w.kv_cache_usage)) AS kv_cache_usage,
           -- the most running requests of the replica while the request waited: the settled fact, else the live join
           coalesce(r.engine_running_requests, CAST(round(greatest(CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.running END, w.running)) AS BIGINT)) AS running_requests,
           -- the replica's preemptions during the request: the settled fact, else the live join
           coalesce(r.engine_preemptions, CAST(round((CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.preemptions - a.preemptions END)) AS BIGINT)) AS preemptions,
           -- tokens per engine step during the request: the settled fact, else the live join
           coalesce(r.engine_step_tokens, CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.steps - a.steps END) > 0
                        THEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.step_tokens - a.step_tokens END)
                             / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.steps - a.steps END) END) AS step_tokens,
           -- why the engine facts are incomplete (NULL: they are not): the settled reason, else the live join's
           CASE WHEN r.engine_settled IS NOT NULL THEN r.engine_facts_reason
                ELSE CASE WHEN r.replica_id IS NULL THEN 'no_replica'
                WHEN NOT coalesce((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) AND w.replica_id IS NULL
                     AND NOT coalesce((e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'no_points_for_replica'
                WHEN NOT coalesce((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'stale'
                WHEN NOT coalesce((e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'source_behind' END END AS engine_facts_reason
    FROM r
    LEFT JOIN arrival AS a
      ON r.engine_settled IS NULL AND a.replica_id = r.replica_id AND a.second = date_trunc('second', r.start_time)
    LEFT JOIN departure AS e
      ON r.engine_settled IS NULL AND e.replica_id = r.replica_id
     AND e.second = date_trunc('second', r.end_time) + INTERVAL 1 SECOND
    LEFT JOIN waited AS w
      ON r.engine_settled IS NULL AND w.replica_id = r.replica_id AND w.second = date_trunc('second', r.start_time)
     AND w.wait_second = date_trunc('second', r.start_time + to_microseconds(CAST(1000 * least(greatest(coalesce(r.queue_ms, r.ttft_ms - r.prefill_ms, 0), 0), date_diff('millisecond', r.start_time, r.end_time)) AS BIGINT)));

-- Every request of all stored time.
CREATE OR REPLACE VIEW llm_requests AS
SELECT * FROM llm_requests_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);
