"""The settled request model in ClickHouse's SQL, for request summaries computed where the data is.

A request summary (a day's baseline: one row per group) is the read that most needs to stay in ClickHouse,
so it runs there, over this restatement of the DuckDB macros `llm_span_requests_between` and
`llm_requests_settled_between` (duckdb/30_span_requests.sql and 45_settled_requests.sql beside this module):
client and server spans of one request counted once, the latest attempt carrying the client's id and figures,
tenant, provider and operation from the client, engine facts from the span when it has settled. The
conformance suite and a differential test with client and server spans, retries and orphans
(tests/test_clickhouse.py) hold it to the DuckDB definition. Reads that return requests (their keys must match
the scores') and reads joining live engine metrics still run the DuckDB definition
(storage/clickhouse/evaluator.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from fractions import Fraction

import pyarrow as pa

from storage import left_out
from storage.grouping_sets import grouping_sql
from storage.ports import Aggregate, Measure, RequestSummary
from storage.quoted_names import column_name as checked

# Columns of the span-level model whose value comes from the client span first (the caller knows the tenant).
CLIENT_FIRST = ("tenant_id", "provider", "operation")
_IDS = ("trace_id", "span_id", "server_span_id", "client_span_id", "status_code")
# What pairing reads of every LLM span, whatever the read asks for.
_LLM_KEYS = ("trace_id", "span_id", "llm_role", "start_time", "end_time", "status_code")
# The settled model over the span-level one: a span's own value first, then its stored engine fact.
_FACT_OF = {"queue_depth": "engine_queue_depth", "replica_count": "engine_replica_count",
            "cache_hit_ratio": "engine_cache_hit_ratio"}  # fmt: skip
_ENGINE_ONLY = {"kv_cache_usage": "engine_kv_cache_usage", "running_requests": "engine_running_requests",
                "preemptions": "engine_preemptions", "step_tokens": "engine_step_tokens",
                "engine_facts_reason": "engine_facts_reason"}  # fmt: skip
# What the live join reads of a span besides its replica, deployment and times: how long it waited
# (duckdb/40_requests.sql), for every engine column it fills.
_WAIT = ("queue_ms", "ttft_ms", "prefill_ms")
# The reason goes with the facts it explains: the settled span's (duckdb/30_span_requests.sql).
_REASON = "engine_facts_reason"


def span_level_columns(model_columns: Iterable[str]) -> list[str]:
    """The span-level model columns (and so the `spans` columns) the settled columns are made of: a column
    itself, and the engine fact a settled span stands in with."""
    out: list[str] = []
    for c in model_columns:
        if c in _FACT_OF:
            out += [c, _FACT_OF[c], *_WAIT]
        elif c.endswith("_source") and c.removesuffix("_source") in _FACT_OF:
            base = c.removesuffix("_source")
            out += [base, _FACT_OF[base], *_WAIT]
        elif c == _REASON:
            out += [_REASON, "engine_settled", *_WAIT]
        elif c in _ENGINE_ONLY:
            out += [_ENGINE_ONLY[c], *_WAIT]
        elif c not in _IDS:
            out.append(c)
    return list(dict.fromkeys(out))


def _settled(c: str) -> str:
    if c in _FACT_OF:
        return f"coalesce(r.{c}, r.{_FACT_OF[c]}) AS {c}"
    if c.endswith("_source") and (base := c.removesuffix("_source")) in _FACT_OF:
        return (
            f"CASE WHEN r.{base} IS NOT NULL THEN 'span' WHEN r.{_FACT_OF[base]} IS NOT NULL THEN 'engine' END AS {c}"
        )
    if c in _ENGINE_ONLY:
        return f"r.{_ENGINE_ONLY[c]} AS {c}"
    return f"r.{c} AS {c}"


def settled_requests_sql(model_columns: Iterable[str]) -> str:
    """A subquery of the settled requests that ended in [{t0}, {t1}) with these model columns."""
    wanted = list(dict.fromkeys(checked(c).strip('"') for c in model_columns))
    spans = span_level_columns(wanted)
    merged = [
        f"coalesce(p.c_{c}, x.{c}) AS {c}"
        if c in CLIENT_FIRST
        else f"if(x.engine_settled IS NOT NULL, x.{c}, if(p.attempt = 1, p.c_{c}, NULL)) AS {c}"
        if c == _REASON
        else f"coalesce(x.{c}, if(p.attempt = 1, p.c_{c}, NULL)) AS {c}"
        for c in spans
    ]
    status = (
        "CASE WHEN p.attempt > 1 THEN x.status_code "
        "WHEN x.status_code = 'ERROR' OR p.c_status_code = 'ERROR' THEN 'ERROR' "
        "WHEN x.status_code = 'OK' OR p.c_status_code = 'OK' THEN 'OK' ELSE 'UNSET' END AS status_code"
    )
    extra = [c for c in spans if c not in _LLM_KEYS]
    llm = (
        f"SELECT {', '.join(_LLM_KEYS)}{''.join(', ' + c for c in extra)} "
        "FROM spans WHERE is_llm AND end_time >= {t0:DateTime64(6)} - INTERVAL 1 HOUR "
        "AND end_time < {t1:DateTime64(6)} + INTERVAL 1 HOUR"
    )
    client_carried = "".join(f", c.{c} AS c_{c}" for c in spans)
    span_model = f"""
        WITH llm AS ({llm}),
        pairs AS (
            SELECT s.trace_id AS trace_id, s.span_id AS server_span_id, s.start_time AS server_start,
                   c.span_id AS client_span_id, c.status_code AS c_status_code{client_carried}
            FROM (SELECT * FROM llm WHERE llm_role = 'server') AS s
            INNER JOIN (SELECT * FROM llm WHERE llm_role = 'client') AS c ON c.trace_id = s.trace_id
            WHERE s.start_time >= c.start_time - INTERVAL 1 SECOND AND s.end_time <= c.end_time + INTERVAL 1 SECOND
            QUALIFY row_number() OVER (PARTITION BY s.trace_id, s.span_id ORDER BY c.start_time DESC, c.span_id) = 1
        ),
        attempts AS (
            SELECT *, row_number() OVER (PARTITION BY trace_id, client_span_id
                                         ORDER BY server_start DESC, server_span_id DESC) AS attempt
            FROM pairs
        ),
        claimed AS (SELECT DISTINCT trace_id, client_span_id FROM pairs)
        SELECT x.trace_id AS trace_id,
               if(p.attempt = 1, p.client_span_id, x.span_id) AS span_id,
               if(x.llm_role = 'server', x.span_id, NULL) AS server_span_id,
               CASE WHEN p.attempt = 1 THEN p.client_span_id WHEN x.llm_role = 'client' THEN x.span_id END
                   AS client_span_id,
               {status}{"".join(", " + m for m in merged)}
        FROM (SELECT * FROM llm WHERE end_time >= {{t0:DateTime64(6)}} AND end_time < {{t1:DateTime64(6)}}) AS x
        LEFT JOIN attempts AS p ON p.trace_id = x.trace_id AND p.server_span_id = x.span_id
        LEFT JOIN claimed AS k ON k.trace_id = x.trace_id AND k.client_span_id = x.span_id
        WHERE k.client_span_id IS NULL
    """
    outer = [_settled(c) if c not in _IDS else f"r.{c} AS {c}" for c in wanted]
    return f"(SELECT {', '.join(outer) or '1 AS one'} FROM ({span_model}) AS r)"


def _aggregate(m: Measure) -> str:
    name = checked(m.name)
    if m.aggregate is Aggregate.COUNT:
        return f"toInt64(count()) AS {name}"
    column = checked(str(m.column))
    if m.aggregate is Aggregate.MEAN:
        return f"avgOrNull({column}) AS {name}"
    # The sorted values: interpolated outside, by DuckDB's formula (below).
    return f"arraySort(groupArray({column})) AS {name}"


def _finish(m: Measure) -> str:
    """A quantile's two neighbouring order statistics and the fraction between them: RN = (n - 1) * q,
    lo and hi the values at floor(RN) and ceil(RN), d = RN - floor(RN). `interpolate` finishes it."""
    name = checked(m.name)
    if m.aggregate is not Aggregate.QUANTILE:
        return name
    raw = name.strip('"')
    rn = f"(toFloat64(length({name}) - 1) * {float(m.q or 0)!r})"
    return (
        f"if(empty({name}), NULL, {name}[toUInt64(floor({rn})) + 1]) AS `{raw}__lo`, "
        f"if(empty({name}), NULL, {name}[toUInt64(ceil({rn})) + 1]) AS `{raw}__hi`, "
        f"if(empty({name}), NULL, {rn} - floor({rn})) AS `{raw}__d`"
    )


def _fma(a: float, b: float, c: float) -> float:
    """a * b + c rounded once, as a fused multiply-add."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def interpolate(table: pa.Table, measures: Iterable[Measure]) -> pa.Table:
    """The quantile columns from their order statistics, computed as DuckDB's quantile_cont computes them:
    lo * (1 - d) + hi * d, which DuckDB's build evaluates as one fused multiply-add over hi * d (measured
    against DuckDB 2.0: plain double arithmetic, and ClickHouse's quantileExactInclusive, are a last bit off
    now and then). A few hundred groups: Python is fine here."""
    for m in measures:
        if m.aggregate is not Aggregate.QUANTILE:
            continue
        names = [f"{m.name}__lo", f"{m.name}__hi", f"{m.name}__d"]
        lows, highs, fractions = (table.column(n).to_pylist() for n in names)
        values = [
            None if lo is None else lo if d == 0 else _fma(lo, 1 - d, hi * d)
            for lo, hi, d in zip(lows, highs, fractions, strict=True)
        ]
        at = table.column_names.index(names[0])
        table = table.drop_columns(names).add_column(at, m.name, pa.array(values, pa.float64()))
    return table


def summary_sql(read: RequestSummary, params: dict[str, object]) -> str:
    """The summary with DuckDB's semantics: counts, means and quantile_cont quantiles per grouping set; the
    values of the requests it leaves out are added to `params`."""
    g = grouping_sql(read, checked)
    grouped, names, sets = g.columns, g.names, g.sets
    used = [*grouped, *read.require, *(m.column for m in read.measures if m.column is not None)]
    used += left_out.columns(read)

    def param(value: object) -> str:
        name = f"left_out_{len(params)}"
        params[name] = value
        return f"{{{name}:{'DateTime64(6)' if isinstance(value, datetime) else 'String'}}}"

    where = " AND ".join(
        [f"{checked(c)} IS NOT NULL" for c in read.require]
        + ([p] if read.leave_out is not None and (p := left_out.predicate(read.leave_out, param)) else [])
    )
    inner = (
        f"SELECT {names + ', ' if grouped else ''}toInt32({g.which}) AS grouping_set, "
        f"{', '.join(map(_aggregate, read.measures))} FROM {settled_requests_sql(used)} AS m"
        + (f" WHERE {where}" if where else "")
        + (f" GROUP BY GROUPING SETS ({sets})" if grouped else "")
    )
    return (
        f"SELECT {names + ', ' if grouped else ''}grouping_set, {', '.join(map(_finish, read.measures))} "
        f"FROM ({inner})\nSETTINGS join_use_nulls = 1, group_by_use_nulls = 1"
    )
