"""`spans.attributes` stored without what canonical columns hold (storage.attributes: split, done in the
decoder): every attribute reads back as it was sent, whatever its type, whichever key won its column,
through the real decoders, writer and migrations; stored whole (the default) nothing is moved."""

from __future__ import annotations

import json
import math
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from builders import request, span
from conftest import RunningService, service_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from receivers import NATIVE_INSTALL, require_or_skip
from waiting import HANG_GUARD, WriterHold

from collector import native_walk
from collector.decode import Decoder, Encoding, decode_traces
from collector.normalize import NormalizeConfig, build_plan
from collector.scores import SCORE_HINT
from model.attribute_split import MOVES, gathered_keys
from storage.duckdb import migrate
from storage.duckdb.backend import DuckDBStorage
from storage.duckdb.database import open_database
from storage.duckdb.stored_attributes import insert_spans_sql, rebuild_sql

# MOVES as first given: a stored bit names its entry forever, so these may never change (append only).
FIRST_53 = (
    "gen_ai.operation.name",
    "openinference.span.kind",
    "gen_ai.span.kind",
    "fi.span.kind",
    "traceloop.span.kind",
    "llm.request.type",
    "gen_ai.provider.name",
    "gen_ai.system",
    "llm.provider",
    "llm.system",
    "gen_ai.response.model",
    "llm.response.model_name",
    "llm.model_name",
    "langfuse.observation.model.name",
    "gen_ai.request.model",
    "llm.request.model_name",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.token_count.prompt",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
    "gen_ai.usage.cache_read.input_tokens",
    "llm.token_count.prompt_details.cache_read",
    "gen_ai.usage.cached_tokens",
    "gen_ai.usage.input_tokens.cache_read",
    "gen_ai.usage.cache_read_input_tokens",
    "gen_ai.usage.cache_read_tokens",
    "llm.token_count.prompt_details.cache_input",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.server.time_to_first_token",
    "gen_ai.server.time_per_output_token",
    "gen_ai.latency.time_in_queue",
    "gen_ai.server.queue_time",
    "gen_ai.latency.time_in_model_prefill",
    "gen_ai.latency.time_in_model_decode",
    "gen_ai.latency.e2e",
    "llm.finish_reason",
    "gen_ai.response.finish_reason",
    "llm.response.finish_reason",
    "cluster.queue_depth",
    "vllm.num_requests_waiting",
    "cluster.replica_count",
    "llm.vllm.batch_size",
    "llm.vllm.prefill_in_batch",
    "llm.vllm.quantization",
    "quantization",
    "llm.vllm.cache_hit_ratio",
    "tenant.id",
    "tenant_id",
    "replica_id",
    "deployment",
)


def typed(value: Any) -> Any:
    """A parsed JSON value with its kinds kept apart: 2 and 2.0 (and True and 1, and 0.0 and -0.0) differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, repr(value) if isinstance(value, float) else value)


def stored_attributes(storage: DuckDBStorage) -> dict[str, Any]:
    rows = storage.reader.rows("SELECT span_id, attributes FROM spans")
    return {span_id: typed(json.loads(text)) for span_id, text in rows}


def store(storage: DuckDBStorage, payload: bytes, decoder: Decoder | None = None) -> pa.Table:
    """Store the request's spans split by `decoder`; returns them decoded whole, the attributes as sent."""
    decoded = decode_traces(payload, Encoding.PROTOBUF, decoder=decoder, split_attributes=True)
    assert decoded.spans is not None
    future = storage.sink.try_submit(decoded.spans)
    assert future is not None and future.result(timeout=HANG_GUARD).inserted == decoded.spans.num_rows
    whole = decode_traces(payload, Encoding.PROTOBUF, decoder=decoder).spans
    assert whole is not None
    return whole


def sent(batch: pa.Table) -> dict[str, Any]:
    pairs = zip(batch["span_id"].to_pylist(), batch["attributes"].to_pylist(), strict=True)
    return {span_id: typed(json.loads(text)) for span_id, text in pairs}


@pytest.fixture
def storage(tmp_path: Path) -> Any:
    opened = DuckDBStorage.open(tmp_path / "attributes.duckdb")
    yield opened
    opened.close()


VLLM = {
    "gen_ai.request.id": "chatcmpl-1f2e",
    "gen_ai.request.model": "meta-llama/Llama-3.1-8B-Instruct",
    "gen_ai.usage.prompt_tokens": 812,
    "gen_ai.usage.completion_tokens": 97,
    "gen_ai.latency.time_to_first_token": 0.0731,
    "gen_ai.latency.e2e": 1.9031,
    "gen_ai.latency.time_in_queue": 0.005,
    "gen_ai.request.temperature": 0.7,
    "cluster.queue_depth": 12,
    "llm.vllm.batch_size": 31,
}


def test_a_vllm_spans_duplicated_attributes_are_stored_once_and_read_back_as_sent(storage: DuckDBStorage) -> None:
    batch = store(storage, request([span(attributes=VLLM)]).SerializeToString())
    assert stored_attributes(storage) == sent(batch)
    [(rest, moved)] = storage.reader.rows("SELECT attributes_rest::VARCHAR, attributes_moved FROM spans")
    assert json.loads(rest) == {"gen_ai.request.id": "chatcmpl-1f2e", "gen_ai.request.temperature": 0.7}
    assert moved == sum(1 << i for i, m in enumerate(MOVES) if m.key in VLLM)
    # What analysts write keeps its answers: a moved value, a kept one, a typed read.
    [row] = storage.reader.rows(
        "SELECT attributes->>'gen_ai.latency.e2e', attributes->>'gen_ai.request.id', "
        "(attributes->>'gen_ai.usage.prompt_tokens')::BIGINT, json_keys(attributes) FROM spans"
    )
    assert row[:3] == ("1.9031", "chatcmpl-1f2e", 812) and sorted(row[3]) == sorted(VLLM)


def test_a_batch_decoded_whole_is_stored_as_sent_with_nothing_moved(storage: DuckDBStorage) -> None:
    decoded = decode_traces(request([span(attributes=VLLM)]).SerializeToString(), Encoding.PROTOBUF)
    assert decoded.spans is not None and "attributes_moved" not in decoded.spans.column_names
    future = storage.sink.try_submit(decoded.spans)
    assert future is not None and future.result(timeout=HANG_GUARD).inserted == 1
    [(attributes, rest, moved)] = storage.reader.rows(
        "SELECT attributes::VARCHAR, attributes_rest::VARCHAR, attributes_moved FROM spans"
    )
    assert attributes == rest == decoded.spans["attributes"][0].as_py() and moved == 0


@pytest.mark.parametrize("setting", ["whole", "split", None])
def test_the_service_decodes_spans_in_the_form_storage_attributes_names(tmp_path: Path, setting: str | None) -> None:
    """Through the real receiver and pipeline: whole stores the text sent with no bit set; split (the default)
    stores less and reads back the same."""
    overrides = {} if setting is None else {"storage": {"attributes": setting}}
    payload = request([span(attributes=VLLM)]).SerializeToString()
    with RunningService(service_settings(tmp_path / "svc.duckdb", **overrides)) as svc:
        sent_as = urllib.request.Request(
            f"{svc.http_url}/v1/traces", data=payload, headers={"Content-Type": "application/x-protobuf"}
        )
        with urllib.request.urlopen(sent_as, timeout=HANG_GUARD) as answer:
            assert answer.status == 200
        [(attributes, rest, moved)] = svc.rows(
            "SELECT attributes::VARCHAR, attributes_rest::VARCHAR, attributes_moved FROM spans"
        )
    whole = decode_traces(payload, Encoding.PROTOBUF).spans
    assert whole is not None
    assert typed(json.loads(attributes)) == typed(json.loads(whole["attributes"][0].as_py()))
    if setting == "whole":
        assert attributes == rest == whole["attributes"][0].as_py() and moved == 0
    else:
        assert moved != 0 and len(rest) < len(attributes)


def test_a_value_its_column_does_not_reproduce_stays_as_sent(storage: DuckDBStorage) -> None:
    """A latency sent as an integer (the column holds 2000.0), the key that lost to a higher-priority one,
    text the column trimmed or lower-cased, a count sent as text, a key sent without a value, and -0.0 where
    the column holds 0.0 (equal as numbers, not as JSON): each is kept in the rest."""
    attributes = {
        "gen_ai.latency.e2e": 2,
        "gen_ai.latency.time_in_queue": None,
        "llm.vllm.cache_hit_ratio": -0.0,
        "gen_ai.usage.input_tokens": 40,
        "gen_ai.usage.prompt_tokens": 41,
        "gen_ai.request.model": "llama ",
        "gen_ai.system": "OpenAI",
        "cluster.queue_depth": "7",
    }
    batch = store(storage, request([span(attributes=attributes)]).SerializeToString())
    assert stored_attributes(storage) == sent(batch)
    [(rest, moved)] = storage.reader.rows("SELECT attributes_rest::VARCHAR, attributes_moved FROM spans")
    assert set(json.loads(rest)) == set(attributes) - {"gen_ai.usage.input_tokens"}
    assert moved == 1 << [m.key for m in MOVES].index("gen_ai.usage.input_tokens")


def vllm_latencies(queued: float, waited: float, prefill: float, decode: float) -> dict[str, float]:
    """The engine-side latencies as vLLM computes them: differences of one monotonic clock's readings."""
    scheduled = queued + waited
    first = scheduled + prefill
    last = first + decode
    return {
        "gen_ai.latency.time_in_queue": scheduled - queued,
        "gen_ai.latency.time_in_model_prefill": first - scheduled,
        "gen_ai.latency.time_in_model_decode": last - first,
        "gen_ai.latency.time_in_model_inference": last - scheduled,
    }


INFERENCE = "gen_ai.latency.time_in_model_inference"


@pytest.mark.parametrize("decoder", list(Decoder))
def test_vllms_inference_time_is_stored_as_its_prefill_plus_decode_and_read_back_as_sent(
    storage: DuckDBStorage, decoder: Decoder
) -> None:
    if decoder is Decoder.NATIVE and not native_walk.AVAILABLE:
        require_or_skip("the compiled decoder (tailwatch_native) is not installed", NATIVE_INSTALL)
    sums = [vllm_latencies(86_400.0 + i * 0.731, 0.004 * i, 0.171 + i / 7, 2.226 * i + 0.01) for i in range(8)]
    # Sent as something else (the prefill plus the whole decode of another clock): kept as sent.
    off = {**sums[0], INFERENCE: sums[0][INFERENCE] + 1e-9}
    batch = store(storage, request([span(attributes=a) for a in [*sums, off]]).SerializeToString(), decoder)
    assert stored_attributes(storage) == sent(batch)
    rows = storage.reader.rows(
        f"SELECT attributes_rest->>'{INFERENCE}', attributes->>'{INFERENCE}' FROM spans ORDER BY start_time"
    )
    kept = [rest for rest, _ in rows if rest is not None]
    assert kept == [repr(off[INFERENCE])], kept
    # An analyst's typed read of it is the value sent, moved or not.
    read = storage.reader.rows(f"SELECT (attributes->>'{INFERENCE}')::DOUBLE FROM spans")
    assert sorted(v for (v,) in read) == sorted(a[INFERENCE] for a in [*sums, off])


def test_the_inference_time_migration_writes_it_back_on_the_way_down(tmp_path: Path) -> None:
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con)
    attributes = {**VLLM, **vllm_latencies(123_456.789, 0.002, 0.25, 3.5)}
    batch = decode_traces(request([span(attributes=attributes)]).SerializeToString(), Encoding.PROTOBUF,
                          split_attributes=True).spans  # fmt: skip
    whole = decode_traces(request([span(attributes=attributes)]).SerializeToString(), Encoding.PROTOBUF).spans
    assert batch is not None and whole is not None
    con.register("batch", batch)
    con.execute(insert_spans_sql("batch", tuple(batch.column_names)), [datetime(2026, 11, 25)])
    bit = 1 << [m.key for m in MOVES].index(INFERENCE)

    def read(spans: str = "spans") -> tuple[Any, str | None, bool]:
        [(text, rest, moved)] = con.execute(
            f"SELECT attributes::VARCHAR, attributes_rest->>'{INFERENCE}', attributes_moved & {bit} <> 0 FROM {spans}"
        ).fetchall()
        return typed(json.loads(text)), rest, moved

    assert read() == (sent(whole)[whole["span_id"][0].as_py()], None, True)
    migrate.downgrade(con, "0018")
    # Below the newest revision a file holds tables only (no `spans` view): the stored rows, their attributes
    # read back by the rule, which writes the inference time back only where its bit is still set.
    stored = f"(SELECT {rebuild_sql()} AS attributes, attributes_rest, attributes_moved FROM span_rows)"
    assert read(stored) == (sent(whole)[whole["span_id"][0].as_py()], repr(attributes[INFERENCE]), False)
    migrate.upgrade(con)
    assert read()[0] == sent(whole)[whole["span_id"][0].as_py()]
    con.close()


_EDGE_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-7, 5e-324, 1e15, 1e16, 4.4905636302700855e19, 0.1, 1.5, 2.0]),
)
_VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    _EDGE_FLOATS,
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["stop", "chat", "fp8", " Chat", "llama", '["stop"]']),
    st.lists(st.integers(min_value=0, max_value=9), max_size=3),
)
_KEYS = st.sampled_from([m.key for m in MOVES] + ["gen_ai.request.id", "custom.flag", "gen_ai.request.top_p"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.dictionaries(_KEYS, _VALUES, max_size=12), min_size=1, max_size=6), st.sampled_from(list(Decoder)))
def test_every_attribute_of_any_span_reads_back_with_its_kind_and_value(
    storage: DuckDBStorage, spans: list[dict[str, Any]], decoder: Decoder
) -> None:
    if decoder is Decoder.NATIVE and not native_walk.AVAILABLE:
        decoder = Decoder.PYTHON  # tests/test_native_decoder.py holds the two walks' split equal where both exist
    storage.writer.submit(lambda con: con.execute("DELETE FROM span_rows")).result(timeout=HANG_GUARD)
    batch = store(storage, request([span(attributes=a) for a in spans]).SerializeToString(), decoder)
    got, want = stored_attributes(storage), sent(batch)
    assert got == want, {k: (got[k], want[k]) for k in want if got.get(k) != want[k]}


def test_a_batch_split_and_one_whole_commit_together(storage: DuckDBStorage) -> None:
    """The writer takes both forms in one group: a whole batch (another sink's caller, say) is stored with no
    bit set."""
    split = decode_traces(request([span(attributes=VLLM)]).SerializeToString(), Encoding.PROTOBUF,
                          split_attributes=True).spans  # fmt: skip
    other = {**VLLM, "gen_ai.request.id": "other"}
    whole = decode_traces(request([span(attributes=other)]).SerializeToString(), Encoding.PROTOBUF).spans
    assert split is not None and whole is not None
    with WriterHold(storage.writer):  # both queued before the writer takes either: one group
        futures = [storage.sink.try_submit(split), storage.sink.try_submit(whole)]
    assert all(f is not None and f.result(timeout=HANG_GUARD).inserted == 1 for f in futures)
    rows = storage.reader.rows("SELECT attributes->>'gen_ai.request.id', attributes_moved <> 0 FROM spans ORDER BY 1")
    assert rows == [("chatcmpl-1f2e", True), ("other", False)]


def test_the_migration_keeps_stored_attributes_whole_both_ways(tmp_path: Path) -> None:
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con, "0015")
    batch = decode_traces(request([span(attributes=VLLM), span(attributes={"x": 1})]).SerializeToString(),
                          Encoding.PROTOBUF).spans  # fmt: skip
    assert batch is not None
    columns = ", ".join(batch.column_names)
    con.register("batch", batch)
    con.execute(f"INSERT INTO spans ({columns}, ingested_at) SELECT {columns}, now() FROM batch")

    def attributes() -> dict[str, Any]:
        rows = con.execute("SELECT span_id, attributes::VARCHAR FROM spans").fetchall()
        return {s: typed(json.loads(a)) for s, a in rows}

    assert attributes() == sent(batch)
    migrate.upgrade(con)
    assert attributes() == sent(batch)
    assert con.execute("SELECT DISTINCT attributes_moved FROM spans").fetchall() == [(0,)]
    migrate.downgrade(con, "0015")
    assert attributes() == sent(batch)
    con.close()


def test_the_stored_rebuild_is_the_one_the_writer_strips_for(tmp_path: Path) -> None:
    """An entry added to MOVES without its pair in the `spans` view (storage/request_model/duckdb) would be
    stripped by the writer and never written back: the migrated definition must be the current rebuild."""
    con = open_database(tmp_path / "m.duckdb")
    migrate.upgrade(con)
    con.execute(f"CREATE VIEW probe AS SELECT {rebuild_sql()} AS attributes FROM span_rows")
    named = "SELECT view_name, sql FROM duckdb_views() WHERE view_name IN ('spans', 'probe')"
    views = dict(con.execute(named).fetchall())
    con.close()
    # DuckDB writes a view back in its own words: compare the expressions as it wrote them.
    migrated = views["spans"].split("finish_reason, ", 1)[1].split(" AS attributes, ", 1)[0]
    assert migrated == views["probe"].split("SELECT ", 1)[1].split(" AS attributes FROM ", 1)[0]


def test_moves_are_only_appended() -> None:
    assert tuple(m.key for m in MOVES[: len(FIRST_53)]) == FIRST_53
    assert len({m.key for m in MOVES}) == len(MOVES)


def test_no_moved_key_is_one_scores_are_read_from() -> None:
    """Scores are found in the JSON a split decode stores (collector/decode.py): no score key may be left out."""
    assert not any(SCORE_HINT.search(f'"{m.key}"'.encode()) for m in MOVES)


def test_each_moved_key_is_a_source_normalization_fills_its_column_from() -> None:
    """A move of one column is one of that column's sources; a sum of two is no column's, and a walk that
    splits gathers it all the same."""
    plan = build_plan(NormalizeConfig())
    every = {s.key for sources in plan.sources.values() for s in sources if s.scope == "span"}
    for move in MOVES:
        sources = {s.key for s in plan.sources[move.column] if s.scope == "span"}
        if move.plus is None:
            assert move.key in sources, f"{move.key} does not fill {move.column}"
        else:
            assert move.key not in every and move.key in gathered_keys(plan.walk_span_keys)
    assert all(math.log10(m.per) in (0, 3) for m in MOVES)
