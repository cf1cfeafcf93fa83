"""Derived canonical columns stored as NULL with a bit (`storage.attributes: split`) read back as normalization
made them, bit for bit, through the `spans` view; and the migration that introduced them keeps every value
both ways (model/derived_columns.py)."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from builders import request, span
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waiting import HANG_GUARD

from collector.decode import Encoding, decode_traces
from model.columns import LLM_FIELDS, MAX_TIME_NS
from model.derived_columns import DERIVATIONS, DERIVED_BITS, DURATION_READ_SQL, leave_derived, read_sql
from storage.duckdb import migrate
from storage.duckdb.backend import DuckDBStorage
from storage.duckdb.database import open_database
from storage.export import DATASET_SQL
from storage.span_layout import STORED_ONLY

# DERIVATIONS as first given: a stored bit names its entry forever (append only).
FIRST = ("tpot_ms", "cache_hit_ratio")

VLLM = {
    "gen_ai.usage.prompt_tokens": 812,
    "gen_ai.usage.completion_tokens": 97,
    "gen_ai.usage.cached_tokens": 640,
    "gen_ai.latency.time_to_first_token": 0.0731,
    "gen_ai.latency.e2e": 1.9031,
    "gen_ai.latency.time_in_model_decode": 1.8123,
}


def bits_of(value: Any) -> Any:
    """A float by its bits (NaN, -0.0 and 0.0 kept apart); anything else as it is."""
    return struct.pack("<d", value) if isinstance(value, float) else value


# The columns a split span may store NULL for the view to derive.
READ = ("duration_ms", *LLM_FIELDS)


def read_back(storage: DuckDBStorage) -> dict[str, tuple[Any, ...]]:
    names = ", ".join(READ)
    rows = storage.reader.rows(f"SELECT span_id, {names} FROM spans")
    return {row[0]: tuple(bits_of(v) for v in row[1:]) for row in rows}


def decoded(batch: pa.Table) -> dict[str, tuple[Any, ...]]:
    ids = batch["span_id"].to_pylist()
    columns = [batch[name].to_pylist() for name in READ]
    return {span_id: tuple(bits_of(c[i]) for c in columns) for i, span_id in enumerate(ids)}


def store_split(storage: DuckDBStorage, payload: bytes) -> pa.Table:
    """Store the request's spans as DuckDB does (split); returns them decoded whole, every column as normalized."""
    split = decode_traces(payload, Encoding.PROTOBUF, split_attributes=True).spans
    assert split is not None
    future = storage.sink.try_submit(split)
    assert future is not None and future.result(timeout=HANG_GUARD).inserted == split.num_rows
    whole = decode_traces(payload, Encoding.PROTOBUF).spans
    assert whole is not None
    return whole


# Nanosecond times whose microseconds DuckDB rounds either way (half up), and the longest exact differences.
_TIMES = st.one_of(
    st.integers(min_value=1, max_value=MAX_TIME_NS),
    st.integers(min_value=1, max_value=10**6).map(lambda n: 1_700_000_000_000_000_000 + n),
    st.sampled_from([1, 499, 500, 501, 999, 1000, 1500, 2**53 - 1, 2**53, 2**53 + 1, MAX_TIME_NS - 1, MAX_TIME_NS]),
)


@pytest.fixture
def storage(tmp_path: Path) -> Any:
    opened = DuckDBStorage.open(tmp_path / "derived.duckdb")
    yield opened
    opened.close()


def test_a_vllm_spans_derived_columns_are_stored_as_null_and_read_back_derived(storage: DuckDBStorage) -> None:
    whole = store_split(storage, request([span(attributes=VLLM)]).SerializeToString())
    assert read_back(storage) == decoded(whole)
    [row] = storage.reader.rows("SELECT tpot_ms, cache_hit_ratio, columns_derived FROM span_rows")
    assert row == (None, None, DERIVED_BITS["tpot_ms"] | DERIVED_BITS["cache_hit_ratio"])
    [(tpot, ratio)] = storage.reader.rows("SELECT tpot_ms, cache_hit_ratio FROM spans")
    assert tpot == 1812.3 / 96 and ratio == 640 / 812


def test_a_spans_duration_is_stored_as_null_and_read_back_from_its_times(storage: DuckDBStorage) -> None:
    start = 1_764_000_000_123_456_200
    whole = store_split(storage, request([span(start=start, end=start + 1_903_100_500)]).SerializeToString())
    assert read_back(storage) == decoded(whole)
    [row] = storage.reader.rows("SELECT duration_ms, duration_rem_ns FROM span_rows")
    # Stored at the microsecond, …456_200 ns is …456 µs and …556_700 ns is …557 µs (half up): 500 ns too many.
    assert row == (None, -500)
    assert storage.reader.rows("SELECT duration_ms FROM spans") == [(1903.1005,)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_TIMES, _TIMES), min_size=1, max_size=8))
def test_any_spans_duration_reads_back_as_decoded(storage: DuckDBStorage, times: list[tuple[int, int]]) -> None:
    """Sub-microsecond times rounded up and down, differences past 2^53 ns and DuckDB's infinity (2^63 − 1 ns)."""
    storage.writer.submit(lambda con: con.execute("DELETE FROM span_rows")).result(timeout=HANG_GUARD)
    spans = [span(start=min(t), end=max(t)) for t in times]
    whole = store_split(storage, request(spans).SerializeToString())
    got, want = read_back(storage), decoded(whole)
    assert got == want, {k: (got[k], want[k]) for k in want if got.get(k) != want[k]}
    # Left out wherever the rule gives it back: past 2^53 ns or at infinity it is stored.
    ns = {name: whole[name].cast(pa.int64()).to_pylist() for name in ("start_time", "end_time")}
    kept = {
        span_id: end - start >= 2**53 or end == MAX_TIME_NS
        for span_id, start, end in zip(whole["span_id"].to_pylist(), ns["start_time"], ns["end_time"], strict=True)
    }
    stored = storage.reader.rows("SELECT span_id, duration_ms IS NOT NULL FROM span_rows")
    assert dict(stored) == kept


def test_the_view_reads_duration_through_the_current_rule(tmp_path: Path) -> None:
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con)
    con.execute(f"CREATE VIEW probe AS SELECT {DURATION_READ_SQL} AS duration_ms FROM span_rows")
    views = dict(con.execute("SELECT view_name, sql FROM duckdb_views() WHERE internal = false").fetchall())
    con.close()
    expression = views["probe"].removeprefix("CREATE VIEW probe AS SELECT ").removesuffix(" FROM span_rows;")
    assert expression in views["spans"]


def test_a_value_the_source_sent_is_stored_as_sent(storage: DuckDBStorage) -> None:
    sent = {**VLLM, "gen_ai.server.time_per_output_token": 18.5, "llm.vllm.cache_hit_ratio": 0.25}
    whole = store_split(storage, request([span(attributes=sent)]).SerializeToString())
    assert read_back(storage) == decoded(whole)
    [row] = storage.reader.rows("SELECT tpot_ms, cache_hit_ratio, columns_derived FROM span_rows")
    assert row == (18.5, 0.25, 0)


_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=1e4),
    st.sampled_from([0.0, -0.0, 5e-324, 1e308, -1e308]),
)
_COUNTS = st.one_of(
    st.integers(min_value=-3, max_value=4000), st.sampled_from([2**53 + 1, 2**63 - 1, -(2**63)]), st.just(0)
)
_SPAN = st.fixed_dictionaries(
    {},
    optional={
        "gen_ai.usage.prompt_tokens": _COUNTS,
        "gen_ai.usage.completion_tokens": _COUNTS,
        "gen_ai.usage.cached_tokens": _COUNTS,
        "gen_ai.latency.time_to_first_token": _FLOATS,
        "gen_ai.latency.e2e": _FLOATS,
        "gen_ai.latency.time_in_model_decode": _FLOATS,
        "gen_ai.server.time_per_output_token": _FLOATS,
        "llm.vllm.cache_hit_ratio": _FLOATS,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_SPAN, min_size=1, max_size=6))
def test_every_canonical_column_of_any_span_reads_back_as_normalization_made_it(
    storage: DuckDBStorage, spans: list[dict[str, Any]]
) -> None:
    storage.writer.submit(lambda con: con.execute("DELETE FROM span_rows")).result(timeout=HANG_GUARD)
    whole = store_split(storage, request([span(attributes=a) for a in spans]).SerializeToString())
    got, want = read_back(storage), decoded(whole)
    assert got == want, {k: (got[k], want[k]) for k in want if got.get(k) != want[k]}


# A small pool too, so that inputs are often equal (e2e = ttft is where a strict comparison would differ).
_COLUMN_FLOATS = st.one_of(st.none(), st.sampled_from([0.0, 1.0, 3.0]), _FLOATS)
_COLUMN_COUNTS = st.one_of(st.none(), _COUNTS)


_INPUTS = ("input_tokens", "output_tokens", "cached_input_tokens", "decode_ms", "e2e_ms", "ttft_ms")


def assert_read_back_as_made(rows: list[tuple[Any, ...]], sent: dict[str, list[Any]]) -> None:
    """Normalize `rows` (the inputs, as _INPUTS) with `sent` values winning, leave the derived ones out, read
    them back through the view's SQL: every value as made, bit for bit, and none made stored twice."""
    columns = {
        name: pa.array([r[i] for r in rows], pa.int64() if i < 3 else pa.float64()) for i, name in enumerate(_INPUTS)
    }
    for d in DERIVATIONS:
        columns[d.column] = pc.coalesce(pa.array(sent[d.column], pa.float64()), d.arrow(columns))
    stored, derived = leave_derived(columns)
    con = duckdb.connect()
    con.register("span_rows", pa.table({**stored, "columns_derived": derived}))
    reads = ", ".join(f"{read_sql(d)} AS {d.column}" for d in DERIVATIONS)
    got = con.execute(f"SELECT {reads} FROM span_rows").fetchall()
    con.close()
    want = list(zip(*(columns[d.column].to_pylist() for d in DERIVATIONS), strict=True))
    assert [tuple(map(bits_of, r)) for r in got] == [tuple(map(bits_of, r)) for r in want]
    for d in DERIVATIONS:
        for i, value in enumerate(columns[d.column].to_pylist()):
            inputs = [columns[n][i].as_py() for n in d.inputs]
            made = sent[d.column][i] is None and value is not None and math.isfinite(value)
            if made and all(v is None or math.isfinite(v) for v in inputs):
                assert stored[d.column][i].as_py() is None, (d.column, i)


EDGES = [
    # input, output, cached tokens; decode, e2e, ttft ms
    (100, 5, 100, None, 1.0, 1.0),  # e2e = ttft: a per-token time of 0
    (100, 5, 0, None, 1.0, 2.0),  # e2e < ttft: none
    (100, 2, 150, 3.0, 1.0, 2.0),  # decode wins; more cached than sent: 1
    (100, 1, -5, 3.0, None, None),  # one output token: none; negative cached: 0
    (0, 5, 0, None, 4.0, 1.0),  # no prompt: no ratio
    (2**63 - 1, 2**53 + 1, 2**62, 1e308, 1e308, -1e308),  # counts past 2^53, an infinite difference
    (7, 9, 3, None, math.nan, 1.0),  # NaN: DuckDB orders it above every number
    (7, 9, 3, None, -0.0, 0.0),
]


def test_each_rules_edge_reads_back_as_made() -> None:
    assert_read_back_as_made(EDGES, {d.column: [None] * len(EDGES) for d in DERIVATIONS})


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(_COLUMN_COUNTS, _COLUMN_COUNTS, _COLUMN_COUNTS, _COLUMN_FLOATS, _COLUMN_FLOATS, _COLUMN_FLOATS),
        min_size=1,
        max_size=20,
    ),
    st.data(),
)
def test_where_a_bit_is_set_the_sql_rule_gives_back_the_value_the_arrow_rule_gave(
    rows: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    """The two forms of each rule over any inputs, NaN, infinities, -0.0 and counts past 2^53 among them, and
    any value the source sent instead."""
    size = st.lists(_COLUMN_FLOATS, min_size=len(rows), max_size=len(rows))
    assert_read_back_as_made(rows, {d.column: data.draw(size) for d in DERIVATIONS})


def test_the_migration_keeps_every_derived_value_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    storage = DuckDBStorage.open(path)
    whole = store_split(storage, request([span(attributes=VLLM), span(attributes={"x": 1})]).SerializeToString())
    assert read_back(storage) == decoded(whole)
    storage.close()
    con = open_database(path)
    migrate.downgrade(con, "0017")
    names = ", ".join(READ)
    # Below the newest revision a file holds tables only (no `spans` view): 0017's rows store every value.
    rows = con.execute(f"SELECT span_id, {names} FROM span_rows").fetchall()
    assert {r[0]: tuple(bits_of(v) for v in r[1:]) for r in rows} == decoded(whole)
    migrate.upgrade(con)
    rows = con.execute(f"SELECT span_id, {names} FROM spans").fetchall()
    assert {r[0]: tuple(bits_of(v) for v in r[1:]) for r in rows} == decoded(whole)
    # Rows stored before the migration keep their values in their columns, no bit set.
    assert con.execute("SELECT DISTINCT columns_derived FROM span_rows").fetchall() == [(None,)]
    con.close()


def test_derivations_are_only_appended() -> None:
    assert tuple(d.column for d in DERIVATIONS[: len(FIRST)]) == FIRST


def test_each_derived_column_is_one_normalization_fills_and_reads_only_columns() -> None:
    for d in DERIVATIONS:
        assert d.column in LLM_FIELDS and all(name in LLM_FIELDS for name in d.inputs)


def test_the_migrated_view_reads_each_derived_column_through_the_current_rule(tmp_path: Path) -> None:
    """An entry added to DERIVATIONS without its rule in the `spans` view (storage/request_model/duckdb) would
    be stored NULL and never derived again: the migrated view must read each column through `read_sql`."""
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con)
    for i, d in enumerate(DERIVATIONS):
        con.execute(f"CREATE VIEW probe_{i} AS SELECT {read_sql(d)} AS {d.column} FROM span_rows")
    views = dict(con.execute("SELECT view_name, sql FROM duckdb_views() WHERE internal = false").fetchall())
    con.close()
    # DuckDB writes a view back in its own words: compare the expressions as it wrote them.
    for i, d in enumerate(DERIVATIONS):
        probe = views[f"probe_{i}"].removeprefix(f"CREATE VIEW probe_{i} AS SELECT ")
        expression = probe.removesuffix(" FROM span_rows;")
        assert expression.endswith(f" AS {d.column}") and expression in views["spans"]


def test_the_spans_export_carries_derived_values_and_no_storage_column(storage: DuckDBStorage) -> None:
    whole = store_split(storage, request([span(attributes=VLLM)]).SerializeToString())
    query = DATASET_SQL["spans"].replace("$since", "'-infinity'::TIMESTAMP").replace("$until", "'infinity'::TIMESTAMP")
    names = [name for (name,) in storage.reader.rows(f"SELECT column_name FROM (DESCRIBE {query})")]
    assert not set(names) & set(STORED_ONLY)
    [row] = storage.reader.rows(f"SELECT tpot_ms, cache_hit_ratio FROM ({query})")
    assert row == (whole["tpot_ms"][0].as_py(), whole["cache_hit_ratio"][0].as_py()) and None not in row
