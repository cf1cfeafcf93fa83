"""Engine metrics: the `engine_metrics` table, and the request model joined to it.

`llm_requests_between` becomes the spans' request model (kept as `llm_span_requests_between`, its body
taken over unchanged) joined to the engine metrics of the request's replica and deployment:
- `queue_depth`: waiting requests summed over the deployment's replicas at arrival;
- `replica_count`: the deployment's replicas reporting at arrival;
- `cache_hit_ratio`: the replica's prefix-cache hits / queries over the request's lifetime;
- new: `kv_cache_usage` and `running_requests` at arrival, `preemptions` during the request, and
  `step_tokens` (tokens per engine step during the request).
A span's own value always wins; `<column>_source` says whether it is `span` or `engine`.

A value is current for two reporting intervals (`interval_s`) after its point; arrival is the span's
start, the lifetime runs from the last point at or before the start to the first at or after the end.
Counters are read as differences: a drop, or a new start time, is a reset, and counting resumes from
the new value. A retried export's duplicate point counts once.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TABLE = """
    CREATE TABLE engine_metrics (
        time TIMESTAMP NOT NULL,
        start_time TIMESTAMP,
        name VARCHAR NOT NULL,
        metric VARCHAR,
        kind VARCHAR NOT NULL,
        value DOUBLE NOT NULL,
        replica_id VARCHAR,
        deployment VARCHAR,
        model VARCHAR,
        engine VARCHAR,
        source VARCHAR NOT NULL,
        interval_s DOUBLE NOT NULL,
        attributes JSON,
        resource JSON,
        ingested_at TIMESTAMP NOT NULL
    )
"""

# One row per scraped target (metrics.scrape.targets), replaced after every scrape.
_SCRAPE_TARGETS = """
    CREATE TABLE scrape_targets (
        url VARCHAR PRIMARY KEY,
        replica_id VARCHAR,
        deployment VARCHAR,
        up BOOLEAN NOT NULL,
        last_scrape TIMESTAMP NOT NULL,
        last_success TIMESTAMP,
        last_error VARCHAR,
        points BIGINT NOT NULL,
        seconds DOUBLE NOT NULL
    )
"""

# Two reporting intervals, as an INTERVAL, from a row's interval_s.
_STALE = "(CAST(2e6 * interval_s AS BIGINT) * INTERVAL 1 MICROSECOND)"

_STATES = """
    WITH points AS (
        -- The series is hashed once so the window below sorts integers, not label JSON.
        SELECT hash(replica_id, deployment, name, attributes) AS series, time, replica_id, deployment, metric, kind,
               start_time, value, interval_s
        FROM engine_metrics
        WHERE metric IS NOT NULL AND replica_id IS NOT NULL
          AND time >= t0::TIMESTAMP AND time < t1::TIMESTAMP
    ),
    increments AS (
        -- What each point adds: a gauge its level; a counter its growth since the series' previous point
        -- (a drop, or a new start time, is a reset: it grew by its whole value); a delta point itself.
        SELECT replica_id, deployment, metric, time, interval_s, kind,
               CASE WHEN kind = 'gauge' THEN value
                    WHEN kind = 'delta' THEN value
                    WHEN prev IS NULL THEN 0
                    WHEN value < prev OR start_time IS DISTINCT FROM prev_start THEN value
                    ELSE value - prev END AS amount
        FROM (
            SELECT *, lag(time) OVER series AS prev_time, lag(value) OVER series AS prev,
                   lag(start_time) OVER series AS prev_start
            FROM points
            WINDOW series AS (PARTITION BY series ORDER BY time, value)
        )
        -- A retried export stores a point twice: the second of a series' points at one time is dropped.
        WHERE prev_time IS DISTINCT FROM time
    ),
    pivoted AS (
        SELECT replica_id, deployment, time, max(interval_s) AS interval_s,
               sum(amount) FILTER (WHERE metric = 'requests_waiting') AS waiting,
               sum(amount) FILTER (WHERE metric = 'requests_running') AS running,
               max(amount) FILTER (WHERE metric = 'kv_cache_usage') AS kv_cache_usage,
               avg(amount) FILTER (WHERE metric = 'cache_hit_rate') AS cache_hit_rate,
               sum(amount) FILTER (WHERE metric = 'prefix_cache_queries') AS d_queries,
               sum(amount) FILTER (WHERE metric = 'prefix_cache_hits') AS d_hits,
               sum(amount) FILTER (WHERE metric = 'preemptions') AS d_preemptions,
               sum(amount) FILTER (WHERE metric = 'step_tokens_sum') AS d_step_tokens,
               sum(amount) FILTER (WHERE metric = 'step_tokens_count') AS d_steps
        FROM increments
        GROUP BY replica_id, deployment, time
    )
    -- Counters as levels that grow from the first point in range: subtract two rows for the growth between.
    SELECT replica_id, deployment, time, interval_s, waiting, running, kv_cache_usage, cache_hit_rate,
           sum(d_queries) OVER replica AS cache_queries,
           sum(d_hits) OVER replica AS cache_hits,
           sum(d_preemptions) OVER replica AS preemptions,
           sum(d_step_tokens) OVER replica AS step_tokens,
           sum(d_steps) OVER replica AS steps
    FROM pivoted
    WINDOW replica AS (PARTITION BY replica_id, deployment ORDER BY time
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
"""


# The deployment's totals as a step function: each replica's latest current value enters when it
# arrives (replacing that replica's previous one if still current) and leaves when it goes stale.
def _deployment_states(states: str) -> str:
    return f"""
    WITH s AS (
        SELECT *, lag(time) OVER r AS prev_time, lag(waiting) OVER r AS prev_waiting, lead(time) OVER r AS next_time
        FROM {states}
        WHERE deployment IS NOT NULL
        WINDOW r AS (PARTITION BY deployment, replica_id ORDER BY time)
    ),
    events AS (
        SELECT deployment, time,
               coalesce(waiting, 0) - CASE WHEN time - prev_time <= {_STALE} THEN coalesce(prev_waiting, 0) ELSE 0 END
                   AS d_waiting,
               CASE WHEN time - prev_time <= {_STALE} THEN 0 ELSE 1 END AS d_replicas
        FROM s
        UNION ALL
        SELECT deployment, time + {_STALE}, -coalesce(waiting, 0), -1
        FROM s
        WHERE next_time IS NULL OR next_time - time > {_STALE}
    )
    SELECT deployment, time,
           sum(d_waiting) OVER d AS waiting,
           sum(d_replicas) OVER d AS replicas
    FROM events
    WINDOW d AS (PARTITION BY deployment ORDER BY time RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
"""


# The states a window's requests can use: from two reporting intervals before the earliest arrival to two
# after the latest end. Bounded by the requests, not the window's margins, so a 5-minute window reads
# minutes of engine points, not hours.
_REACH = """
    reach AS MATERIALIZED (
        SELECT lo - margin AS lo, hi + margin AS hi
        FROM (SELECT min(start_time) AS lo, max(end_time) AS hi FROM keys) AS span,
        LATERAL (
            SELECT CAST(2e6 * coalesce(max(interval_s), 0) AS BIGINT) * INTERVAL 1 MICROSECOND AS margin
            FROM engine_metrics WHERE time >= span.lo - INTERVAL 2 HOUR AND time < span.hi + INTERVAL 2 HOUR
        )
    ),
    states AS MATERIALIZED (SELECT * FROM engine_states_between((SELECT lo FROM reach), (SELECT hi FROM reach)))"""


def _stale(alias: str) -> str:
    return _STALE.replace("interval_s", f"{alias}.interval_s")


# Times are taken to the second: arrival is the start of the second a request started in, the end the end
# of the second it ended in. Looking states up once per (replica, second) and hash-joining the requests to
# them costs a fifth of an as-of join of every request (ten million requests: ~6 s against ~30 s).
_ARRIVAL_SECOND = "date_trunc('second', r.start_time)"
_END_SECOND = "date_trunc('second', r.end_time) + INTERVAL 1 SECOND"
# `a`: the replica's last state at or before arrival; `e`: its first at or after the end; `d`: the deployment's.
_AT_ARRIVAL = f"(a.second - a.time <= {_stale('a')})"
_LIFETIME = f"({_AT_ARRIVAL} AND e.time - e.second <= {_stale('e')})"


def _lookup(column: str, second: str, direction: str, table: str) -> str:
    """One row per (column, second) the window's LLM spans need, with the state `direction` of it.

    None when no engine reported in reach: a fleet without engine metrics pays next to nothing."""
    return f"""
        SELECT k.*, s.* EXCLUDE ({column}) FROM (
            SELECT DISTINCT {column}, {second} AS second FROM keys AS r
            WHERE {column} IS NOT NULL AND EXISTS (SELECT 1 FROM {table})
        ) AS k
        ASOF LEFT JOIN {table} AS s ON s.{column} = k.{column} AND s.time {direction} k.second"""


def _delta(column: str) -> str:
    return f"(CASE WHEN {_LIFETIME} THEN e.{column} - a.{column} END)"


# The columns a span may carry itself and the join fills otherwise: (column, value from the engines), by
# what they need: the deployment's state at arrival (`fleet`), or the replica's (`replica`).
_FLEET_FILLED = (
    ("queue_depth", "(CASE WHEN d.replicas > 0 THEN CAST(round(d.waiting) AS BIGINT) END)"),
    ("replica_count", "(CASE WHEN d.replicas > 0 THEN CAST(d.replicas AS BIGINT) END)"),
)
_REPLICA_FILLED = (
    (
        "cache_hit_ratio",
        f"coalesce(CASE WHEN {_delta('cache_queries')} > 0 "
        f"THEN least(1.0, {_delta('cache_hits')} / {_delta('cache_queries')}) END, "
        f"CASE WHEN {_AT_ARRIVAL} THEN a.cache_hit_rate END)",
    ),
)
_REPLICA_ONLY = (
    f"CASE WHEN {_AT_ARRIVAL} THEN a.kv_cache_usage END AS kv_cache_usage",
    f"CASE WHEN {_AT_ARRIVAL} THEN CAST(round(a.running) AS BIGINT) END AS running_requests",
    f"CAST(round({_delta('preemptions')}) AS BIGINT) AS preemptions",
    f"CASE WHEN {_delta('steps')} > 0 THEN {_delta('step_tokens')} / {_delta('steps')} END AS step_tokens",
)


def _requests(*, fleet: bool, replica: bool) -> str:
    """The request model joined to the engines' state: the deployment's, the replica's, or both.

    Reads that need only one kind of engine column use a macro that joins only that kind
    (storage.duckdb.reads picks it); `llm_requests_between` joins both.
    """
    filled = (_FLEET_FILLED if fleet else ()) + (_REPLICA_FILLED if replica else ())
    replaced = ", ".join(f"coalesce(r.{c}, {v}) AS {c}" for c, v in filled)
    sources = [
        f"CASE WHEN r.{c} IS NOT NULL THEN 'span' WHEN {v} IS NOT NULL THEN 'engine' END AS {c}_source"
        for c, v in filled
    ]
    lookups = []
    joins = []
    if replica:
        lookups += [
            f"arrival AS ({_lookup('replica_id', _ARRIVAL_SECOND, '<=', 'states')})",
            f"departure AS ({_lookup('replica_id', _END_SECOND, '>=', 'states')})",
        ]
        joins += [
            f"LEFT JOIN arrival AS a ON a.replica_id = r.replica_id AND a.second = {_ARRIVAL_SECOND}",
            f"LEFT JOIN departure AS e ON e.replica_id = r.replica_id AND e.second = {_END_SECOND}",
        ]
    if fleet:
        lookups += [
            f"deployments AS MATERIALIZED ({_deployment_states('states')})",
            f"fleet AS ({_lookup('deployment', _ARRIVAL_SECOND, '<=', 'deployments')})",
        ]
        joins += [f"LEFT JOIN fleet AS d ON d.deployment = r.deployment AND d.second = {_ARRIVAL_SECOND}"]
    columns = ",\n           ".join([f"r.* REPLACE ({replaced})", *sources, *(_REPLICA_ONLY if replica else ())])
    ctes = ",\n    ".join(lookups)
    joined = "\n    ".join(joins)
    return f"""
    WITH r AS (SELECT * FROM llm_span_requests_between(t0, t1)),
    -- A request's replica, deployment and times are those of one of the window's LLM spans (the pairing
    -- takes them from its server span, else its client span): the lookups are keyed from the spans.
    keys AS NOT MATERIALIZED (
        SELECT replica_id, deployment, start_time, end_time FROM spans
        WHERE is_llm AND end_time >= t0::TIMESTAMP - INTERVAL 1 HOUR AND end_time < t1::TIMESTAMP + INTERVAL 1 HOUR
    ),{_REACH},
    {ctes}
    SELECT {columns}
    FROM r
    {joined}
"""


_REQUESTS = _requests(fleet=True, replica=True)

_VIEW = (
    "CREATE OR REPLACE VIEW llm_requests AS "
    "SELECT * FROM llm_requests_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP)"
)


def _macro_body(name: str) -> str:
    body = (
        op.get_bind()
        .exec_driver_sql(f"SELECT macro_definition FROM duckdb_functions() WHERE function_name = '{name}'")
        .scalar_one()
    )
    return str(body)


# A request's scores need only its ids, so they are read from the spans' model, never through the join;
# and each request's two span ids are unnested into one join with the scores instead of a UNION ALL of
# two, which computed the pairing twice and ran out of DuckDB's default memory on a day of requests.
_SCORES = """
    WITH r AS (
        SELECT trace_id, span_id, unnest([client_span_id, server_span_id]) AS scored_span_id
        FROM llm_span_requests_between(t0, t1)
    )
    SELECT r.trace_id, r.span_id, sc.span_id AS scored_span_id, sc.name, sc.score, sc.label, sc.source,
           sc.observed_at
    FROM r JOIN span_scores AS sc ON sc.trace_id = r.trace_id AND sc.span_id = r.scored_span_id
"""
# As 0003 left it, for the downgrade.
_SCORES_0003 = """
    SELECT r.trace_id, r.span_id, sc.span_id AS scored_span_id, sc.name, sc.score, sc.label, sc.source,
           sc.observed_at
    FROM llm_requests_between(t0, t1) AS r
    JOIN span_scores AS sc ON sc.trace_id = r.trace_id AND sc.span_id = r.client_span_id
    UNION ALL
    SELECT r.trace_id, r.span_id, sc.span_id AS scored_span_id, sc.name, sc.score, sc.label, sc.source,
           sc.observed_at
    FROM llm_requests_between(t0, t1) AS r
    JOIN span_scores AS sc ON sc.trace_id = r.trace_id AND sc.span_id = r.server_span_id
"""


def _scores(sql: str) -> None:
    op.execute(f"CREATE OR REPLACE MACRO llm_request_scores_between(t0, t1) AS TABLE {sql}")
    op.execute(
        "CREATE OR REPLACE VIEW llm_request_scores AS "
        "SELECT * FROM llm_request_scores_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP)"
    )


def upgrade() -> None:
    op.execute(_TABLE)
    op.execute(_SCRAPE_TARGETS)
    # The spans' request model, unchanged, under its own name; the public one joins it to the engines.
    op.execute(f"CREATE MACRO llm_span_requests_between(t0, t1) AS TABLE {_macro_body('llm_requests_between')}")
    op.execute(f"CREATE MACRO engine_states_between(t0, t1) AS TABLE {_STATES}")
    op.execute(
        f"CREATE MACRO engine_deployment_states_between(t0, t1) AS TABLE "
        f"{_deployment_states('engine_states_between(t0, t1)')}"
    )
    op.execute(f"CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE {_REQUESTS}")
    op.execute(f"CREATE MACRO llm_requests_fleet_between(t0, t1) AS TABLE {_requests(fleet=True, replica=False)}")
    op.execute(f"CREATE MACRO llm_requests_replica_between(t0, t1) AS TABLE {_requests(fleet=False, replica=True)}")
    op.execute(_VIEW)
    _scores(_SCORES)


def downgrade() -> None:
    op.execute(
        f"CREATE OR REPLACE MACRO llm_requests_between(t0, t1) AS TABLE {_macro_body('llm_span_requests_between')}"
    )
    op.execute(_VIEW)
    op.execute("DROP MACRO TABLE llm_requests_replica_between")
    op.execute("DROP MACRO TABLE llm_requests_fleet_between")
    op.execute("DROP MACRO TABLE engine_deployment_states_between")
    op.execute("DROP MACRO TABLE engine_states_between")
    op.execute("DROP MACRO TABLE llm_span_requests_between")
    op.execute("DROP TABLE scrape_targets")
    op.execute("DROP TABLE engine_metrics")
