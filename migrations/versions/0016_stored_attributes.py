"""`spans.attributes` may be stored without the values canonical columns hold (`storage.attributes: split`).

Token counts, latencies, the model and the engine figures are stored twice, once in their columns and
once in the attributes JSON. `attributes_rest` holds what the writer stores of the attributes,
`attributes_moved` a bit for each attribute it left out because a column holds it exactly, and
`attributes` is a virtual column that writes them back (storage/duckdb/stored_attributes.py: the rule,
and what an analyst sees change). Stored spans keep their attributes whole (nothing moved).

The table is rebuilt once: the upgrade needs free space for a second copy of the spans while it runs.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# storage/duckdb/stored_attributes.py's MOVES as of this revision, frozen: the attribute, the column that
# holds its value, and what the column multiplied it by. Bit i is line i.
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
    """`spans.attributes` at this revision (stored_attributes.rebuild_sql)."""
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


_STORED = "attributes JSON USING COMPRESSION ZSTD, "
_PHYSICAL = ", attributes_rest JSON USING COMPRESSION ZSTD, attributes_moved UBIGINT"
_NEXT = '"resource" JSON'  # the column after `attributes`, as DuckDB writes it back


def _definition() -> str:
    rows = op.get_bind().exec_driver_sql("SELECT sql FROM duckdb_tables() WHERE table_name = 'spans'").fetchall()
    return str(rows[0][0]).replace("CREATE TABLE spans(", "CREATE TABLE spans_rebuilt(", 1)


def _columns(*, skip: tuple[str, ...]) -> str:
    rows = op.get_bind().exec_driver_sql(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'spans' ORDER BY column_index"
    )
    return ", ".join(name for (name,) in rows.fetchall() if name not in skip)


def _replace(definition: str, before: str, after: str) -> str:
    if before not in definition:
        raise RuntimeError(f"spans is not defined as expected: {before!r} not found in {definition!r}")
    return definition.replace(before, after, 1)


def _swap(rebuilt: str, select: str) -> None:
    # Straight to DuckDB: SQLAlchemy would read the JSON text's `:null` as a bind parameter.
    op.get_bind().exec_driver_sql(rebuilt)
    op.get_bind().exec_driver_sql(select)
    op.execute("DROP TABLE spans")
    op.execute("ALTER TABLE spans_rebuilt RENAME TO spans")


def upgrade() -> None:
    generated = f"attributes JSON GENERATED ALWAYS AS ({_rebuild()}) VIRTUAL, "
    rebuilt = _replace(_definition(), _STORED, generated)
    rebuilt = rebuilt.rstrip()
    if not rebuilt.endswith(");"):
        raise RuntimeError(f"spans is not defined as expected: {rebuilt!r} does not end its column list")
    rebuilt = f"{rebuilt[:-2]}{_PHYSICAL});"
    columns = _columns(skip=("attributes",))
    # Stored spans keep their attributes whole (nothing moved); storage.attributes: split applies to new ones.
    _swap(
        rebuilt,
        f"INSERT INTO spans_rebuilt ({columns}, attributes_rest, attributes_moved) "
        f"SELECT {columns}, attributes, 0 FROM spans",
    )


def downgrade() -> None:
    definition = _definition()
    start, end = definition.index("attributes JSON GENERATED"), definition.index(_NEXT)
    rebuilt = _replace(definition[:start] + _STORED + definition[end:], _PHYSICAL, "")
    columns = _columns(skip=("attributes_rest", "attributes_moved"))
    _swap(rebuilt, f"INSERT INTO spans_rebuilt ({columns}) SELECT {columns} FROM spans")
