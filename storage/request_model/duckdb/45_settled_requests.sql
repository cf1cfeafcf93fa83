-- `llm_requests_settled_between(t0, t1)`: the request model with no live join. The columns of
-- `llm_requests_between` (40_requests.sql): a span's own value, else its settled engine fact.
--
-- A read whose requests are all settled, or which has no engine metrics in reach (a fleet that sends none),
-- needs no lookup at all; the detectors' reads use this then (storage/duckdb/window_source.py). For a request not
-- settled yet its engine columns are NULL. storage/request_model/clickhouse.py states it in ClickHouse's SQL
-- for the request summaries computed there.
CREATE OR REPLACE MACRO llm_requests_settled_between(t0, t1) AS TABLE
    SELECT r.trace_id, r.span_id, r.server_span_id, r.client_span_id, r.status_code, r.name, r.kind, r.start_time,
           r.end_time, r.duration_ms, r.service_name, r.replica_id, r.deployment, r.model, r.input_tokens,
           r.output_tokens, r.cached_input_tokens, r.ttft_ms, r.tpot_ms, r.queue_ms, r.prefill_ms, r.decode_ms,
           r.e2e_ms,
           coalesce(r.cache_hit_ratio, r.engine_cache_hit_ratio) AS cache_hit_ratio,
           coalesce(r.queue_depth, r.engine_queue_depth) AS queue_depth,
           coalesce(r.replica_count, r.engine_replica_count) AS replica_count,
           r.batch_size, r.prefill_tokens_in_batch, r.quantization, r.finish_reason, r.tenant_id, r.provider,
           r.operation,
           CASE WHEN r.queue_depth IS NOT NULL THEN 'span' WHEN r.engine_queue_depth IS NOT NULL THEN 'engine' END
               AS queue_depth_source,
           CASE WHEN r.replica_count IS NOT NULL THEN 'span' WHEN r.engine_replica_count IS NOT NULL THEN 'engine' END
               AS replica_count_source,
           CASE WHEN r.cache_hit_ratio IS NOT NULL THEN 'span' WHEN r.engine_cache_hit_ratio IS NOT NULL THEN 'engine' END
               AS cache_hit_ratio_source,
           -- Only the engines report these: the settled fact is all there is.
           r.engine_kv_cache_usage AS kv_cache_usage,
           r.engine_running_requests AS running_requests,
           r.engine_preemptions AS preemptions,
           r.engine_step_tokens AS step_tokens,
           r.engine_facts_reason AS engine_facts_reason
    FROM llm_span_requests_between(t0, t1) AS r;
