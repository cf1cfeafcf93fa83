"""Engine facts settled on the spans: each LLM span's engine facts are computed once, after the engine
metrics around it have arrived, and stored beside it, so reads of settled windows join nothing.

The join of 0009 gave the right answers but cost every read two or three hash joins of the window's
requests (a detection pass over a day of ten million requests took 1.6 times as long as one whose
spans carried the facts). Now:
- `spans` gains `engine_settled` (NULL until settled) and one `engine_<fact>` column per fact the join
  computes, holding what the engines said (NULL when they said nothing), never the span's own value;
- `span_engine_facts_between(t0, t1)` computes, for every unsettled LLM span that ended in the range, the
  facts of its own replica, deployment and times (the rules of 0009, unchanged); the writer stores them
  (storage.duckdb.engine_facts);
- the pairing carries the engine columns like any other server-first figure, and the request model takes
  a span's own value, else the settled engine value, else, for a request not yet settled, the live join.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""

import importlib

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# Earlier revisions are snapshots and are never edited; this one builds on their pieces.
_pairing = importlib.import_module("migrations.versions.0007_one_row_per_request_attempt")
_joined = importlib.import_module("migrations.versions.0009_engine_metrics")

# (fact, type, engine state it needs): `fleet` the deployment's at arrival, `replica` the replica's.
_FACTS = (
    ("queue_depth", "BIGINT", "fleet"),
    ("replica_count", "BIGINT", "fleet"),
    ("cache_hit_ratio", "DOUBLE", "replica"),
    ("kv_cache_usage", "DOUBLE", "replica"),
    ("running_requests", "BIGINT", "replica"),
    ("preemptions", "BIGINT", "replica"),
    ("step_tokens", "DOUBLE", "replica"),
)
# The facts a span may carry itself (its value wins); the others exist only as engine facts.
_ON_SPANS = ("queue_depth", "replica_count", "cache_hit_ratio")


def _engine_expressions() -> dict[str, str]:
    """Each fact's value from the engines, over the lookups `a`, `e` (the replica's) and `d` (the deployment's)."""
    values = dict(_joined._FLEET_FILLED) | dict(_joined._REPLICA_FILLED)
    for expression in _joined._REPLICA_ONLY:
        value, name = expression.rsplit(" AS ", 1)
        values[name] = value
    return values


_VALUES = _engine_expressions()
_ENGINE_COLUMNS = tuple(f"engine_{fact}" for fact, _, _ in _FACTS)


def _lookups(*, fleet: bool, replica: bool, settled_only: bool) -> tuple[str, str]:
    """The lookups' CTEs and joins for rows `r` keyed by `keys`; `settled_only` joins only unsettled rows."""
    unsettled = "r.engine_settled IS NULL AND " if settled_only else ""
    arrival, end = _joined._ARRIVAL_SECOND, _joined._END_SECOND
    ctes, joins = [], []
    if replica:
        ctes += [
            f"arrival AS ({_joined._lookup('replica_id', arrival, '<=', 'states')})",
            f"departure AS ({_joined._lookup('replica_id', end, '>=', 'states')})",
        ]
        joins += [
            f"LEFT JOIN arrival AS a ON {unsettled}a.replica_id = r.replica_id AND a.second = {arrival}",
            f"LEFT JOIN departure AS e ON {unsettled}e.replica_id = r.replica_id AND e.second = {end}",
        ]
    if fleet:
        ctes += [
            f"deployments AS MATERIALIZED ({_joined._deployment_states('states')})",
            f"fleet AS ({_joined._lookup('deployment', arrival, '<=', 'deployments')})",
        ]
        joins += [f"LEFT JOIN fleet AS d ON {unsettled}d.deployment = r.deployment AND d.second = {arrival}"]
    return ",\n    ".join(ctes), "\n    ".join(joins)


# Every unsettled LLM span that ended in [t0, t1), with the facts of its own replica, deployment and times.
# `row_id` is the span's row, so that the writer's update finds it without comparing ids.
_SPAN_FACTS = f"""
    WITH keys AS NOT MATERIALIZED (
        SELECT rowid AS row_id, replica_id, deployment, start_time, end_time FROM spans
        WHERE is_llm AND engine_settled IS NULL AND end_time >= t0::TIMESTAMP AND end_time < t1::TIMESTAMP
    ),{_joined._REACH},
    {_lookups(fleet=True, replica=True, settled_only=False)[0]}
    SELECT r.row_id, {", ".join(f"{_VALUES[fact]} AS {fact}" for fact, _, _ in _FACTS)}
    FROM keys AS r
    {_lookups(fleet=True, replica=True, settled_only=False)[1]}
"""


def _requests(span_columns: list[str], *, fleet: bool, replica: bool) -> str:
    """The request model: a span's own value, else the settled engine fact, else the live join (unsettled only).

    As in 0009, a read that needs only one kind of engine column uses the macro that joins only that kind.
    The spans' model's columns are listed one by one: DuckDB keeps an EXCLUDE list unordered, which would
    make the stored macro's text differ from one database to the next.
    """
    kinds = {"fleet": fleet, "replica": replica}
    wanted = [fact for fact, _, needs in _FACTS if kinds[needs]]
    engine = {fact: f"coalesce(r.engine_{fact}, {_VALUES[fact]})" for fact in wanted}
    columns = [
        f"coalesce(r.{c}, {engine[c]}) AS {c}" if c in engine else f"r.{c}"
        for c in span_columns
        if c not in _ENGINE_COLUMNS and c != "engine_settled"
    ]
    columns += [
        f"CASE WHEN r.{fact} IS NOT NULL THEN 'span' WHEN {engine[fact]} IS NOT NULL THEN 'engine' END AS {fact}_source"
        for fact in wanted
        if fact in _ON_SPANS
    ]
    columns += [f"{engine[fact]} AS {fact}" for fact in wanted if fact not in _ON_SPANS]
    ctes, joins = _lookups(fleet=fleet, replica=replica, settled_only=True)
    selected = ",\n           ".join(columns)
    return f"""
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    -- Only spans not yet settled are looked up: a settled window joins against empty lookups.
    keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time FROM spans
        WHERE is_llm AND engine_settled IS NULL
          AND end_time >= t0::TIMESTAMP - INTERVAL 1 HOUR AND end_time < t1::TIMESTAMP + INTERVAL 1 HOUR
    ),{_joined._REACH},
    {ctes}
    SELECT {selected}
    FROM r
    {joins}
"""


def _define_requests(requests: str, fleet: str, replica: str) -> None:
    op.execute(f"CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE {requests}")
    op.execute(f"CREATE OR REPLACE MACRO llm_requests_fleet_between(t0, t1) AS TABLE {fleet}")
    op.execute(f"CREATE OR REPLACE MACRO llm_requests_replica_between(t0, t1) AS TABLE {replica}")
    op.execute(_joined._VIEW)


def span_model_columns() -> list[str]:
    """The columns of the spans' request model as the database defines it now, in order."""
    rows = (
        op.get_bind()
        .exec_driver_sql("DESCRIBE SELECT * FROM llm_span_requests_between(NULL::TIMESTAMP, NULL::TIMESTAMP)")
        .fetchall()
    )
    return [str(row[0]) for row in rows]


def upgrade() -> None:
    op.execute("ALTER TABLE spans ADD COLUMN engine_settled BOOLEAN")
    for fact, sql_type, _ in _FACTS:
        op.execute(f"ALTER TABLE spans ADD COLUMN engine_{fact} {sql_type}")
    with_engine = (*_pairing._SERVER_FIRST, *_ENGINE_COLUMNS, "engine_settled")
    op.execute(
        f"CREATE OR REPLACE MACRO llm_span_requests_between(t0, t1) AS TABLE {_pairing._requests_sql(with_engine)}"
    )
    op.execute(f"CREATE MACRO span_engine_facts_between(t0, t1) AS TABLE {_SPAN_FACTS}")
    span_columns = span_model_columns()
    _define_requests(
        _requests(span_columns, fleet=True, replica=True),
        _requests(span_columns, fleet=True, replica=False),
        _requests(span_columns, fleet=False, replica=True),
    )


def downgrade() -> None:
    _define_requests(
        _joined._requests(fleet=True, replica=True),
        _joined._requests(fleet=True, replica=False),
        _joined._requests(fleet=False, replica=True),
    )
    op.execute("DROP MACRO TABLE span_engine_facts_between")
    op.execute(f"CREATE OR REPLACE MACRO llm_span_requests_between(t0, t1) AS TABLE {_pairing._requests_sql()}")
    for fact, _, _ in reversed(_FACTS):
        op.execute(f"ALTER TABLE spans DROP COLUMN engine_{fact}")
    op.execute("ALTER TABLE spans DROP COLUMN engine_settled")
