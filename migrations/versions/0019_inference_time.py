"""vLLM's inference time is stored as the sum it is: `spans.attributes` writes it back from prefill + decode.

vLLM sends `gen_ai.latency.time_in_model_inference` as last token − scheduled, and its prefill (first
token − scheduled) and decode (last − first) beside it, all from one monotonic clock, so the sum of the
two is the inference time bit for bit. No canonical column holds it, so it was the one latency left in
`attributes_rest`: ~12 bytes a span of full-precision digits under ZSTD, a tenth of a stored span. The
decoder now leaves it out where `prefill_ms / 1000 + decode_ms / 1000` gives it back exactly, with its
bit in `attributes_moved` (bit 53, model/attribute_split.py), and the view writes it back.

No row is copied on the way up. The way down writes the value back into each row's rest first.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-25
"""

from alembic import op

from migrations.spans_view import definition, redefine

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_BIT = 1 << 53
_PAIR = "'\"gen_ai.latency.time_in_model_inference\":' || to_json(prefill_ms / 1000 + decode_ms / 1000)::VARCHAR"
_ADDED = f", CASE WHEN attributes_moved & {_BIT} <> 0 THEN {_PAIR} END"
# The last pair of the view's `attributes` as DuckDB writes the view back (migration 0016's last move).
_LAST = "(('\"deployment\":' || CAST(to_json(deployment) AS VARCHAR))) ELSE NULL END"


def upgrade() -> None:
    view = definition()
    if view.count(_LAST) != 1:
        raise RuntimeError(f"spans is not defined as expected: {_LAST!r} is not in it once")
    redefine(view.replace(_LAST, _LAST + _ADDED, 1))


def downgrade() -> None:
    rest = "attributes_rest::VARCHAR"
    back = f"CASE WHEN {rest} = '{{}}' THEN '{{' ELSE left({rest}, -1) || ',' END || {_PAIR} || '}}'"
    op.get_bind().exec_driver_sql(
        f"UPDATE span_rows SET attributes_rest = ({back})::JSON, "
        f"attributes_moved = attributes_moved & ~{_BIT}::UBIGINT WHERE attributes_moved & {_BIT} <> 0"
    )
    view = definition()
    at = view.find(_LAST)
    end = view.find(" ELSE NULL END", at + len(_LAST))
    if at < 0 or "time_in_model_inference" not in view[at:end]:
        raise RuntimeError("spans is not defined as expected: it does not write the inference time back")
    redefine(view[: at + len(_LAST)] + view[end + len(" ELSE NULL END") :])
