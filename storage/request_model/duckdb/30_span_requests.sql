-- `llm_span_requests_between(t0, t1)`: the requests that ended in [t0, t1), from the spans alone (the engines'
-- figures are joined on top of it in 40_requests.sql). One row per request attempt.
--
-- Pairing: a server span (what the engine measured) inside a client span (a gateway's or an SDK's, who asked)
-- of the same trace is one request; the innermost client wins, with 1 s of clock-skew tolerance either side.
-- Every other LLM span is a request alone.
--
-- Attempts: a client request retried inside one client span gives one row per attempt, never two rows with
-- the same id (which counted the client's scores twice). The latest attempt is the request: the client's id,
-- its status merged with the server's, and, where the server span has no value, the client's figures. An
-- earlier attempt is a row of its own under its server span's id, with the client's tenant, provider and
-- operation but neither the client's id nor its figures nor its status.
--
-- Columns: tenant, provider and operation come from the client first (it knows who asked); every other
-- column from the server span first, the engine facts settled on it (`engine_*`, `engine_settled`) among
-- them. storage/request_model/clickhouse.py states the same rules in ClickHouse's SQL.
--
-- Bounds: `t0` and `t1` are cast, so an analyst may write strings (llm_span_requests_between('2026-11-20',
-- '2026-11-21')); every macro built on this one takes strings with it. They reach inside the pairing join, so
-- a 5-minute window never pairs a whole table.
CREATE OR REPLACE MACRO llm_span_requests_between(t0, t1) AS TABLE
    -- NOT MATERIALIZED lets every reference read only the columns it uses; a materialized copy of a
    -- day of requests was most of the cost.
    WITH llm AS NOT MATERIALIZED (
        -- An hour of margin: a client span can end well after the server span it contains.
        SELECT
            trace_id, span_id, llm_role, status_code, name, kind, start_time, end_time, duration_ms, service_name,
            replica_id, deployment, model, input_tokens, output_tokens, cached_input_tokens, ttft_ms, tpot_ms,
            queue_ms, prefill_ms, decode_ms, e2e_ms, cache_hit_ratio, queue_depth, replica_count, batch_size,
            prefill_tokens_in_batch, quantization, finish_reason, engine_queue_depth, engine_replica_count,
            engine_cache_hit_ratio, engine_kv_cache_usage, engine_running_requests, engine_preemptions,
            engine_step_tokens, engine_facts_reason, engine_settled, tenant_id, provider, operation
        FROM spans
        WHERE is_llm AND end_time >= t0::TIMESTAMP - INTERVAL 1 HOUR AND end_time < t1::TIMESTAMP + INTERVAL 1 HOUR
    ),
    -- The pairs carry their client's figures, so the final join is against the (usually small) set of
    -- pairs, never against every LLM span again.
    pairs AS (
        SELECT s.trace_id, s.span_id AS server_span_id, s.start_time AS server_start,
               c.span_id AS client_span_id,
               c.status_code AS c_status_code,
               c.name AS c_name,
               c.kind AS c_kind,
               c.start_time AS c_start_time,
               c.end_time AS c_end_time,
               c.duration_ms AS c_duration_ms,
               c.service_name AS c_service_name,
               c.replica_id AS c_replica_id,
               c.deployment AS c_deployment,
               c.model AS c_model,
               c.input_tokens AS c_input_tokens,
               c.output_tokens AS c_output_tokens,
               c.cached_input_tokens AS c_cached_input_tokens,
               c.ttft_ms AS c_ttft_ms,
               c.tpot_ms AS c_tpot_ms,
               c.queue_ms AS c_queue_ms,
               c.prefill_ms AS c_prefill_ms,
               c.decode_ms AS c_decode_ms,
               c.e2e_ms AS c_e2e_ms,
               c.cache_hit_ratio AS c_cache_hit_ratio,
               c.queue_depth AS c_queue_depth,
               c.replica_count AS c_replica_count,
               c.batch_size AS c_batch_size,
               c.prefill_tokens_in_batch AS c_prefill_tokens_in_batch,
               c.quantization AS c_quantization,
               c.finish_reason AS c_finish_reason,
               c.engine_queue_depth AS c_engine_queue_depth,
               c.engine_replica_count AS c_engine_replica_count,
               c.engine_cache_hit_ratio AS c_engine_cache_hit_ratio,
               c.engine_kv_cache_usage AS c_engine_kv_cache_usage,
               c.engine_running_requests AS c_engine_running_requests,
               c.engine_preemptions AS c_engine_preemptions,
               c.engine_step_tokens AS c_engine_step_tokens,
               c.engine_facts_reason AS c_engine_facts_reason,
               c.engine_settled AS c_engine_settled,
               c.tenant_id AS c_tenant_id,
               c.provider AS c_provider,
               c.operation AS c_operation
        FROM llm AS s
        JOIN llm AS c
          ON c.trace_id = s.trace_id
         AND s.llm_role = 'server' AND c.llm_role = 'client'
         AND s.start_time >= c.start_time - INTERVAL 1 SECOND
         AND s.end_time <= c.end_time + INTERVAL 1 SECOND
        QUALIFY row_number() OVER (
            PARTITION BY s.trace_id, s.span_id ORDER BY c.start_time DESC, c.span_id
        ) = 1
    ),
    -- Attempt 1 is the latest server span of a client span: the one whose answer the client got.
    attempts AS (
        SELECT *, row_number() OVER (
            PARTITION BY trace_id, client_span_id ORDER BY server_start DESC, server_span_id DESC
        ) AS attempt
        FROM pairs
    ),
    claimed AS (SELECT DISTINCT trace_id, client_span_id FROM pairs)
    -- A paired server row carries its client's figures; a paired client row is dropped.
    SELECT
        x.trace_id,
        CASE WHEN p.attempt = 1 THEN p.client_span_id ELSE x.span_id END AS span_id,
        CASE WHEN x.llm_role = 'server' THEN x.span_id END AS server_span_id,
        CASE WHEN p.attempt = 1 THEN p.client_span_id WHEN x.llm_role = 'client' THEN x.span_id END
            AS client_span_id,
        CASE WHEN p.attempt > 1 THEN x.status_code
             WHEN 'ERROR' IN (x.status_code, p.c_status_code) THEN 'ERROR'
             WHEN 'OK' IN (x.status_code, p.c_status_code) THEN 'OK' ELSE 'UNSET' END AS status_code,
        -- Only the request itself (the latest attempt) falls back to the client's figures.
        coalesce(x.name, CASE WHEN p.attempt = 1 THEN p.c_name END) AS name,
        coalesce(x.kind, CASE WHEN p.attempt = 1 THEN p.c_kind END) AS kind,
        coalesce(x.start_time, CASE WHEN p.attempt = 1 THEN p.c_start_time END) AS start_time,
        coalesce(x.end_time, CASE WHEN p.attempt = 1 THEN p.c_end_time END) AS end_time,
        coalesce(x.duration_ms, CASE WHEN p.attempt = 1 THEN p.c_duration_ms END) AS duration_ms,
        coalesce(x.service_name, CASE WHEN p.attempt = 1 THEN p.c_service_name END) AS service_name,
        coalesce(x.replica_id, CASE WHEN p.attempt = 1 THEN p.c_replica_id END) AS replica_id,
        coalesce(x.deployment, CASE WHEN p.attempt = 1 THEN p.c_deployment END) AS deployment,
        coalesce(x.model, CASE WHEN p.attempt = 1 THEN p.c_model END) AS model,
        coalesce(x.input_tokens, CASE WHEN p.attempt = 1 THEN p.c_input_tokens END) AS input_tokens,
        coalesce(x.output_tokens, CASE WHEN p.attempt = 1 THEN p.c_output_tokens END) AS output_tokens,
        coalesce(x.cached_input_tokens, CASE WHEN p.attempt = 1 THEN p.c_cached_input_tokens END) AS cached_input_tokens,
        coalesce(x.ttft_ms, CASE WHEN p.attempt = 1 THEN p.c_ttft_ms END) AS ttft_ms,
        coalesce(x.tpot_ms, CASE WHEN p.attempt = 1 THEN p.c_tpot_ms END) AS tpot_ms,
        coalesce(x.queue_ms, CASE WHEN p.attempt = 1 THEN p.c_queue_ms END) AS queue_ms,
        coalesce(x.prefill_ms, CASE WHEN p.attempt = 1 THEN p.c_prefill_ms END) AS prefill_ms,
        coalesce(x.decode_ms, CASE WHEN p.attempt = 1 THEN p.c_decode_ms END) AS decode_ms,
        coalesce(x.e2e_ms, CASE WHEN p.attempt = 1 THEN p.c_e2e_ms END) AS e2e_ms,
        coalesce(x.cache_hit_ratio, CASE WHEN p.attempt = 1 THEN p.c_cache_hit_ratio END) AS cache_hit_ratio,
        coalesce(x.queue_depth, CASE WHEN p.attempt = 1 THEN p.c_queue_depth END) AS queue_depth,
        coalesce(x.replica_count, CASE WHEN p.attempt = 1 THEN p.c_replica_count END) AS replica_count,
        coalesce(x.batch_size, CASE WHEN p.attempt = 1 THEN p.c_batch_size END) AS batch_size,
        coalesce(x.prefill_tokens_in_batch, CASE WHEN p.attempt = 1 THEN p.c_prefill_tokens_in_batch END) AS prefill_tokens_in_batch,
        coalesce(x.quantization, CASE WHEN p.attempt = 1 THEN p.c_quantization END) AS quantization,
        coalesce(x.finish_reason, CASE WHEN p.attempt = 1 THEN p.c_finish_reason END) AS finish_reason,
        coalesce(x.engine_queue_depth, CASE WHEN p.attempt = 1 THEN p.c_engine_queue_depth END) AS engine_queue_depth,
        coalesce(x.engine_replica_count, CASE WHEN p.attempt = 1 THEN p.c_engine_replica_count END) AS engine_replica_count,
        coalesce(x.engine_cache_hit_ratio, CASE WHEN p.attempt = 1 THEN p.c_engine_cache_hit_ratio END) AS engine_cache_hit_ratio,
        coalesce(x.engine_kv_cache_usage, CASE WHEN p.attempt = 1 THEN p.c_engine_kv_cache_usage END) AS engine_kv_cache_usage,
        coalesce(x.engine_running_requests, CASE WHEN p.attempt = 1 THEN p.c_engine_running_requests END) AS engine_running_requests,
        coalesce(x.engine_preemptions, CASE WHEN p.attempt = 1 THEN p.c_engine_preemptions END) AS engine_preemptions,
        coalesce(x.engine_step_tokens, CASE WHEN p.attempt = 1 THEN p.c_engine_step_tokens END) AS engine_step_tokens,
        -- The reason is the settled span's, with the facts it explains: never a client's beside a server's facts.
        CASE WHEN x.engine_settled IS NOT NULL THEN x.engine_facts_reason
             WHEN p.attempt = 1 THEN p.c_engine_facts_reason END AS engine_facts_reason,
        coalesce(x.engine_settled, CASE WHEN p.attempt = 1 THEN p.c_engine_settled END) AS engine_settled,
        coalesce(p.c_tenant_id, x.tenant_id) AS tenant_id,
        coalesce(p.c_provider, x.provider) AS provider,
        coalesce(p.c_operation, x.operation) AS operation
    FROM llm AS x
    LEFT JOIN attempts AS p ON p.trace_id = x.trace_id AND p.server_span_id = x.span_id
    -- An anti-join written as a join against the small set of claimed clients: NOT EXISTS made
    -- DuckDB deduplicate every (trace_id, span_id) of the window first.
    LEFT JOIN claimed AS k ON k.trace_id = x.trace_id AND k.client_span_id = x.span_id
    WHERE x.end_time >= t0::TIMESTAMP AND x.end_time < t1::TIMESTAMP AND k.client_span_id IS NULL;
