-- The engines' state over time, from the points in `engine_metrics` (docs/engine-metrics.md): what the
-- request model joins to a request by its replica, its fleet and its times.
--
-- A value is current for two reporting intervals (`interval_s`) after its point. Counters are read as
-- differences: a drop, or a new start time, is a reset, and counting resumes from the new value. A retried
-- export's duplicate point counts once.
--
-- A replica's fleet is named by its metrics themselves, so that spans and scrape configurations need no
-- naming agreement: `fleet` is the point's `deployment` (its own service.name, which a Collector's scrape job
-- sets), its Kubernetes namespace and workload, and its model label. The workload is the first of
-- k8s.deployment.name, k8s.statefulset.name and k8s.replicaset.name the resource carries: a Deployment's
-- ReplicaSet changes with every rollout while the fleet does not. Points naming none of these make their
-- replica a fleet of its own.

-- One row per replica and point time: its fleet, its levels (waiting, running, KV-cache usage, hit rate) and
-- its counters as running totals from the first point in [t0, t1), so that two rows subtract to the growth
-- between them.
CREATE OR REPLACE MACRO engine_states_between(t0, t1) AS TABLE
    WITH points AS (
        -- The series is hashed once so the window below sorts integers, not label JSON.
        SELECT hash(replica_id, deployment, name, attributes) AS series, time, replica_id, deployment, metric, kind,
               start_time, value, interval_s
        FROM engine_metrics
        WHERE metric IS NOT NULL AND replica_id IS NOT NULL
          AND time >= t0::TIMESTAMP AND time < t1::TIMESTAMP
    ),
    -- What names the replica's fleet at each point time: its model label and its resource. Read apart from the
    -- window below, which would otherwise sort the resource's text with every point.
    named_by AS (
        SELECT replica_id, time, max(model) AS model, any_value(resource) AS resource
        FROM engine_metrics
        WHERE metric IS NOT NULL AND replica_id IS NOT NULL
          AND time >= t0::TIMESTAMP AND time < t1::TIMESTAMP
        GROUP BY replica_id, time
    ),
    increments AS (
        -- What each point adds: a gauge its level; a counter its growth since the series' previous point
        -- (a drop, or a new start time, is a reset: it grew by its whole value); a delta point itself.
        SELECT replica_id, deployment, metric, time, interval_s, kind,
               CASE WHEN kind = 'gauge' THEN value
                    WHEN kind = 'delta' THEN value
                    WHEN prev IS NULL THEN 0
                    WHEN value < prev OR start_time IS DISTINCT FROM prev_start THEN value
                    ELSE value - prev END AS amount
        FROM (
            SELECT *, lag(time) OVER series AS prev_time, lag(value) OVER series AS prev,
                   lag(start_time) OVER series AS prev_start
            FROM points
            WINDOW series AS (PARTITION BY series ORDER BY time, value)
        )
        -- A retried export stores a point twice: the second of a series' points at one time is dropped.
        WHERE prev_time IS DISTINCT FROM time
    ),
    pivoted AS (
        -- Summed over the replica's series: a data-parallel engine reports one series per rank. One row per
        -- replica and time, whatever its points say of its deployment (the largest), so that a request finds
        -- one state.
        SELECT replica_id, time, max(deployment) AS deployment, max(interval_s) AS interval_s,
               sum(amount) FILTER (WHERE metric = 'requests_waiting') AS waiting,
               sum(amount) FILTER (WHERE metric = 'requests_running') AS running,
               max(amount) FILTER (WHERE metric = 'kv_cache_usage') AS kv_cache_usage,
               avg(amount) FILTER (WHERE metric = 'cache_hit_rate') AS cache_hit_rate,
               sum(amount) FILTER (WHERE metric = 'prefix_cache_queries') AS d_queries,
               sum(amount) FILTER (WHERE metric = 'prefix_cache_hits') AS d_hits,
               sum(amount) FILTER (WHERE metric = 'preemptions') AS d_preemptions,
               sum(amount) FILTER (WHERE metric = 'step_tokens_sum') AS d_step_tokens,
               sum(amount) FILTER (WHERE metric = 'step_tokens_count') AS d_steps
        FROM increments
        GROUP BY replica_id, time
    )
    -- Counters as levels that grow from the first point in range: subtract two rows for the growth between.
    -- The fleet is read from the resource once per row here, not once per point.
    SELECT replica_id, deployment,
           coalesce(nullif(concat_ws(' ', deployment,
                                     'namespace=' || (n.resource->>'k8s.namespace.name'),
                                     'workload=' || coalesce(n.resource->>'k8s.deployment.name',
                                                             n.resource->>'k8s.statefulset.name',
                                                             n.resource->>'k8s.replicaset.name'),
                                     'model=' || n.model), ''),
                    'replica=' || replica_id) AS fleet,
           time, interval_s, waiting, running, kv_cache_usage, cache_hit_rate,
           sum(d_queries) OVER replica AS cache_queries,
           sum(d_hits) OVER replica AS cache_hits,
           sum(d_preemptions) OVER replica AS preemptions,
           sum(d_step_tokens) OVER replica AS step_tokens,
           sum(d_steps) OVER replica AS steps
    FROM pivoted JOIN named_by AS n USING (replica_id, time)
    WINDOW replica AS (PARTITION BY replica_id ORDER BY time ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);

-- A fleet's totals as a step function: each replica's latest current value enters when it arrives
-- (replacing that replica's previous one if still current) and leaves when it goes stale, two reporting
-- intervals later. `replicas` counts the replicas reporting. A fleet is named by the metrics' identity
-- (`fleet`), or with `by_name` by the points' `deployment` alone. The engine join restates this body over the
-- states it has already read (15_engine_facts.sql).
CREATE OR REPLACE MACRO engine_fleet_steps_between(t0, t1, by_name) AS TABLE
    WITH s AS (
        SELECT CASE WHEN by_name THEN deployment ELSE fleet END AS fleet, replica_id, time, waiting,
               CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND AS current_for,
               lag(time) OVER r AS prev_time, lag(waiting) OVER r AS prev_waiting, lead(time) OVER r AS next_time
        FROM engine_states_between(t0, t1)
        WHERE NOT by_name OR deployment IS NOT NULL
        WINDOW r AS (PARTITION BY CASE WHEN by_name THEN deployment ELSE fleet END, replica_id ORDER BY time)
    ),
    events AS (
        SELECT fleet, time,
               coalesce(waiting, 0)
               - CASE WHEN time - prev_time <= current_for THEN coalesce(prev_waiting, 0) ELSE 0 END AS d_waiting,
               CASE WHEN time - prev_time <= current_for THEN 0 ELSE 1 END AS d_replicas
        FROM s
        UNION ALL
        SELECT fleet, time + current_for, -coalesce(waiting, 0), -1
        FROM s
        WHERE next_time IS NULL OR next_time - time > current_for
    )
    SELECT fleet, time,
           sum(d_waiting) OVER d AS waiting,
           sum(d_replicas) OVER d AS replicas
    FROM events
    WINDOW d AS (PARTITION BY fleet ORDER BY time RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);

-- Each fleet's totals over time, the fleet named by the metrics' identity.
CREATE OR REPLACE MACRO engine_fleet_states_between(t0, t1) AS TABLE
    SELECT fleet, time, waiting, replicas FROM engine_fleet_steps_between(t0, t1, false);

-- The same by the points' `deployment` alone: the fleet of a request whose deployment the engine points
-- carry by name (15_engine_facts.sql).
CREATE OR REPLACE MACRO engine_deployment_states_between(t0, t1) AS TABLE
    SELECT fleet AS deployment, time, waiting, replicas FROM engine_fleet_steps_between(t0, t1, true);
