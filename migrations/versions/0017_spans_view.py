"""`spans` becomes a view over the stored rows, `span_rows`, and `attributes` an expression of the view.

As a virtual column of the table, `attributes` was evaluated by DuckDB on every INSERT to check it could
be, even though it is never stored: measured, that check was nearly half the cost of inserting a span
(13 µs a span against 7 without it, docs/benchmarks.md). A view computes it only when a query reads it.
Analysts see the same `spans`, columns in the same order; the writer, retention and the engine-fact
settling write `span_rows`.

The view, which this revision once defined, is the request model's (storage/request_model/duckdb/
00_spans.sql), applied over the newest tables. Here the table loses its virtual column and its name.

No row is copied on the way up. The way down rebuilds the table with 0016's virtual `attributes` (free
space for a second copy).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-24
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_GENERATED = "attributes JSON GENERATED ALWAYS AS"
_ANCHOR = '"resource" JSON'  # the column after `attributes`, as DuckDB writes the table back

# Migration 0016's MOVES, restated (a revision never imports another): the attribute, the column that holds
# its value, and what the column multiplied it by. Bit i is line i.
_MOVES = [
    (key, column, int(per[0]) if per else 1)
    for key, column, *per in (
        line.split()
        for line in """
gen_ai.operation.name operation
openinference.span.kind operation
gen_ai.span.kind operation
fi.span.kind operation
traceloop.span.kind operation
llm.request.type operation
gen_ai.provider.name provider
gen_ai.system provider
llm.provider provider
llm.system provider
gen_ai.response.model model
llm.response.model_name model
llm.model_name model
langfuse.observation.model.name model
gen_ai.request.model model
llm.request.model_name model
gen_ai.usage.input_tokens input_tokens
gen_ai.usage.prompt_tokens input_tokens
llm.token_count.prompt input_tokens
gen_ai.usage.output_tokens output_tokens
gen_ai.usage.completion_tokens output_tokens
llm.token_count.completion output_tokens
gen_ai.usage.cache_read.input_tokens cached_input_tokens
llm.token_count.prompt_details.cache_read cached_input_tokens
gen_ai.usage.cached_tokens cached_input_tokens
gen_ai.usage.input_tokens.cache_read cached_input_tokens
gen_ai.usage.cache_read_input_tokens cached_input_tokens
gen_ai.usage.cache_read_tokens cached_input_tokens
llm.token_count.prompt_details.cache_input cached_input_tokens
gen_ai.latency.time_to_first_token ttft_ms 1000
gen_ai.response.time_to_first_chunk ttft_ms 1000
gen_ai.server.time_to_first_token ttft_ms
gen_ai.server.time_per_output_token tpot_ms
gen_ai.latency.time_in_queue queue_ms 1000
gen_ai.server.queue_time queue_ms
gen_ai.latency.time_in_model_prefill prefill_ms 1000
gen_ai.latency.time_in_model_decode decode_ms 1000
gen_ai.latency.e2e e2e_ms 1000
llm.finish_reason finish_reason
gen_ai.response.finish_reason finish_reason
llm.response.finish_reason finish_reason
cluster.queue_depth queue_depth
vllm.num_requests_waiting queue_depth
cluster.replica_count replica_count
llm.vllm.batch_size batch_size
llm.vllm.prefill_in_batch prefill_tokens_in_batch
llm.vllm.quantization quantization
quantization quantization
llm.vllm.cache_hit_ratio cache_hit_ratio
tenant.id tenant_id
tenant_id tenant_id
replica_id replica_id
deployment deployment
""".strip().splitlines()
    )
]


def _value(column: str, per: int) -> str:
    return f"{column} / {per}" if per != 1 else column


def _rebuild() -> str:
    """`spans.attributes` as 0016 defined it, the virtual column the way down gives back."""
    pairs = ", ".join(
        f"CASE WHEN attributes_moved & {1 << i} <> 0 THEN '\"{k}\":' || to_json({_value(c, per)})::VARCHAR END"
        for i, (k, c, per) in enumerate(_MOVES)
    )
    rest = "attributes_rest::VARCHAR"
    opening = f"CASE WHEN {rest} = '{{}}' THEN '{{' ELSE left({rest}, -1) || ',' END"
    return (
        "CASE WHEN attributes_moved IS NULL OR attributes_moved = 0 THEN attributes_rest "
        f"ELSE ({opening} || concat_ws(',', {pairs}) || '}}')::JSON END"
    )


def _one(sql: str) -> str:
    rows = op.get_bind().exec_driver_sql(sql).fetchall()
    if len(rows) != 1:
        raise RuntimeError(f"expected one row from {sql!r}, got {len(rows)}")
    return str(rows[0][0])


def _columns(table: str) -> list[str]:
    rows = op.get_bind().exec_driver_sql(
        f"SELECT column_name FROM duckdb_columns() WHERE table_name = '{table}' ORDER BY column_index"
    )
    return [name for (name,) in rows.fetchall()]


def _quoted(column: str) -> str:
    return f'"{column}"'


def upgrade() -> None:
    op.execute("ALTER TABLE spans DROP COLUMN attributes")
    op.execute("ALTER TABLE spans RENAME TO span_rows")


def downgrade() -> None:
    stored = _columns("span_rows")
    table = _one("SELECT sql FROM duckdb_tables() WHERE table_name = 'span_rows'")
    rebuilt = table.replace("CREATE TABLE span_rows(", "CREATE TABLE spans(", 1)
    if _ANCHOR not in rebuilt:
        raise RuntimeError(f"span_rows is not defined as expected: {_ANCHOR!r} not found")
    rebuilt = rebuilt.replace(_ANCHOR, f"{_GENERATED} ({_rebuild()}) VIRTUAL, {_ANCHOR}", 1)
    names = ", ".join(_quoted(c) for c in stored)
    # Straight to DuckDB: SQLAlchemy would read the JSON text's `":` as the start of a bind parameter.
    op.get_bind().exec_driver_sql(rebuilt)
    op.execute(f"INSERT INTO spans ({names}) SELECT {names} FROM span_rows")
    op.execute("DROP TABLE span_rows")
