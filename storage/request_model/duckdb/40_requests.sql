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
-- not settled yet, the live engine join (15_engine_facts.sql, the statement settling stores too);
-- `<column>_source` says whether the value is the `span`'s or the `engine`'s.
--
-- A request's replica, deployment and times are those of one of the window's LLM spans (the pairing takes
-- them from its server span, else its client span). A settled window joins against nothing.
--
-- A read that needs only one kind of engine column uses the macro that joins only that kind
-- (storage/duckdb/window_source.py picks it): `llm_requests_fleet_between` the fleet's state,
-- `llm_requests_replica_between` the replica's. tests/test_engine_join.py runs every join rule live and
-- settled and holds a read of one engine column equal to the whole model's.

-- The spans' model with the engine columns filled as the request model fills them (`filled_*`, and the
-- columns only the engines give), beside the spans' own: a span's own value, then its settled fact, then
-- what the live engine join says of a request whose spans are not settled yet (`replica_facts` and
-- `fleet_facts` as engine_facts_between takes them). A request meets the facts of the span with its keys,
-- from the unsettled spans up to an hour around the window.
CREATE OR REPLACE MACRO llm_span_requests_joined_between(t0, t1, replica_facts, fleet_facts) AS TABLE
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    f AS MATERIALIZED (
        SELECT * FROM engine_facts_between(
            t0::TIMESTAMP - INTERVAL 1 HOUR, t1::TIMESTAMP + INTERVAL 1 HOUR, replica_facts, fleet_facts
        )
    )
    SELECT r.*,
           coalesce(r.cache_hit_ratio, r.engine_cache_hit_ratio, f.cache_hit_ratio) AS filled_cache_hit_ratio,
           coalesce(r.queue_depth, r.engine_queue_depth, f.queue_depth) AS filled_queue_depth,
           coalesce(r.replica_count, r.engine_replica_count, f.replica_count) AS filled_replica_count,
           CASE WHEN r.queue_depth IS NOT NULL THEN 'span'
                WHEN coalesce(r.engine_queue_depth, f.queue_depth) IS NOT NULL THEN 'engine' END
               AS queue_depth_source,
           CASE WHEN r.replica_count IS NOT NULL THEN 'span'
                WHEN coalesce(r.engine_replica_count, f.replica_count) IS NOT NULL THEN 'engine' END
               AS replica_count_source,
           CASE WHEN r.cache_hit_ratio IS NOT NULL THEN 'span'
                WHEN coalesce(r.engine_cache_hit_ratio, f.cache_hit_ratio) IS NOT NULL THEN 'engine' END
               AS cache_hit_ratio_source,
           coalesce(r.engine_kv_cache_usage, f.kv_cache_usage) AS kv_cache_usage,
           coalesce(r.engine_running_requests, f.running_requests) AS running_requests,
           coalesce(r.engine_preemptions, f.preemptions) AS preemptions,
           coalesce(r.engine_step_tokens, f.step_tokens) AS step_tokens,
           CASE WHEN r.engine_settled IS NOT NULL THEN r.engine_facts_reason ELSE f.facts_reason END
               AS filled_engine_facts_reason
    FROM r
    LEFT JOIN f
      ON r.engine_settled IS NULL
     AND f.replica_id IS NOT DISTINCT FROM r.replica_id AND f.deployment IS NOT DISTINCT FROM r.deployment
     AND f.second = date_trunc('second', r.start_time)
     AND f.wait_second = request_wait_ended(r.start_time, r.end_time, r.queue_ms, r.ttft_ms, r.prefill_ms)
     AND f.end_second = date_trunc('second', r.end_time) + INTERVAL 1 SECOND;

CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms,
           r.filled_cache_hit_ratio AS cache_hit_ratio, r.filled_queue_depth AS queue_depth,
           r.filled_replica_count AS replica_count, r.batch_size, r.prefill_tokens_in_batch, r.quantization,
           r.finish_reason, r.tenant_id, r.provider, r.operation, r.queue_depth_source, r.replica_count_source,
           r.cache_hit_ratio_source, r.kv_cache_usage, r.running_requests, r.preemptions, r.step_tokens,
           r.filled_engine_facts_reason AS engine_facts_reason
    FROM llm_span_requests_joined_between(t0, t1, true, true) AS r;

CREATE OR REPLACE MACRO llm_requests_fleet_between(t0, t1) AS TABLE
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms,
           r.cache_hit_ratio, r.filled_queue_depth AS queue_depth, r.filled_replica_count AS replica_count,
           r.batch_size, r.prefill_tokens_in_batch, r.quantization, r.finish_reason, r.tenant_id, r.provider,
           r.operation, r.queue_depth_source, r.replica_count_source
    FROM llm_span_requests_joined_between(t0, t1, false, true) AS r;

CREATE OR REPLACE MACRO llm_requests_replica_between(t0, t1) AS TABLE
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name,
           r.kind, r.start_time, r.end_time, r.duration_ms, r.service_name, r.replica_id,
           r.deployment, r.model, r.input_tokens, r.output_tokens, r.cached_input_tokens, r.ttft_ms,
           r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.e2e_ms,
           r.filled_cache_hit_ratio AS cache_hit_ratio, r.queue_depth, r.replica_count, r.batch_size,
           r.prefill_tokens_in_batch, r.quantization, r.finish_reason, r.tenant_id, r.provider, r.operation,
           r.cache_hit_ratio_source, r.kv_cache_usage, r.running_requests, r.preemptions, r.step_tokens,
           r.filled_engine_facts_reason AS engine_facts_reason
    FROM llm_span_requests_joined_between(t0, t1, true, false) AS r;

-- Every request of all stored time.
CREATE OR REPLACE VIEW llm_requests AS
SELECT * FROM llm_requests_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);
