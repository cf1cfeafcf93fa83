-- Settling: each LLM span's engine facts, computed once the engine metrics around it have arrived and stored
-- beside it (`engine_*` columns, `engine_settled`), so that reads of settled windows join nothing
-- (storage/duckdb/engine_facts.py runs it; docs/engine-metrics.md).
--
-- The unsettled LLM spans that ended in [t0, t1) and are ready to settle, with the facts of their own
-- replica, fleet and times, by the same rules as the live join of 40_requests.sql: what the engines said,
-- NULL when they said nothing, never the span's own value, and `facts_reason`, why some are missing. `row_id`
-- is the stored row, so that the writer's update finds it without comparing ids; it reads `span_rows`, whose
-- rows have ids (a view's do not).
--
-- Ready: each metrics source has its own horizon, its newest point. A span whose replica's source reported
-- in the hour before it (or since) waits until that source has reported past its end (its `departure` state
-- exists), so a Collector that lags does not have its replicas' requests settled without their facts. After
-- a bounded wait (the engine points as a whole an hour past the span's end) it settles with what exists, its
-- `facts_reason` saying what is missing. A span with no replica, or whose replica has no source, has nothing
-- of its own to wait for: it settles once any engine has reported past its end.
--
-- The lookups: `a` is the replica's last state at or before the second the span started in (arrival), `e`
-- its first at or after the end of the second it ended in, `w` its states while the span waited, `d` its
-- fleet's totals over those seconds. A state is current for two reporting intervals after its point:
-- `a.second - a.time <= 2 intervals` is "current at arrival", and a difference over the span's lifetime needs
-- both ends current.
CREATE OR REPLACE MACRO span_engine_facts_between(t0, t1) AS TABLE
    WITH keys AS NOT MATERIALIZED (
        SELECT rowid AS row_id, replica_id, deployment, start_time, end_time, date_trunc('second', start_time) AS second,
               date_trunc('second', start_time + to_microseconds(CAST(1000 * least(greatest(coalesce(queue_ms, ttft_ms - prefill_ms, 0), 0), date_diff('millisecond', start_time, end_time)) AS BIGINT))) AS wait_second
        FROM span_rows
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
          ON fw.by_name = f.by_name AND fw.fleet = f.fleet AND fw.second = f.second AND fw.wait_second = f.wait_second),
    -- The replicas with a source to wait for, and how far the engine points have arrived as a whole.
    sources AS MATERIALIZED (
        SELECT DISTINCT replica_id FROM engine_metrics
        WHERE metric IS NOT NULL AND replica_id IS NOT NULL
          AND time >= (SELECT lo FROM reach) - INTERVAL 1 HOUR AND time < (SELECT hi FROM reach)
    ),
    newest AS MATERIALIZED (SELECT max(time) AS time FROM engine_metrics WHERE metric IS NOT NULL)
    SELECT r.row_id,
           -- the most waiting requests of its fleet's replicas while it waited
           (CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END) AS queue_depth,
           -- its fleet's replicas reporting while it waited
           (CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END) AS replica_count,
           -- prefix-cache hits / queries over the request's lifetime, else the hit rate the replica reported at
           -- arrival
           coalesce(
                   CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                   THEN e.cache_queries - a.cache_queries END) > 0
                        THEN least(1.0, (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                              THEN e.cache_hits - a.cache_hits END)
                                        / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)))
                                                THEN e.cache_queries - a.cache_queries END)) END,
                   CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.cache_hit_rate END) AS cache_hit_ratio,
           -- the most KV-cache usage of the replica while it waited
           greatest(CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.kv_cache_usage END, w.kv_cache_usage) AS kv_cache_usage,
           -- the most running requests of the replica while it waited
           CAST(round(greatest(CASE WHEN (a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) THEN a.running END, w.running)) AS BIGINT) AS running_requests,
           -- the replica's preemptions during the request
           CAST(round((CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.preemptions - a.preemptions END)) AS BIGINT) AS preemptions,
           -- tokens per engine step during the request
           CASE WHEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.steps - a.steps END) > 0
                        THEN (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.step_tokens - a.step_tokens END)
                             / (CASE WHEN ((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)) AND (e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND))) THEN e.steps - a.steps END) END AS step_tokens,
           -- why some of the replica's facts are missing, NULL when none is
           CASE WHEN r.replica_id IS NULL THEN 'no_replica'
                WHEN NOT coalesce((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) AND w.replica_id IS NULL
                     AND NOT coalesce((e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'no_points_for_replica'
                WHEN NOT coalesce((a.second - a.time <= (CAST(2e6 * a.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'stale'
                WHEN NOT coalesce((e.time - e.second <= (CAST(2e6 * e.interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)), false) THEN 'source_behind' END AS facts_reason
    FROM keys AS r
    LEFT JOIN arrival AS a ON a.replica_id = r.replica_id AND a.second = r.second
    LEFT JOIN departure AS e
      ON e.replica_id = r.replica_id
     AND e.second = date_trunc('second', r.end_time) + INTERVAL 1 SECOND
    LEFT JOIN waited AS w ON w.replica_id = r.replica_id AND w.second = r.second AND w.wait_second = r.wait_second
    LEFT JOIN fleet AS d
      ON d.replica_id IS NOT DISTINCT FROM r.replica_id AND d.deployment IS NOT DISTINCT FROM r.deployment
     AND d.second = r.second AND d.wait_second = r.wait_second
    LEFT JOIN sources AS src ON src.replica_id = r.replica_id
    WHERE CASE WHEN src.replica_id IS NULL THEN r.end_time < (SELECT time FROM newest)
               ELSE e.time IS NOT NULL OR (SELECT time FROM newest) >= r.end_time + INTERVAL 1 HOUR END;
