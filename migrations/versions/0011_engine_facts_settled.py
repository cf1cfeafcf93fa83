"""Engine facts settled on the spans: each LLM span's engine facts are computed once, after the engine
metrics around it have arrived, and stored beside it, so reads of settled windows join nothing.

The join of 0009 gave the right answers but cost every read two or three hash joins of the window's
requests (a detection pass over a day of ten million requests took 1.6 times as long as one whose
spans carried the facts). `spans` gains `engine_settled` (NULL until settled) and one `engine_<fact>`
column per fact the join computes, holding what the engines said (NULL when they said nothing), never the
span's own value. No row is settled here: the writer settles spans as their engine metrics arrive
(storage/duckdb/engine_facts.py).

What reads the columns (the settling macro `span_engine_facts_between`, and the request model taking a
span's own value, else the settled engine value, else the live join), which this revision once defined,
is the request model's (storage/request_model/duckdb/20_span_engine_facts.sql and 40_requests.sql).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_FACTS = (
    ("queue_depth", "BIGINT"),
    ("replica_count", "BIGINT"),
    ("cache_hit_ratio", "DOUBLE"),
    ("kv_cache_usage", "DOUBLE"),
    ("running_requests", "BIGINT"),
    ("preemptions", "BIGINT"),
    ("step_tokens", "DOUBLE"),
)


def upgrade() -> None:
    op.execute("ALTER TABLE spans ADD COLUMN engine_settled BOOLEAN")
    for fact, sql_type in _FACTS:
        op.execute(f"ALTER TABLE spans ADD COLUMN engine_{fact} {sql_type}")


def downgrade() -> None:
    for fact, _ in reversed(_FACTS):
        op.execute(f"ALTER TABLE spans DROP COLUMN engine_{fact}")
    op.execute("ALTER TABLE spans DROP COLUMN engine_settled")
