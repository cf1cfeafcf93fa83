"""vLLM's inference time is stored as the sum it is: `spans.attributes` writes it back from prefill + decode.

vLLM sends `gen_ai.latency.time_in_model_inference` as last token − scheduled, and its prefill (first
token − scheduled) and decode (last − first) beside it, all from one monotonic clock, so the sum of the
two is the inference time bit for bit. No canonical column holds it, so it was the one latency left in
`attributes_rest`: ~12 bytes a span of full-precision digits under ZSTD, a tenth of a stored span. The
decoder now leaves it out where `prefill_ms / 1000 + decode_ms / 1000` gives it back exactly, with its
bit in `attributes_moved` (bit 53, model/attribute_split.py), and the `spans` view writes it back
(storage/request_model/duckdb/00_spans.sql, which this revision once edited).

No table changes on the way up. The way down writes the value back into each row's rest.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-25
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_BIT = 1 << 53
_PAIR = "'\"gen_ai.latency.time_in_model_inference\":' || to_json(prefill_ms / 1000 + decode_ms / 1000)::VARCHAR"


def upgrade() -> None:
    pass


def downgrade() -> None:
    rest = "attributes_rest::VARCHAR"
    back = f"CASE WHEN {rest} = '{{}}' THEN '{{' ELSE left({rest}, -1) || ',' END || {_PAIR} || '}}'"
    op.get_bind().exec_driver_sql(
        f"UPDATE span_rows SET attributes_rest = ({back})::JSON, "
        f"attributes_moved = attributes_moved & ~{_BIT}::UBIGINT WHERE attributes_moved & {_BIT} <> 0"
    )
