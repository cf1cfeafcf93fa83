"""The request model with no live join: `llm_requests_settled_between(t0, t1)`.

A read whose requests are all settled, or which has no engine metrics in reach (a fleet that sends none),
needs no lookup at all: a span's own value, else its settled engine fact. The detectors' reads use it
then (storage.duckdb.reads); the columns are those of `llm_requests_between`.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-23
"""

import importlib

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_settled = importlib.import_module("migrations.versions.0011_engine_facts_settled")


def _settled_requests(span_columns: list[str]) -> str:
    facts = [fact for fact, _, _ in _settled._FACTS]
    columns = [
        f"coalesce(r.{c}, r.engine_{c}) AS {c}" if c in facts else f"r.{c}"
        for c in span_columns
        if c not in _settled._ENGINE_COLUMNS and c != "engine_settled"
    ]
    columns += [
        f"CASE WHEN r.{f} IS NOT NULL THEN 'span' WHEN r.engine_{f} IS NOT NULL THEN 'engine' END AS {f}_source"
        for f in facts
        if f in _settled._ON_SPANS
    ]
    columns += [f"r.engine_{f} AS {f}" for f in facts if f not in _settled._ON_SPANS]
    selected = ",\n           ".join(columns)
    return f"SELECT {selected}\n    FROM llm_span_requests_between(t0, t1) AS r"


def upgrade() -> None:
    op.execute(
        f"CREATE MACRO llm_requests_settled_between(t0, t1) AS TABLE {_settled_requests(_settled.span_model_columns())}"
    )


def downgrade() -> None:
    op.execute("DROP MACRO TABLE llm_requests_settled_between")
