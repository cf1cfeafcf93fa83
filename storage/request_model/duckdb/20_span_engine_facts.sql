-- Settling: each LLM span's engine facts, computed once the engine metrics around it have arrived and stored
-- beside it (`engine_*` columns, `engine_settled`), so that reads of settled windows join nothing
-- (storage/duckdb/engine_facts.py runs it; docs/engine-metrics.md).
--
-- The unsettled LLM spans that ended in [t0, t1) and are ready to settle, with the facts of their own
-- replica, fleet and times as the engine join states them (15_engine_facts.sql, which the live request model
-- of 40_requests.sql reads too): what the engines said, NULL when they said nothing, never the span's own
-- value, and `facts_reason`, why some are missing. `row_id` is the stored row, so that the writer's update
-- finds it without comparing ids; it reads `span_rows`, whose rows have ids (a view's do not).
--
-- Ready: each metrics source has its own horizon, its newest point. A span whose replica's source reported
-- in the hour before it (or since) waits until that source has reported past its end (its `departure` state
-- exists), so a Collector that lags does not have its replicas' requests settled without their facts. After
-- a bounded wait (the engine points as a whole an hour past the span's end) it settles with what exists, its
-- `facts_reason` saying what is missing. A span with no replica, or whose replica has no source, has nothing
-- of its own to wait for: it settles once any engine has reported past its end.
CREATE OR REPLACE MACRO span_engine_facts_between(t0, t1) AS TABLE
    WITH spans_to_settle AS (
        SELECT rowid AS row_id, replica_id, deployment, start_time, end_time,
               date_trunc('second', start_time) AS second,
               request_wait_ended(start_time, end_time, queue_ms, ttft_ms, prefill_ms) AS wait_second,
               date_trunc('second', end_time) + INTERVAL 1 SECOND AS end_second
        FROM span_rows
        WHERE is_llm AND engine_settled IS NULL AND end_time >= t0::TIMESTAMP AND end_time < t1::TIMESTAMP
    ),
    facts AS MATERIALIZED (SELECT * FROM engine_facts_between(t0, t1, true, true)),
    -- The replicas with a source to wait for, and how far the engine points have arrived as a whole.
    sources AS MATERIALIZED (
        SELECT DISTINCT replica_id FROM engine_metrics
        WHERE metric IS NOT NULL AND replica_id IS NOT NULL
          AND time >= (SELECT min(reach_lo) FROM facts) - INTERVAL 1 HOUR AND time < (SELECT max(reach_hi) FROM facts)
    ),
    newest AS MATERIALIZED (SELECT max(time) AS time FROM engine_metrics WHERE metric IS NOT NULL)
    SELECT r.row_id, f.queue_depth, f.replica_count, f.cache_hit_ratio, f.kv_cache_usage, f.running_requests,
           f.preemptions, f.step_tokens, f.facts_reason
    FROM spans_to_settle AS r
    JOIN facts AS f
      ON f.replica_id IS NOT DISTINCT FROM r.replica_id AND f.deployment IS NOT DISTINCT FROM r.deployment
     AND f.second = r.second AND f.wait_second = r.wait_second AND f.end_second = r.end_second
    LEFT JOIN sources AS src ON src.replica_id = r.replica_id
    WHERE CASE WHEN src.replica_id IS NULL THEN r.end_time < (SELECT time FROM newest)
               ELSE f.departure_time IS NOT NULL OR (SELECT time FROM newest) >= r.end_time + INTERVAL 1 HOUR END;
