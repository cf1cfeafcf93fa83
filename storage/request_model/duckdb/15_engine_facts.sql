-- What the engines said of the LLM spans waiting to be settled: the one statement of the engine join, read by
-- the live request model (40_requests.sql) and by settling (20_span_engine_facts.sql), so that a request's
-- facts are the same whether it is read before its spans are settled or after (docs/engine-metrics.md).

-- The second a request's wait ended in: its arrival plus its time in the queue (vLLM's time_in_queue), else
-- plus its time to first token less its prefill, else its arrival itself; never past its end.
CREATE OR REPLACE MACRO request_wait_ended(start_time, end_time, queue_ms, ttft_ms, prefill_ms) AS
    date_trunc('second', start_time + to_microseconds(CAST(1000 * least(
        greatest(coalesce(queue_ms, ttft_ms - prefill_ms, 0), 0), date_diff('millisecond', start_time, end_time)
    ) AS BIGINT)));

-- One row per key of the unsettled LLM spans that ended in [t0, t1): (replica_id, deployment, `second` it
-- arrived in, `wait_second` its wait ended in, `end_second`, the second after the one it ended in), with what
-- the engines said of a span with that key:
-- - `queue_depth`: the most waiting requests of its fleet while it waited;
-- - `replica_count`: the most of the fleet's replicas reporting while it waited;
-- - `cache_hit_ratio`: the replica's prefix-cache hits / queries over its lifetime, else the hit rate the
--   replica reported at arrival;
-- - `kv_cache_usage` and `running_requests`, the most of the replica while it waited, `preemptions` during
--   it, and `step_tokens` (tokens per engine step during it);
-- - `facts_reason`: why those the replica gives are missing, NULL when none is;
-- - `departure_time`: the replica's first point at or after `end_second` (settling waits for it), and
--   `reach_lo`, `reach_hi`: the times of the engine states read (the same on every row).
-- `replica_facts` and `fleet_facts` (constants) say which of the two lookups a read needs: the other is left
-- empty, and its columns NULL.
--
-- The lookups: `a` is the replica's last state at or before the second the span arrived in, `e` its first at
-- or after `end_second`, `w` its states while the span waited (after its arrival second, up to the second its
-- wait ended in), `d` its fleet's totals over the same seconds. A state is current for two reporting intervals
-- after its point (`current_for`): `is_current` at `a` is "current at arrival", and a difference over the span's
-- lifetime needs both ends current. Why the wait and not the arrival alone: the head of a burst arrives before
-- any report has seen the queue it forms, and reads an idle engine at arrival; the time it then spent queued
-- says how long the engine's state held it, and that state is in the points. Times are taken to the second:
-- states are looked up once per (replica, second) and hash-joined, a fifth of the cost of an as-of join of
-- every span (ten million: ~6 s against ~30 s).
CREATE OR REPLACE MACRO engine_facts_between(t0, t1, replica_facts, fleet_facts) AS TABLE
    WITH keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time, date_trunc('second', start_time) AS second,
               request_wait_ended(start_time, end_time, queue_ms, ttft_ms, prefill_ms) AS wait_second,
               date_trunc('second', end_time) + INTERVAL 1 SECOND AS end_second
        FROM span_rows
        WHERE is_llm AND engine_settled IS NULL AND end_time >= t0::TIMESTAMP AND end_time < t1::TIMESTAMP
    ),
    -- The states the spans can use: from two reporting intervals before the earliest arrival to two after the
    -- latest end. Bounded by the spans, not the window's margins, so a 5-minute window reads minutes of engine
    -- points, not hours.
    reach AS MATERIALIZED (
        SELECT lo - margin AS lo, hi + margin AS hi
        FROM (SELECT min(start_time) AS lo, max(end_time) AS hi FROM keys) AS span,
        LATERAL (
            SELECT CAST(2e6 * coalesce(max(interval_s), 0) AS BIGINT) * INTERVAL 1 MICROSECOND AS margin
            FROM engine_metrics WHERE time >= span.lo - INTERVAL 2 HOUR AND time < span.hi + INTERVAL 2 HOUR
        )
    ),
    states AS MATERIALIZED (
        SELECT *, CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND AS current_for,
               date_trunc('second', time) AS time_second
        FROM engine_states_between((SELECT lo FROM reach), (SELECT hi FROM reach))
    ),
    -- Each second of each wait that outlasted its arrival second: the states a wait saw are found by equality
    -- on (replica or fleet, second), where a range condition would compare every wait with every state of its
    -- replica or fleet (a day of requests: hours instead of seconds).
    wait_seconds AS MATERIALIZED (
        SELECT replica_id, deployment, second, wait_second,
               unnest(range(second, wait_second + INTERVAL 1 SECOND, INTERVAL 1 SECOND)) AS at_second
        FROM (SELECT DISTINCT replica_id, deployment, second, wait_second FROM keys WHERE wait_second > second)
    ),
    -- One row per (replica, second) the spans need: the replica's last state at or before the second a span
    -- started in (`arrival`), its first at or after `end_second` (`departure`). Empty when no engine reported
    -- in reach, so a fleet without engine metrics pays next to nothing.
    arrival AS MATERIALIZED (
        SELECT k.*, s.* EXCLUDE (replica_id), k.second - s.time <= s.current_for AS is_current FROM (
            SELECT DISTINCT replica_id, second FROM keys
            WHERE replica_id IS NOT NULL AND (replica_facts OR fleet_facts) AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time <= k.second),
    departure AS (
        SELECT k.*, s.* EXCLUDE (replica_id), s.time - k.second <= s.current_for AS is_current FROM (
            SELECT DISTINCT replica_id, end_second AS second FROM keys
            WHERE replica_id IS NOT NULL AND replica_facts AND EXISTS (SELECT 1 FROM states)
        ) AS k
        ASOF LEFT JOIN states AS s ON s.replica_id = k.replica_id AND s.time >= k.second),
    -- The replica while the span waited: its points after the second it arrived in, up to the second its wait
    -- ended in (the point current at arrival is `arrival`'s). A span that did not wait past its arrival second
    -- has none. The most running requests and KV-cache usage seen: what the request met.
    waited AS (
        SELECT k.replica_id, k.second, k.wait_second, max(s.running) AS running,
               max(s.kv_cache_usage) AS kv_cache_usage
        FROM (
            SELECT DISTINCT replica_id, second, wait_second, at_second FROM wait_seconds
            WHERE replica_id IS NOT NULL AND replica_facts AND EXISTS (SELECT 1 FROM states)
        ) AS k
        JOIN states AS s ON s.replica_id = k.replica_id AND s.time_second = k.at_second
        WHERE s.time > k.second AND s.time <= k.wait_second
        GROUP BY k.replica_id, k.second, k.wait_second),
    -- The span's fleet. By name when the engine points carry its deployment (a scrape job or a scrape target's
    -- `deployment` named after the spans' service: the operator's own mapping wins); else the replicas sharing
    -- its replica's metric identity (engine_states_between's `fleet`) at arrival, or at its first point in
    -- reach when it had none by then. Neither: no fleet.
    named AS MATERIALIZED (SELECT DISTINCT deployment FROM states WHERE deployment IS NOT NULL),
    identities AS (SELECT replica_id, arg_min(fleet, time) AS fleet FROM states GROUP BY replica_id),
    fleet_keys AS MATERIALIZED (
        SELECT k.replica_id, k.deployment, k.second, k.wait_second,
               coalesce(k.deployment IN (SELECT deployment FROM named), false) AS by_name,
               CASE WHEN k.deployment IN (SELECT deployment FROM named) THEN k.deployment
                    ELSE coalesce(a.fleet, i.fleet) END AS fleet
        FROM (
            SELECT DISTINCT replica_id, deployment, second, wait_second FROM keys
            WHERE fleet_facts AND EXISTS (SELECT 1 FROM states)
        ) AS k
        LEFT JOIN arrival AS a ON a.replica_id = k.replica_id AND a.second = k.second
        LEFT JOIN identities AS i ON i.replica_id = k.replica_id
    ),
    -- The fleets' totals (engine_fleet_states_between's body, over the states read above, for the fleets the
    -- spans need), then what each span met: the totals current at the second it arrived in, and every change
    -- up to the second its wait ended in. The most waiting requests seen is its queue; the most replicas
    -- reporting, its replicas.
    fleet_states AS (
        SELECT true AS by_name, deployment AS fleet, replica_id, time, waiting, current_for FROM states
        WHERE deployment IN (SELECT fleet FROM fleet_keys WHERE by_name)
        UNION ALL
        SELECT false AS by_name, fleet, replica_id, time, waiting, current_for FROM states
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
                   - CASE WHEN time - prev_time <= current_for THEN coalesce(prev_waiting, 0) ELSE 0 END AS d_waiting,
                   CASE WHEN time - prev_time <= current_for THEN 0 ELSE 1 END AS d_replicas
            FROM s
            UNION ALL
            SELECT by_name, fleet, time + current_for, -coalesce(waiting, 0), -1
            FROM s
            WHERE next_time IS NULL OR next_time - time > current_for
        )
        SELECT by_name, fleet, time, date_trunc('second', time) AS time_second,
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
            SELECT DISTINCT f.by_name, f.fleet, f.second, f.wait_second, w.at_second
            FROM fleet_keys AS f
            JOIN wait_seconds AS w
              ON w.replica_id IS NOT DISTINCT FROM f.replica_id AND w.deployment IS NOT DISTINCT FROM f.deployment
             AND w.second = f.second AND w.wait_second = f.wait_second
            WHERE f.fleet IS NOT NULL
        ) AS k
        JOIN fleets AS s ON s.by_name = k.by_name AND s.fleet = k.fleet AND s.time_second = k.at_second
        WHERE s.time > k.second AND s.time <= k.wait_second
        GROUP BY k.by_name, k.fleet, k.second, k.wait_second),
    fleet AS (
        SELECT f.replica_id, f.deployment, f.second, f.wait_second,
               greatest(CASE WHEN fa.replicas > 0 THEN fa.waiting END, fw.waiting) AS waiting,
               greatest(fa.replicas, fw.replicas) AS replicas
        FROM fleet_keys AS f
        LEFT JOIN fleet_at AS fa ON fa.by_name = f.by_name AND fa.fleet = f.fleet AND fa.second = f.second
        LEFT JOIN fleet_waited AS fw
          ON fw.by_name = f.by_name AND fw.fleet = f.fleet AND fw.second = f.second AND fw.wait_second = f.wait_second),
    -- What changed on the replica over the span's lifetime: a difference needs both ends current.
    lifetime AS (
        SELECT k.*, a.is_current AS arrival_current, e.is_current AS departure_current, e.time AS departure_time,
               w.replica_id IS NOT NULL AS has_waited,
               CASE WHEN a.is_current THEN a.cache_hit_rate END AS cache_hit_rate,
               greatest(CASE WHEN a.is_current THEN a.kv_cache_usage END, w.kv_cache_usage) AS kv_cache_usage,
               greatest(CASE WHEN a.is_current THEN a.running END, w.running) AS running,
               CASE WHEN a.is_current AND e.is_current THEN e.cache_queries - a.cache_queries END AS cache_queries,
               CASE WHEN a.is_current AND e.is_current THEN e.cache_hits - a.cache_hits END AS cache_hits,
               CASE WHEN a.is_current AND e.is_current THEN e.preemptions - a.preemptions END AS preemptions,
               CASE WHEN a.is_current AND e.is_current THEN e.step_tokens - a.step_tokens END AS step_tokens,
               CASE WHEN a.is_current AND e.is_current THEN e.steps - a.steps END AS steps,
               d.waiting, d.replicas
        FROM (SELECT DISTINCT replica_id, deployment, second, wait_second, end_second FROM keys) AS k
        LEFT JOIN arrival AS a ON a.replica_id = k.replica_id AND a.second = k.second
        LEFT JOIN departure AS e ON e.replica_id = k.replica_id AND e.second = k.end_second
        LEFT JOIN waited AS w ON w.replica_id = k.replica_id AND w.second = k.second AND w.wait_second = k.wait_second
        LEFT JOIN fleet AS d
          ON d.replica_id IS NOT DISTINCT FROM k.replica_id AND d.deployment IS NOT DISTINCT FROM k.deployment
         AND d.second = k.second AND d.wait_second = k.wait_second
    )
    SELECT replica_id, deployment, second, wait_second, end_second, departure_time,
           (SELECT lo FROM reach) AS reach_lo, (SELECT hi FROM reach) AS reach_hi,
           CASE WHEN replicas > 0 THEN CAST(round(waiting) AS BIGINT) END AS queue_depth,
           CASE WHEN replicas > 0 THEN CAST(replicas AS BIGINT) END AS replica_count,
           coalesce(CASE WHEN cache_queries > 0 THEN least(1.0, cache_hits / cache_queries) END, cache_hit_rate)
               AS cache_hit_ratio,
           kv_cache_usage,
           CAST(round(running) AS BIGINT) AS running_requests,
           CAST(round(preemptions) AS BIGINT) AS preemptions,
           CASE WHEN steps > 0 THEN step_tokens / steps END AS step_tokens,
           CASE WHEN replica_id IS NULL THEN 'no_replica'
                WHEN NOT coalesce(arrival_current, false) AND NOT has_waited AND NOT coalesce(departure_current, false)
                    THEN 'no_points_for_replica'
                WHEN NOT coalesce(arrival_current, false) THEN 'stale'
                WHEN NOT coalesce(departure_current, false) THEN 'source_behind' END AS facts_reason
    FROM lifetime;
