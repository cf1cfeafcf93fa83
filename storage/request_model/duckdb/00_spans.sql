-- `spans`: what a span is to every reader, read from the rows the writer stores (`span_rows`).
--
-- The writer stores a span with less than it was sent (docs/ingest.md, Storage), and this view gives it all
-- back, so that analysts, the request model and the exports see the span as decoded:
-- - `attributes`: the attributes the writer kept (`attributes_rest`) with every value it left out because a
--   canonical column holds it exactly written back from that column, one bit of `attributes_moved` each
--   (model/attribute_split.py's MOVES, bit i is entry i; storage/duckdb/stored_attributes.py's rebuild_sql is
--   this expression, and tests/test_stored_attributes.py holds the two equal). Built as text, with no JSON
--   parse: the rest's closing brace gives way to the moved pairs.
-- - the derived columns (`tpot_ms`, `cache_hit_ratio`), stored NULL where normalization derived them, with a
--   bit in `columns_derived`, and read back through their rule (model/derived_columns.py's read_sql);
-- - `duration_ms`, stored NULL where end - start gives it back bit for bit, read from the times and
--   `duration_rem_ns` (model/derived_columns.py's DURATION_READ_SQL).
-- The subquery puts the derived values back first, so every expression above it (the attributes written
-- back from their columns among them) reads them derived. Its columns are all named: DuckDB writes a
-- `* REPLACE` list back in no fixed order. A view rather than a virtual column of one table: DuckDB evaluates
-- a virtual column on every INSERT to check it could be, nearly half the cost of inserting a span.
CREATE OR REPLACE VIEW spans AS
SELECT
    trace_id, span_id, parent_span_id, name, kind, start_time, end_time, duration_ms, status_code,
    status_message, service_name, tenant_id, replica_id, deployment, model, provider, operation, is_llm,
    input_tokens, output_tokens, cached_input_tokens, ttft_ms, tpot_ms, queue_ms, prefill_ms, decode_ms, e2e_ms,
    cache_hit_ratio, queue_depth, replica_count, batch_size, prefill_tokens_in_batch, quantization,
    finish_reason,
    CASE WHEN attributes_moved IS NULL OR attributes_moved = 0 THEN attributes_rest
         ELSE (
            CASE WHEN attributes_rest::VARCHAR = '{}' THEN '{' ELSE left(attributes_rest::VARCHAR, -1) || ',' END
            || concat_ws(
                ',',
                CASE WHEN attributes_moved & 1 <> 0 THEN '"gen_ai.operation.name":' || to_json(operation)::VARCHAR END,
                CASE WHEN attributes_moved & 2 <> 0 THEN '"openinference.span.kind":' || to_json(operation)::VARCHAR END,
                CASE WHEN attributes_moved & 4 <> 0 THEN '"gen_ai.span.kind":' || to_json(operation)::VARCHAR END,
                CASE WHEN attributes_moved & 8 <> 0 THEN '"fi.span.kind":' || to_json(operation)::VARCHAR END,
                CASE WHEN attributes_moved & 16 <> 0 THEN '"traceloop.span.kind":' || to_json(operation)::VARCHAR END,
                CASE WHEN attributes_moved & 32 <> 0 THEN '"llm.request.type":' || to_json(operation)::VARCHAR END,
                CASE WHEN attributes_moved & 64 <> 0 THEN '"gen_ai.provider.name":' || to_json(provider)::VARCHAR END,
                CASE WHEN attributes_moved & 128 <> 0 THEN '"gen_ai.system":' || to_json(provider)::VARCHAR END,
                CASE WHEN attributes_moved & 256 <> 0 THEN '"llm.provider":' || to_json(provider)::VARCHAR END,
                CASE WHEN attributes_moved & 512 <> 0 THEN '"llm.system":' || to_json(provider)::VARCHAR END,
                CASE WHEN attributes_moved & 1024 <> 0 THEN '"gen_ai.response.model":' || to_json(model)::VARCHAR END,
                CASE WHEN attributes_moved & 2048 <> 0 THEN '"llm.response.model_name":' || to_json(model)::VARCHAR END,
                CASE WHEN attributes_moved & 4096 <> 0 THEN '"llm.model_name":' || to_json(model)::VARCHAR END,
                CASE WHEN attributes_moved & 8192 <> 0 THEN '"langfuse.observation.model.name":' || to_json(model)::VARCHAR END,
                CASE WHEN attributes_moved & 16384 <> 0 THEN '"gen_ai.request.model":' || to_json(model)::VARCHAR END,
                CASE WHEN attributes_moved & 32768 <> 0 THEN '"llm.request.model_name":' || to_json(model)::VARCHAR END,
                CASE WHEN attributes_moved & 65536 <> 0 THEN '"gen_ai.usage.input_tokens":' || to_json(input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 131072 <> 0 THEN '"gen_ai.usage.prompt_tokens":' || to_json(input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 262144 <> 0 THEN '"llm.token_count.prompt":' || to_json(input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 524288 <> 0 THEN '"gen_ai.usage.output_tokens":' || to_json(output_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 1048576 <> 0 THEN '"gen_ai.usage.completion_tokens":' || to_json(output_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 2097152 <> 0 THEN '"llm.token_count.completion":' || to_json(output_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 4194304 <> 0 THEN '"gen_ai.usage.cache_read.input_tokens":' || to_json(cached_input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 8388608 <> 0 THEN '"llm.token_count.prompt_details.cache_read":' || to_json(cached_input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 16777216 <> 0 THEN '"gen_ai.usage.cached_tokens":' || to_json(cached_input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 33554432 <> 0 THEN '"gen_ai.usage.input_tokens.cache_read":' || to_json(cached_input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 67108864 <> 0 THEN '"gen_ai.usage.cache_read_input_tokens":' || to_json(cached_input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 134217728 <> 0 THEN '"gen_ai.usage.cache_read_tokens":' || to_json(cached_input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 268435456 <> 0 THEN '"llm.token_count.prompt_details.cache_input":' || to_json(cached_input_tokens)::VARCHAR END,
                CASE WHEN attributes_moved & 536870912 <> 0 THEN '"gen_ai.latency.time_to_first_token":' || to_json(ttft_ms / 1000)::VARCHAR END,
                CASE WHEN attributes_moved & 1073741824 <> 0 THEN '"gen_ai.response.time_to_first_chunk":' || to_json(ttft_ms / 1000)::VARCHAR END,
                CASE WHEN attributes_moved & 2147483648 <> 0 THEN '"gen_ai.server.time_to_first_token":' || to_json(ttft_ms)::VARCHAR END,
                CASE WHEN attributes_moved & 4294967296 <> 0 THEN '"gen_ai.server.time_per_output_token":' || to_json(tpot_ms)::VARCHAR END,
                CASE WHEN attributes_moved & 8589934592 <> 0 THEN '"gen_ai.latency.time_in_queue":' || to_json(queue_ms / 1000)::VARCHAR END,
                CASE WHEN attributes_moved & 17179869184 <> 0 THEN '"gen_ai.server.queue_time":' || to_json(queue_ms)::VARCHAR END,
                CASE WHEN attributes_moved & 34359738368 <> 0 THEN '"gen_ai.latency.time_in_model_prefill":' || to_json(prefill_ms / 1000)::VARCHAR END,
                CASE WHEN attributes_moved & 68719476736 <> 0 THEN '"gen_ai.latency.time_in_model_decode":' || to_json(decode_ms / 1000)::VARCHAR END,
                CASE WHEN attributes_moved & 137438953472 <> 0 THEN '"gen_ai.latency.e2e":' || to_json(e2e_ms / 1000)::VARCHAR END,
                CASE WHEN attributes_moved & 274877906944 <> 0 THEN '"llm.finish_reason":' || to_json(finish_reason)::VARCHAR END,
                CASE WHEN attributes_moved & 549755813888 <> 0 THEN '"gen_ai.response.finish_reason":' || to_json(finish_reason)::VARCHAR END,
                CASE WHEN attributes_moved & 1099511627776 <> 0 THEN '"llm.response.finish_reason":' || to_json(finish_reason)::VARCHAR END,
                CASE WHEN attributes_moved & 2199023255552 <> 0 THEN '"cluster.queue_depth":' || to_json(queue_depth)::VARCHAR END,
                CASE WHEN attributes_moved & 4398046511104 <> 0 THEN '"vllm.num_requests_waiting":' || to_json(queue_depth)::VARCHAR END,
                CASE WHEN attributes_moved & 8796093022208 <> 0 THEN '"cluster.replica_count":' || to_json(replica_count)::VARCHAR END,
                CASE WHEN attributes_moved & 17592186044416 <> 0 THEN '"llm.vllm.batch_size":' || to_json(batch_size)::VARCHAR END,
                CASE WHEN attributes_moved & 35184372088832 <> 0 THEN '"llm.vllm.prefill_in_batch":' || to_json(prefill_tokens_in_batch)::VARCHAR END,
                CASE WHEN attributes_moved & 70368744177664 <> 0 THEN '"llm.vllm.quantization":' || to_json(quantization)::VARCHAR END,
                CASE WHEN attributes_moved & 140737488355328 <> 0 THEN '"quantization":' || to_json(quantization)::VARCHAR END,
                CASE WHEN attributes_moved & 281474976710656 <> 0 THEN '"llm.vllm.cache_hit_ratio":' || to_json(cache_hit_ratio)::VARCHAR END,
                CASE WHEN attributes_moved & 562949953421312 <> 0 THEN '"tenant.id":' || to_json(tenant_id)::VARCHAR END,
                CASE WHEN attributes_moved & 1125899906842624 <> 0 THEN '"tenant_id":' || to_json(tenant_id)::VARCHAR END,
                CASE WHEN attributes_moved & 2251799813685248 <> 0 THEN '"replica_id":' || to_json(replica_id)::VARCHAR END,
                CASE WHEN attributes_moved & 4503599627370496 <> 0 THEN '"deployment":' || to_json(deployment)::VARCHAR END,
                CASE WHEN attributes_moved & 9007199254740992 <> 0 THEN '"gen_ai.latency.time_in_model_inference":' || to_json(prefill_ms / 1000 + decode_ms / 1000)::VARCHAR END
            )
            || '}'
         )::JSON
    END AS attributes,
    "resource", scope_name, events, links, ingested_at, llm_role, engine_settled, engine_queue_depth,
    engine_replica_count, engine_cache_hit_ratio, engine_kv_cache_usage, engine_running_requests,
    engine_preemptions, engine_step_tokens, engine_facts_reason, attributes_rest, attributes_moved, columns_derived, duration_rem_ns
FROM (
    SELECT
        trace_id, span_id, parent_span_id, name, kind, start_time, end_time,
        CASE WHEN duration_ms IS NULL
             THEN ((epoch_us(end_time) - epoch_us(start_time)) * 1000 + duration_rem_ns)::DOUBLE / 1e6
             ELSE duration_ms END AS duration_ms,
        status_code, status_message, service_name, tenant_id, replica_id, deployment, model, provider, operation,
        is_llm, input_tokens, output_tokens, cached_input_tokens, ttft_ms,
        CASE WHEN columns_derived & 1 <> 0
             THEN CASE WHEN output_tokens >= 2
                       THEN coalesce(decode_ms / (output_tokens::DOUBLE - 1.0),
                                     CASE WHEN e2e_ms >= ttft_ms THEN (e2e_ms - ttft_ms) / (output_tokens::DOUBLE - 1.0) END)
                  END
             ELSE tpot_ms END AS tpot_ms,
        queue_ms, prefill_ms, decode_ms, e2e_ms,
        CASE WHEN columns_derived & 2 <> 0
             THEN CASE WHEN input_tokens > 0
                       THEN least(greatest(cached_input_tokens::DOUBLE / input_tokens::DOUBLE, 0.0), 1.0) END
             ELSE cache_hit_ratio END AS cache_hit_ratio,
        queue_depth, replica_count, batch_size, prefill_tokens_in_batch, quantization, finish_reason, "resource",
        scope_name, events, links, ingested_at, llm_role, engine_settled, engine_queue_depth, engine_replica_count,
        engine_cache_hit_ratio, engine_kv_cache_usage, engine_running_requests, engine_preemptions,
        engine_step_tokens, engine_facts_reason, attributes_rest, attributes_moved, columns_derived, duration_rem_ns
    FROM span_rows
) AS span_rows;
