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

import importlib

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


def _requests_sql() -> str:
    spans_cols = ", ".join(("trace_id", "span_id", "llm_role", "status_code", *_SERVER_FIRST, *_CLIENT_FIRST))
    client_cols = ", ".join(f"c.{col} AS c_{col}" for col in ("status_code", *_SERVER_FIRST, *_CLIENT_FIRST))
    # Only the request itself (the latest attempt) falls back to the client's figures.
    merged = [f"coalesce(x.{col}, CASE WHEN p.attempt = 1 THEN p.c_{col} END) AS {col}" for col in _SERVER_FIRST]
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


def downgrade() -> None:
    before = importlib.import_module("migrations.versions.0003_detectors")
    op.execute(
        "CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE "
        + before._requests_sql("t0::TIMESTAMP", "t1::TIMESTAMP")
    )
