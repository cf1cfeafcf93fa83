"""llm_requests: a client request retried inside one client span gives one row per attempt, never two rows
with the same id.

Before, every server span inside a client span took the client's span_id, so a gateway retry (two
server spans under one client span) gave two rows with one (trace_id, span_id), and the client's
scores counted twice. Now the latest attempt is the request, with the client's id, figures and
scores; an earlier attempt is a row of its own under its server span's id, with the client's
tenant, provider and operation but neither the client's id nor its scores nor its status.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-21
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Revisions are snapshots: the pairing of 0003 (bounds cast as in 0006) restated with attempts.
_CLIENT_FIRST = ("tenant_id", "provider", "operation")
_SERVER_FIRST = (
    "name", "kind", "start_time", "end_time", "duration_ms", "service_name", "replica_id", "deployment", "model",
    "input_tokens", "output_tokens", "cached_input_tokens", "ttft_ms", "tpot_ms", "queue_ms", "prefill_ms",
    "decode_ms", "e2e_ms", "cache_hit_ratio", "queue_depth", "replica_count", "batch_size",
    "prefill_tokens_in_batch", "quantization", "finish_reason",
)  # fmt: skip
_LOW, _HIGH = "t0::TIMESTAMP", "t1::TIMESTAMP"


def _requests_sql(server_first: tuple[str, ...] = _SERVER_FIRST) -> str:
    """The pairing; a later revision that adds span columns passes them as `server_first`."""
    spans_cols = ", ".join(("trace_id", "span_id", "llm_role", "status_code", *server_first, *_CLIENT_FIRST))
    client_cols = ", ".join(f"c.{col} AS c_{col}" for col in ("status_code", *server_first, *_CLIENT_FIRST))
    # Only the request itself (the latest attempt) falls back to the client's figures.
    merged = [f"coalesce(x.{col}, CASE WHEN p.attempt = 1 THEN p.c_{col} END) AS {col}" for col in server_first]
    merged += [f"coalesce(p.c_{col}, x.{col}) AS {col}" for col in _CLIENT_FIRST]
    merged_cols = ",\n            ".join(merged)
    return f"""
        WITH llm AS NOT MATERIALIZED (
            -- An hour of margin: a client span can end well after the server span it contains.
            SELECT {spans_cols} FROM spans
            WHERE is_llm AND end_time >= {_LOW} - INTERVAL 1 HOUR AND end_time < {_HIGH} + INTERVAL 1 HOUR
        ),
        pairs AS (
            SELECT s.trace_id, s.span_id AS server_span_id, s.start_time AS server_start,
                   c.span_id AS client_span_id, {client_cols}
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
            {merged_cols}
        FROM llm AS x
        LEFT JOIN attempts AS p ON p.trace_id = x.trace_id AND p.server_span_id = x.span_id
        -- An anti-join written as a join against the small set of claimed clients: NOT EXISTS made
        -- DuckDB deduplicate every (trace_id, span_id) of the window first.
        LEFT JOIN claimed AS k ON k.trace_id = x.trace_id AND k.client_span_id = x.span_id
        WHERE x.end_time >= {_LOW} AND x.end_time < {_HIGH} AND k.client_span_id IS NULL
    """


def upgrade() -> None:
    op.execute(f"CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE {_requests_sql()}")


# What this revision replaces: 0006's macro body, 0003's pairing with the bounds cast, frozen as text.
_PAIRING_0006 = """
        WITH llm AS NOT MATERIALIZED (
            -- An hour of margin: a client span can end well after the server span it contains.
            SELECT trace_id, span_id, llm_role, status_code, name, kind, start_time, end_time, duration_ms,
                service_name, replica_id, deployment, model, input_tokens, output_tokens, cached_input_tokens,
                ttft_ms, tpot_ms, queue_ms, prefill_ms, decode_ms, e2e_ms, cache_hit_ratio, queue_depth,
                replica_count, batch_size, prefill_tokens_in_batch, quantization, finish_reason, tenant_id,
                provider, operation FROM spans
            WHERE is_llm AND end_time >= t0::TIMESTAMP - INTERVAL 1 HOUR
                AND end_time < t1::TIMESTAMP + INTERVAL 1 HOUR
        ),
        pairs AS (
            SELECT s.trace_id, s.span_id AS server_span_id, c.span_id AS client_span_id,
                c.status_code AS c_status_code, c.name AS c_name, c.kind AS c_kind, c.start_time AS c_start_time,
                c.end_time AS c_end_time, c.duration_ms AS c_duration_ms, c.service_name AS c_service_name,
                c.replica_id AS c_replica_id, c.deployment AS c_deployment, c.model AS c_model,
                c.input_tokens AS c_input_tokens, c.output_tokens AS c_output_tokens,
                c.cached_input_tokens AS c_cached_input_tokens, c.ttft_ms AS c_ttft_ms, c.tpot_ms AS c_tpot_ms,
                c.queue_ms AS c_queue_ms, c.prefill_ms AS c_prefill_ms, c.decode_ms AS c_decode_ms,
                c.e2e_ms AS c_e2e_ms, c.cache_hit_ratio AS c_cache_hit_ratio, c.queue_depth AS c_queue_depth,
                c.replica_count AS c_replica_count, c.batch_size AS c_batch_size,
                c.prefill_tokens_in_batch AS c_prefill_tokens_in_batch, c.quantization AS c_quantization,
                c.finish_reason AS c_finish_reason, c.tenant_id AS c_tenant_id, c.provider AS c_provider,
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
        claimed AS (SELECT DISTINCT trace_id, client_span_id FROM pairs)
        -- A paired server row carries its client's figures; a paired client row is dropped.
        SELECT
            x.trace_id,
            coalesce(p.client_span_id, x.span_id) AS span_id,
            CASE WHEN x.llm_role = 'server' THEN x.span_id END AS server_span_id,
            coalesce(p.client_span_id, CASE WHEN x.llm_role = 'client' THEN x.span_id END) AS client_span_id,
            CASE WHEN 'ERROR' IN (x.status_code, p.c_status_code) THEN 'ERROR'
                 WHEN 'OK' IN (x.status_code, p.c_status_code) THEN 'OK' ELSE 'UNSET' END AS status_code,
            coalesce(x.name, p.c_name) AS name,
            coalesce(x.kind, p.c_kind) AS kind,
            coalesce(x.start_time, p.c_start_time) AS start_time,
            coalesce(x.end_time, p.c_end_time) AS end_time,
            coalesce(x.duration_ms, p.c_duration_ms) AS duration_ms,
            coalesce(x.service_name, p.c_service_name) AS service_name,
            coalesce(x.replica_id, p.c_replica_id) AS replica_id,
            coalesce(x.deployment, p.c_deployment) AS deployment,
            coalesce(x.model, p.c_model) AS model,
            coalesce(x.input_tokens, p.c_input_tokens) AS input_tokens,
            coalesce(x.output_tokens, p.c_output_tokens) AS output_tokens,
            coalesce(x.cached_input_tokens, p.c_cached_input_tokens) AS cached_input_tokens,
            coalesce(x.ttft_ms, p.c_ttft_ms) AS ttft_ms,
            coalesce(x.tpot_ms, p.c_tpot_ms) AS tpot_ms,
            coalesce(x.queue_ms, p.c_queue_ms) AS queue_ms,
            coalesce(x.prefill_ms, p.c_prefill_ms) AS prefill_ms,
            coalesce(x.decode_ms, p.c_decode_ms) AS decode_ms,
            coalesce(x.e2e_ms, p.c_e2e_ms) AS e2e_ms,
            coalesce(x.cache_hit_ratio, p.c_cache_hit_ratio) AS cache_hit_ratio,
            coalesce(x.queue_depth, p.c_queue_depth) AS queue_depth,
            coalesce(x.replica_count, p.c_replica_count) AS replica_count,
            coalesce(x.batch_size, p.c_batch_size) AS batch_size,
            coalesce(x.prefill_tokens_in_batch, p.c_prefill_tokens_in_batch) AS prefill_tokens_in_batch,
            coalesce(x.quantization, p.c_quantization) AS quantization,
            coalesce(x.finish_reason, p.c_finish_reason) AS finish_reason,
            coalesce(p.c_tenant_id, x.tenant_id) AS tenant_id,
            coalesce(p.c_provider, x.provider) AS provider,
            coalesce(p.c_operation, x.operation) AS operation
        FROM llm AS x
        LEFT JOIN pairs AS p ON p.trace_id = x.trace_id AND p.server_span_id = x.span_id
        -- An anti-join written as a join against the small set of claimed clients: NOT EXISTS made
        -- DuckDB deduplicate every (trace_id, span_id) of the window first.
        LEFT JOIN claimed AS k ON k.trace_id = x.trace_id AND k.client_span_id = x.span_id
        WHERE x.end_time >= t0::TIMESTAMP AND x.end_time < t1::TIMESTAMP AND k.client_span_id IS NULL
    """


def downgrade() -> None:
    op.execute(f"CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE {_PAIRING_0006}")
