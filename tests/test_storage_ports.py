"""The storage ports' conformance suite: what any backend must do, parametrized over the backends.

Spans go in through the `SpanSink` port and everything is read back through the other ports, so a
new backend (a package implementing `storage.ports`) is added to BACKENDS and must pass unchanged:
the same frames for the same stored spans, the same figures, atomic persistence of an evaluation,
and the firing state round trip.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from clickhouse_stores import OPENERS
from polars.testing import assert_frame_equal
from prometheus_client import CollectorRegistry
from waiting import HANG_GUARD

from detectors.alerts import fingerprint
from detectors.detection import DetectionPass, DetectorMetrics
from detectors.incidents import Config as IncidentsConfig
from detectors.incidents import IncidentPass
from detectors.registry import get
from model.columns import SCORE_BATCH_SCHEMA, SPAN_BATCH_SCHEMA
from storage.duckdb.backend import DuckDBStorage
from storage.ports import (
    Aggregate,
    Alert,
    Breached,
    EvaluationRecord,
    FiringAlerts,
    FrameBudget,
    FrameTooLarge,
    Incident,
    Measure,
    Requests,
    RequestSummary,
    RunRecord,
    Scores,
    Storage,
    Window,
)
from tailwatch.compose import detection_pass
from tailwatch.settings import load_settings

BACKENDS: dict[str, Callable[[Path], Storage]] = {
    "duckdb": lambda directory: DuckDBStorage.open(directory / "ports.duckdb"),
    # ClickHouse in-process through chDB (the same client class that talks to a server), and a real server
    # when TAILWATCH_TEST_CLICKHOUSE_URL names one.
    **{name: (lambda directory, o=opener: o(directory.name)) for name, opener in OPENERS.items()},
}

T0 = datetime(2026, 11, 20, 12, 0)
WINDOW = Window(T0 + timedelta(minutes=5), T0 + timedelta(minutes=10))
MODELS = ("llama", "qwen")
TENANTS = ("acme", "globex", "initech")


def stored_requests(n: int = 450) -> list[dict[str, Any]]:
    """Fifteen minutes of single-span server requests, evenly spread (one every 2 s by default), with seeded
    figures."""
    rng = random.Random(11)
    rows = []
    for i in range(n):
        end = T0 + timedelta(seconds=900 * i / n + 1)
        e2e = rng.uniform(200, 4000)
        rows.append(
            {
                "trace_id": f"{i:032x}", "span_id": f"{i + 1:016x}", "name": "llm_request", "kind": "SERVER",
                "start_time": end - timedelta(milliseconds=e2e), "end_time": end, "duration_ms": e2e,
                "status_code": "ERROR" if i % 37 == 0 else "OK", "is_llm": True, "llm_role": "server",
                "model": MODELS[i % 2], "deployment": "vllm-a", "tenant_id": TENANTS[i % 3],
                "replica_id": f"r{i % 4}", "input_tokens": rng.randint(50, 9000), "output_tokens": rng.randint(2, 900),
                "e2e_ms": e2e, "ttft_ms": rng.uniform(50, 400), "tpot_ms": None if i % 10 == 0 else rng.uniform(8, 40),
                "queue_ms": rng.uniform(0, 50), "cache_hit_ratio": rng.random(), "queue_depth": rng.randint(0, 30),
                "replica_count": 4, "prefill_tokens_in_batch": rng.randint(0, 8000),
                "quantization": "int4" if i % 4 == 3 else "fp16",
            }
        )  # fmt: skip
    return rows


def stored_scores(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rng = random.Random(12)
    return [
        {
            "trace_id": r["trace_id"],
            "span_id": r["span_id"],
            "name": name,
            "score": rng.uniform(0.5, 1.0),
            "source": "attribute",
            "observed_at": r["end_time"],
        }
        for r in requests[::3]
        for name in ("json_adherence", "groundedness")
    ]


REQUESTS = stored_requests()
SCORES = stored_scores(REQUESTS)


def fill(store: Storage) -> None:
    spans = pa.Table.from_pylist(REQUESTS, schema=SPAN_BATCH_SCHEMA)
    scores = pa.Table.from_pylist(SCORES, schema=SCORE_BATCH_SCHEMA)
    future = store.sink.try_submit(spans, scores)
    assert future is not None
    result = future.result(timeout=HANG_GUARD)
    assert (result.inserted, result.duplicates) == (len(REQUESTS), 0)


@pytest.fixture(params=sorted(BACKENDS), scope="module")
def storage(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Storage]:
    store = BACKENDS[request.param](tmp_path_factory.mktemp(request.param))
    fill(store)
    yield store
    store.close()


def truth(window: Window) -> pl.DataFrame:
    """The requests that ended inside the window, from the rows sent."""
    frame = pl.DataFrame(REQUESTS, infer_schema_length=None)
    return frame.filter((pl.col("end_time") >= window.start) & (pl.col("end_time") < window.end)).sort("trace_id")


def frame(table: pa.Table) -> pl.DataFrame:
    out = pl.from_arrow(table)
    assert isinstance(out, pl.DataFrame)
    return out


def test_a_requests_read_returns_the_requests_that_ended_in_the_window_with_the_declared_columns(
    storage: Storage,
) -> None:
    columns = ("model", "tenant_id", "e2e_ms", "tpot_ms", "queue_depth")
    read = frame(Requests(WINDOW, columns, ids=True).fetch(storage.windows)).sort("trace_id")
    assert read.columns == ["request_key", "trace_id", "span_id", *columns]
    expected = truth(WINDOW).select("trace_id", "span_id", *columns)
    assert_frame_equal(read.drop("request_key"), expected, check_dtypes=False)
    assert read["request_key"].n_unique() == read.height

    keys_only = frame(Requests(WINDOW, columns).fetch(storage.windows))
    assert keys_only.columns == ["request_key", *columns]
    assert sorted(keys_only["request_key"]) == sorted(read["request_key"])

    required = frame(Requests(WINDOW, columns, require=("tpot_ms",)).fetch(storage.windows))
    assert required.height == expected["tpot_ms"].is_not_null().sum() < expected.height


def test_a_read_of_where_an_engine_column_came_from_says_span_for_the_span_s_own_values(storage: Storage) -> None:
    columns = ("queue_depth_source", "replica_count_source", "cache_hit_ratio_source")
    read = frame(Requests(WINDOW, ("queue_depth", *columns), ids=True).fetch(storage.windows)).sort("trace_id")
    expected = truth(WINDOW).select("trace_id", "queue_depth", "replica_count", "cache_hit_ratio")
    for column in columns:
        base = column.removesuffix("_source")
        spans = expected[base].is_not_null()
        assert read[column].to_list() == ["span" if own else None for own in spans], column
    assert read["queue_depth_source"].drop_nulls().len() > 0


def in_order(table: pa.Table) -> pl.DataFrame:
    """A read's rows in one order: a read promises none."""
    read = frame(table)
    return read.sort(read.columns, nulls_last=True)


def test_a_budgeted_read_charges_what_it_returns_and_stops_when_the_window_holds_more(storage: Storage) -> None:
    reads = (Requests(WINDOW, ("model", "e2e_ms"), ids=True), Requests(WINDOW, ("model",), categorical=True))
    for read in (*reads, Scores(WINDOW)):
        whole = read.fetch(storage.windows)
        budget = FrameBudget(whole.nbytes)
        assert in_order(read.fetch(storage.windows, budget)).equals(in_order(whole))
        assert budget.used == whole.nbytes  # what the pass counts is what it holds
        with pytest.raises(FrameTooLarge, match=r"storage\.detection_memory_mb"):
            read.fetch(storage.windows, FrameBudget(whole.nbytes - 1))


def test_every_read_gives_a_request_the_same_key(storage: Storage) -> None:
    requests = frame(Requests(WINDOW, (), ids=True).fetch(storage.windows))
    scores = frame(Scores(WINDOW, ids=True).fetch(storage.windows))
    assert scores.columns == ["trace_id", "span_id", "request_key", "name", "score"]
    joined = scores.join(requests, on="request_key", suffix="_request")
    assert joined.height == scores.height > 0
    assert (joined["trace_id"] == joined["trace_id_request"]).all()
    assert (joined["span_id"] == joined["span_id_request"]).all()
    assert frame(Scores(WINDOW).fetch(storage.windows)).columns == ["request_key", "name", "score"]


def test_a_request_summary_equals_its_measures_computed_from_the_requests(storage: Storage) -> None:
    summary = RequestSummary(
        WINDOW,
        grouping_sets=(("model",), ("model", "tenant_id")),
        measures=(
            Measure("n", Aggregate.COUNT),
            Measure("p99", Aggregate.QUANTILE, "tpot_ms", 0.99),
            Measure("cache", Aggregate.MEAN, "cache_hit_ratio"),
        ),
        require=("tpot_ms",),
    )
    got = frame(summary.fetch(storage.windows))
    assert got.columns == ["model", "tenant_id", "grouping_set", "n", "p99", "cache"]
    rows = truth(WINDOW).filter(pl.col("tpot_ms").is_not_null())
    for index, keys in enumerate(summary.grouping_sets):
        expected = rows.group_by(list(keys)).agg(
            pl.len().alias("n"),
            pl.col("tpot_ms").quantile(0.99, "linear").alias("p99"),
            pl.col("cache_hit_ratio").mean().alias("cache"),
        )
        part = got.filter(pl.col("grouping_set") == index).select(*keys, "n", "p99", "cache")
        assert_frame_equal(part.sort(list(keys)), expected.sort(list(keys)), check_dtypes=False, rel_tol=1e-12)
        if "tenant_id" not in keys:
            assert got.filter(pl.col("grouping_set") == index)["tenant_id"].is_null().all()


def breached_windows(store: Storage, rows: list[tuple[int, int, str, str, str | None, bool]]) -> None:
    """token_latency figures: (start minute, end minute, model, deployment, tenant_id or None, breached), each
    window persisted as its own evaluation."""
    for start, end, model, deployment, tenant, breached in rows:
        window = Window(T0 + timedelta(minutes=start), T0 + timedelta(minutes=end))
        figures = pl.DataFrame(
            [{"window_start": window.start, "window_end": window.end, "model": model, "deployment": deployment,
              "tenant_id": tenant, "grouping": "model" if tenant is None else "tenant", "n": 100,
              "breached": breached}]
        )  # fmt: skip
        run = RunRecord("token_latency", window.end, window, "ok", 0.1, rows=1, conditions=int(breached))
        store.detector_store.persist(EvaluationRecord(run, {"token_latency": figures}))


@pytest.mark.parametrize("engine", [False, True])
def test_a_summary_leaves_out_each_groups_requests_in_the_windows_it_breached(empty: Storage, engine: bool) -> None:
    fill(empty)
    breached_windows(
        empty,
        [
            (5, 7, "llama", "vllm-a", None, True),  # a model's breach: every tenant's requests of it
            (7, 9, "llama", "vllm-a", None, True),  # contiguous with the one before: one range
            (1, 3, "qwen", "vllm-a", "acme", True),  # a tenant's: that tenant's alone
            (10, 12, "qwen", "vllm-a", None, False),  # evaluated, not breached: stays in
            (12, 14, "llama", "vllm-b", None, True),  # another deployment's: not vllm-a's
        ],
    )
    measures = (Measure("n", Aggregate.COUNT), Measure("p99", Aggregate.QUANTILE, "tpot_ms", 0.99))
    if engine:  # an engine column: on ClickHouse the summary is computed in a loaded evaluation
        measures += (Measure("kv", Aggregate.MEAN, "kv_cache_usage"),)
    summary = RequestSummary(
        Window(T0, T0 + timedelta(minutes=15)),
        grouping_sets=(("model", "deployment"), ("model", "deployment", "tenant_id")),
        measures=measures,
        require=("tpot_ms",),
        leave_out=Breached("token_latency", keys=("model", "deployment"), optional=("tenant_id",)),
    )
    got = frame(summary.fetch(empty.windows))
    minute = (pl.col("end_time") - pl.lit(T0)).dt.total_seconds() / 60
    kept = truth(summary.window).filter(
        pl.col("tpot_ms").is_not_null()
        & ~((pl.col("model") == "llama") & (minute >= 5) & (minute < 9))
        & ~((pl.col("model") == "qwen") & (pl.col("tenant_id") == "acme") & (minute >= 1) & (minute < 3))
    )
    assert kept.height < truth(summary.window).filter(pl.col("tpot_ms").is_not_null()).height - 40
    for index, keys in enumerate(summary.grouping_sets):
        expected = kept.group_by(list(keys)).agg(
            pl.len().alias("n"), pl.col("tpot_ms").quantile(0.99, "linear").alias("p99")
        )
        part = got.filter(pl.col("grouping_set") == index).select(*keys, "n", "p99")
        assert_frame_equal(part.sort(list(keys)), expected.sort(list(keys)), check_dtypes=False, rel_tol=1e-12)


@pytest.mark.parametrize(
    "key", ["cache_curve", "tenant_fairness", "replica_skew", "saturation", "quantization_delta", "context_length"]
)
def test_a_detector_gives_the_same_figures_from_stored_spans_as_from_the_rows_sent(storage: Storage, key: str) -> None:
    spec = get(key)
    config = spec.config(min_samples=5) if "min_samples" in spec.config.model_fields else spec.config()
    window = Window(T0, T0 + timedelta(minutes=15))
    fetched = {name: frame(read.fetch(storage.windows)) for name, read in spec.inputs(config, window).items()}
    sent = truth(window)
    by_hand = {
        "requests": sent.select("trace_id", "span_id", *fetched["requests"].drop("request_key").columns),
        "scores": pl.DataFrame(SCORES).select("trace_id", "span_id", "name", "score"),
    }
    ours, theirs = spec.detect(fetched, config, window), spec.detect(by_hand, config, window)
    columns = ours.figures.columns
    assert ours.figures.height > 0
    assert_frame_equal(
        ours.figures.sort(columns, nulls_last=True),
        theirs.figures.select(columns).sort(columns, nulls_last=True),
        check_dtypes=False,
        rel_tol=1e-12,
    )
    assert [c.labels for c in ours.conditions] == [c.labels for c in theirs.conditions]


def alert(key: str, labels: dict[str, str], at: datetime, **changes: Any) -> Alert:
    fp = fingerprint(key, labels)
    base = Alert(
        alert_id=f"{fp}-{at:%H%M}", detector=key, fingerprint=fp, severity="warning", state="firing", labels=labels,
        summary=f"{labels} breached", value=2.5, threshold=2.0, window_start=WINDOW.start, window_end=WINDOW.end,
        started_at=at, resolved_at=None, updated_at=at,
    )  # fmt: skip
    return replace(base, **changes)


def figures_for(key: str, storage: Storage) -> pl.DataFrame:
    """The detector's figures over the window of an empty store: typed like the real ones."""
    spec = get(key)
    config = spec.config()
    frames = {name: frame(read.fetch(storage.windows)) for name, read in spec.inputs(config, WINDOW).items()}
    return spec.detect(frames, config, WINDOW).figures


def evaluation(key: str, at: datetime, figures: dict[str, pl.DataFrame], **fields: Any) -> EvaluationRecord:
    run = RunRecord(key, at, WINDOW, "ok", 0.25, rows=sum(f.height for f in figures.values()), conditions=0)
    return EvaluationRecord(run, figures, **fields)


def count(storage: Storage, sql: str) -> int:
    value = storage.analyst.run(sql).table.column(0)[0].as_py()
    assert isinstance(value, int)
    return value


@pytest.fixture(params=sorted(BACKENDS))
def empty(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Storage]:
    store = BACKENDS[request.param](tmp_path)
    yield store
    store.close()


def test_the_firing_state_round_trips_and_a_resolved_alert_leaves_it(empty: Storage) -> None:
    key, at = "replica_skew", T0 + timedelta(minutes=11)
    a = alert(key, {"replica_id": "r3", "signal": "json_adherence"}, at)
    b = alert(key, {"replica_id": "r1", "signal": "latency_p99"}, at, severity="critical", value=None)
    figures = {key: figures_for(key, empty)}
    empty.detector_store.persist(evaluation(key, at, figures, fired=[a, b], breaches={a.fingerprint: 3, "fp-x": 1}))

    state = empty.detector_store.firing_state(key)
    assert state.firing == {a.fingerprint: a, b.fingerprint: b}
    assert state.breaches == {a.fingerprint: 3, "fp-x": 1}
    assert empty.detector_store.firing_state("cache_curve").firing == {}
    listed = frame(FiringAlerts().fetch(empty.windows))
    assert sorted(listed["detector"]) == [key, key]
    assert listed["started_at"].to_list() == [at, at]  # where clusters reads an alert's episode from

    later = at + timedelta(minutes=5)
    resolved = replace(a, state="resolved", resolved_at=later, updated_at=later)
    refreshed = replace(b, summary="still breached", value=3.5, updated_at=later)
    empty.detector_store.persist(
        evaluation(key, later, figures, changed=[resolved, refreshed], breaches={b.fingerprint: 4})
    )
    state = empty.detector_store.firing_state(key)
    assert state.firing == {b.fingerprint: refreshed}
    assert state.breaches == {b.fingerprint: 4}
    assert frame(empty.alert_queries.alerts(state="resolved"))["alert_id"].to_list() == [a.alert_id]


def test_persisting_an_evaluation_is_all_or_nothing(empty: Storage) -> None:
    key, at = "cache_curve", T0 + timedelta(minutes=11)
    first = alert(key, {"bucket": "low", "signal": "json_adherence"}, at)
    empty.detector_store.persist(evaluation(key, at, {key: figures_for(key, empty)}, fired=[first], breaches={"f": 1}))
    runs = count(empty, "SELECT count(*) FROM detector_runs")
    figure_rows = count(empty, f"SELECT count(*) FROM {key}")

    second = alert(key, {"bucket": "medium", "signal": "json_adherence"}, at)
    broken = pl.DataFrame({"window_start": [WINDOW.start], "no_such_column": [1]})
    with pytest.raises(Exception):  # noqa: B017 - each backend raises its own error type
        empty.detector_store.persist(
            evaluation(
                key, at, {key: figures_for(key, empty), "traffic_pattern": broken},
                fired=[second], changed=[replace(first, state="resolved", resolved_at=at)], breaches={"g": 1},
            )
        )  # fmt: skip
    state = empty.detector_store.firing_state(key)
    assert state.firing == {first.fingerprint: first}
    assert state.breaches == {"f": 1}
    assert count(empty, "SELECT count(*) FROM detector_runs") == runs
    assert count(empty, f"SELECT count(*) FROM {key}") == figure_rows


def sent_figures(key: str) -> pl.DataFrame:
    """The detector's figures for WINDOW from the rows sent, without a store."""
    spec = get(key)
    config = spec.config()
    requests = truth(WINDOW)
    scores = pl.DataFrame(SCORES).select("trace_id", "span_id", "name", "score")
    return spec.detect({"requests": requests, "scores": scores}, config, WINDOW).figures


def test_re_evaluating_a_window_replaces_its_figures_and_logs_each_run(empty: Storage) -> None:
    key, at = "context_length", T0 + timedelta(minutes=11)
    rows = sent_figures(key)
    assert rows.height > 0
    empty.detector_store.persist(evaluation(key, at, {key: rows}))
    once = count(empty, f"SELECT count(*) FROM {key}")
    assert once == rows.height
    # A replay of the very same evaluation (`tailwatch detect --at T` twice, two schedulers overlapping by one
    # job) writes the very same rows again: they replace the window's rows, none is taken for a retried insert.
    for _ in range(2):
        empty.detector_store.persist(evaluation(key, at, {key: rows}))
        assert count(empty, f"SELECT count(*) FROM {key}") == once
    empty.detector_store.persist(evaluation(key, at + timedelta(minutes=1), {key: rows}))
    assert count(empty, f"SELECT count(*) FROM {key}") == once
    empty.detector_store.log_run(RunRecord(key, at, WINDOW, "error", 0.1, error="RuntimeError: no"))
    assert count(empty, f"SELECT count(*) FROM detector_runs WHERE detector = '{key}'") == 5
    assert count(empty, "SELECT count(*) FROM detector_runs WHERE outcome = 'error'") == 1


def test_the_run_log_says_which_evaluations_happened_since_a_time_whatever_their_outcome(empty: Storage) -> None:
    key = "context_length"
    times = [T0 + timedelta(minutes=m) for m in (5, 10, 15)]
    for at, outcome in zip(times, ("ok", "error", "too_large"), strict=True):
        empty.detector_store.log_run(RunRecord(key, at, WINDOW, outcome, 0.1))
    empty.detector_store.log_run(RunRecord("replica_skew", times[2] + timedelta(minutes=5), WINDOW, "ok", 0.1))
    assert empty.detector_store.evaluated(key, times[1]) == set(times[1:])
    assert empty.detector_store.evaluated(key, T0) == set(times)
    assert empty.detector_store.evaluated("replica_skew", times[2] + timedelta(minutes=6)) == set()


def test_where_the_spans_begin_is_the_first_end_at_or_after_the_time_asked(storage: Storage) -> None:
    first = min(r["end_time"] for r in REQUESTS)
    assert storage.windows.first_span_end(T0) == first
    later = sorted(r["end_time"] for r in REQUESTS)[10]
    assert storage.windows.first_span_end(later) == later
    assert storage.windows.first_span_end(T0 + timedelta(days=1)) is None


def test_retention_deletes_exactly_the_spans_that_ended_before_the_cutoff(empty: Storage) -> None:
    future = empty.sink.try_submit(pa.Table.from_pylist(REQUESTS, schema=SPAN_BATCH_SCHEMA))
    assert future is not None
    future.result(timeout=HANG_GUARD)
    cutoff = T0 + timedelta(seconds=101)  # requests end at odd seconds: 1, 3, ..., 99 end before it
    assert empty.retention.delete_ended_before(cutoff) == 50
    assert count(empty, "SELECT count(*) FROM spans") == len(REQUESTS) - 50


def test_a_categorical_read_gives_the_same_values_with_text_as_categories_and_ids_as_text(storage: Storage) -> None:
    columns = ("model", "tenant_id", "status_code", "e2e_ms")
    plain = frame(Requests(WINDOW, columns, ids=True).fetch(storage.windows)).sort("request_key")
    encoded = frame(Requests(WINDOW, columns, ids=True, categorical=True).fetch(storage.windows)).sort("request_key")
    assert [encoded.schema[c] for c in ("model", "tenant_id", "status_code")] == [pl.Categorical()] * 3
    assert (encoded.schema["trace_id"], encoded.schema["e2e_ms"]) == (pl.String, pl.Float64)
    assert_frame_equal(encoded.with_columns(pl.col(pl.Categorical).cast(pl.String)), plain)


def test_a_requests_read_carries_the_traffic_pattern_stored_for_its_window(empty: Storage) -> None:
    future = empty.sink.try_submit(pa.Table.from_pylist(REQUESTS, schema=SPAN_BATCH_SCHEMA))
    assert future is not None
    future.result(timeout=HANG_GUARD)
    sent = truth(WINDOW).with_columns(arrival_second=pl.col("start_time").dt.truncate("1s"))
    # Label every other arrival second of the window's requests, and one the same second in another window.
    seconds = sent.select("deployment", "arrival_second", "replica_count").unique().sort("arrival_second")
    labelled = seconds[::2].with_columns(pattern=pl.lit("burst"))
    labels = labelled.with_columns(
        window_start=pl.lit(WINDOW.start), window_end=pl.lit(WINDOW.end), requests=pl.lit(1, pl.Int64),
        signal=pl.lit("arrival_rate"),
    )  # fmt: skip
    elsewhere = labels.head(1).with_columns(
        window_start=pl.lit(WINDOW.end), window_end=pl.lit(WINDOW.end + timedelta(minutes=5)), pattern=pl.lit("idle")
    )
    empty.detector_store.persist(
        evaluation(
            "traffic_pattern", T0 + timedelta(minutes=11), {"traffic_pattern_labels": pl.concat([labels, elsewhere])}
        )
    )
    got = frame(Requests(WINDOW, ("model",), ids=True, traffic_pattern=True).fetch(empty.windows))
    expected = sent.join(labelled, on=["deployment", "arrival_second", "replica_count"], how="left")
    assert dict(zip(got["trace_id"], got["traffic_pattern"], strict=True)) == dict(
        zip(expected["trace_id"], expected["pattern"], strict=True)
    )
    assert got["traffic_pattern"].null_count() > 0 and got["traffic_pattern"].drop_nulls().unique().to_list() == [
        "burst"
    ]


def test_a_categorical_duckdb_read_keeps_no_buffer_of_duckdb_s_batches(tmp_path: Path) -> None:
    # DuckDB frees a result batch only when none of its buffers is referenced: a frame that kept one
    # numeric column of it kept the text it was encoded from alive too (~600 MiB over a day of requests).
    store = DuckDBStorage.open(tmp_path / "one.duckdb")
    try:
        fill(store)
        pool = pa.system_memory_pool()
        before = pool.bytes_allocated()
        read = Requests(WINDOW, ("model", "tenant_id", "e2e_ms", "input_tokens"), ids=True, categorical=True)
        table = read.fetch(store.windows)
        assert table.num_rows > 0
        # Every buffer is Arrow's own (its allocator counts it), none a view into a DuckDB batch.
        assert pool.bytes_allocated() - before >= table.get_total_buffer_size()
    finally:
        store.close()


def test_a_categorical_read_of_an_empty_window_has_the_same_categorical_columns(storage: Storage) -> None:
    nothing = Window(T0 - timedelta(hours=2), T0 - timedelta(hours=1))
    empty_read = frame(Requests(nothing, ("model", "e2e_ms"), ids=True, categorical=True).fetch(storage.windows))
    assert empty_read.height == 0
    assert dict(empty_read.schema) == {
        "request_key": pl.UInt64, "trace_id": pl.String, "span_id": pl.String, "model": pl.Categorical(),
        "e2e_ms": pl.Float64,
    }  # fmt: skip


@pytest.mark.parametrize(
    "sets",
    [(("model",), ("tenant_id",), ()), (("tenant_id", "model"), ("model",)), ((),)],
    ids=["disjoint-and-total", "nested", "total-only"],
)
def test_every_grouping_set_of_a_summary_comes_back_under_its_own_index(
    storage: Storage, sets: tuple[tuple[str, ...], ...]
) -> None:
    summary = RequestSummary(WINDOW, grouping_sets=sets, measures=(Measure("n", Aggregate.COUNT),))
    got = frame(summary.fetch(storage.windows))
    rows = truth(WINDOW)
    for index, keys in enumerate(sets):
        part = got.filter(pl.col("grouping_set") == index)
        if keys:
            expected = rows.group_by(list(keys)).agg(pl.len().alias("n")).sort(list(keys))
            assert_frame_equal(part.select(*keys, "n").sort(list(keys)), expected, check_dtypes=False)
        else:
            assert part["n"].to_list() == [rows.height]
    assert got.height == sum(rows.select(list(k)).n_unique() if k else 1 for k in sets)


def test_a_summary_refuses_two_grouping_sets_of_the_same_columns(storage: Storage) -> None:
    twice = RequestSummary(WINDOW, (("model", "tenant_id"), ("tenant_id", "model")), (Measure("n", Aggregate.COUNT),))
    with pytest.raises(ValueError, match="each grouping set must group by different columns"):
        twice.fetch(storage.windows)


def test_alert_queries_filter_by_state_and_detector_newest_first_up_to_the_limit(empty: Storage) -> None:
    at = T0 + timedelta(minutes=11)
    skew = [
        alert("replica_skew", {"replica_id": f"r{i}", "signal": "latency_p99"}, at + timedelta(minutes=i))
        for i in range(3)
    ]
    cache = alert("cache_curve", {"bucket": "low", "signal": "json_adherence"}, at)
    empty.detector_store.persist(evaluation("replica_skew", at, {}, fired=skew))
    empty.detector_store.persist(evaluation("cache_curve", at, {}, fired=[cache]))
    later = at + timedelta(minutes=9)
    empty.detector_store.persist(
        evaluation(
            "replica_skew", later, {}, changed=[replace(skew[0], state="resolved", resolved_at=later, updated_at=later)]
        )
    )

    def ids(table: pa.Table) -> list[str]:
        return [str(v) for v in table.column("alert_id").to_pylist()]

    assert ids(empty.alert_queries.alerts()) == [skew[0].alert_id, skew[2].alert_id, skew[1].alert_id, cache.alert_id]
    assert ids(empty.alert_queries.alerts(detector="cache_curve")) == [cache.alert_id]
    assert ids(empty.alert_queries.alerts(state="firing", detector="replica_skew")) == [
        skew[2].alert_id,
        skew[1].alert_id,
    ]
    assert ids(empty.alert_queries.alerts(state="resolved")) == [skew[0].alert_id]
    assert ids(empty.alert_queries.alerts(limit=2)) == [skew[0].alert_id, skew[2].alert_id]


def test_cluster_queries_filter_by_detector_newest_window_first_then_by_rank(empty: Storage) -> None:
    columns = {"window_start": pl.Datetime("us"), "window_end": pl.Datetime("us"), "cluster_id": pl.String,
               "detector": pl.String, "rank": pl.Int32}  # fmt: skip

    def clusters_of(window: Window, rows: list[tuple[str, str, int]]) -> pl.DataFrame:
        frame_ = pl.DataFrame(
            [(window.start, window.end, cid, detector, rank) for cid, detector, rank in rows],
            schema=columns,
            orient="row",
        )
        return frame_.with_columns(
            signature=pl.lit("{}"), size=pl.lit(30, pl.Int64), support=pl.lit(0.5), risk_ratio=pl.lit(3.0),
            score=pl.lit(0.3), summary=pl.lit("s"), suggested_fix=pl.lit("f"),
            example_trace_ids=pl.lit([], pl.List(pl.String)), bad_reason=pl.lit("error"),
        )  # fmt: skip

    earlier = Window(WINDOW.start - timedelta(minutes=5), WINDOW.start)
    for window, rows in [
        (earlier, [("e1", "clusters", 1)]),
        (WINDOW, [("w2", "replica_skew", 2), ("w1", "clusters", 1)]),
    ]:
        run = RunRecord("clusters", window.end, window, "ok", 0.1, rows=len(rows), conditions=0)
        empty.detector_store.persist(EvaluationRecord(run, {"clusters": clusters_of(window, rows)}))
    listed = empty.alert_queries.clusters()
    assert listed.column("cluster_id").to_pylist() == ["w1", "w2", "e1"]
    assert "evaluated_at" not in listed.column_names
    assert empty.alert_queries.clusters(detector="replica_skew").column("cluster_id").to_pylist() == ["w2"]
    assert empty.alert_queries.clusters(limit=1).column("cluster_id").to_pylist() == ["w1"]


def test_a_bounded_pass_skips_a_detector_whose_frames_with_those_it_still_holds_pass_the_bound(empty: Storage) -> None:
    """tenant_fairness reads the scores cache_curve read before it, held for it: the bound counts them once,
    with its own requests, and the pass goes on past the skipped detector (slo_burn reads no frame)."""
    fill(empty)
    at = T0 + timedelta(minutes=10, seconds=30)
    keys = ("cache_curve", "tenant_fairness", "slo_burn")
    configs = {key: get(key).config() for key in keys}

    def nbytes(key: str) -> dict[str, int]:
        reads = get(key).inputs(configs[key], configs[key].window(at))
        return {name: read.fetch(empty.windows).nbytes for name, read in reads.items() if name != "baseline"}

    cache_curve, tenant_fairness = nbytes("cache_curve"), nbytes("tenant_fairness")
    assert cache_curve["scores"] == tenant_fairness["scores"] > 0
    bound = sum(tenant_fairness.values()) - 1
    assert sum(cache_curve.values()) <= bound

    registry = CollectorRegistry()
    detection = DetectionPass(
        empty.windows, empty.detector_store, configs, metrics=DetectorMetrics(registry), max_frame_bytes=bound
    )
    results = {r.detector: r for r in detection.run(at, keys)}
    assert {k: r.outcome for k, r in results.items()} == {
        "cache_curve": "ok", "tenant_fairness": "too_large", "slo_burn": "ok",
    }  # fmt: skip
    assert results["tenant_fairness"].error == (
        f"tenant_fairness was not evaluated for {configs['tenant_fairness'].window(at).label()}: its frames passed "
        f"{bound / 2**20:.0f} MiB (storage.detection_memory_mb); shorten its window or raise the limit"
    )
    labels = {"detector": "tenant_fairness", "outcome": "too_large"}
    assert registry.get_sample_value("tailwatch_detector_runs_total", labels) == 1
    assert count(empty, "SELECT count(*) FROM detector_runs WHERE outcome = 'too_large'") == 1

    # One byte more and it fits: what counted was each frame once.
    roomy = DetectionPass(empty.windows, empty.detector_store, configs, max_frame_bytes=bound + 1)
    assert [r.outcome for r in roomy.run(at, keys)] == ["ok"] * 3


def test_the_service_bounds_its_pass_by_storage_detection_memory_mb(tmp_path: Path) -> None:
    """token_latency's frame of a window of 20,000 requests takes ~1.8 MiB: with the bound at 1 MiB the
    service's pass skips it (and goes on); at the default it evaluates it."""
    storage = BACKENDS["duckdb"](tmp_path)
    try:
        spans = pa.Table.from_pylist(stored_requests(60_000), schema=SPAN_BATCH_SCHEMA)
        future = storage.sink.try_submit(spans)
        assert future is not None and future.result(timeout=HANG_GUARD).inserted == 60_000
        at, keys = T0 + timedelta(minutes=10, seconds=30), ["token_latency", "slo_burn"]
        tight = load_settings(None, {"db": str(tmp_path / "x.duckdb"), "storage": {"detection_memory_mb": 1}}, {})
        assert [r.outcome for r in detection_pass(tight, storage).run(at, keys)] == ["too_large", "ok"]
        default = load_settings(None, {"db": str(tmp_path / "x.duckdb")}, {})
        assert [r.outcome for r in detection_pass(default, storage).run(at, keys)] == ["ok"] * 2
    finally:
        storage.close()


def test_incidents_are_built_from_the_stored_evidence_kept_in_place_and_listed_newest_first(empty: Storage) -> None:
    at = T0 + timedelta(minutes=11)
    drift = alert("replica_skew", {"replica_id": "r3", "signal": "json_adherence"}, at,
                  explanation="explained by cluster 00000000000000c1 on score:json_adherence: ...")  # fmt: skip
    old = alert("replica_skew", {"replica_id": "r9", "signal": "latency_p99"}, at - timedelta(days=3),
                state="resolved", resolved_at=at - timedelta(days=2), updated_at=at - timedelta(days=2))  # fmt: skip
    empty.detector_store.persist(evaluation("replica_skew", at, {}, fired=[drift, old]))
    row = {"window_start": WINDOW.start, "window_end": WINDOW.end, "cluster_id": "00000000000000c1",
           "detector": "replica_skew", "rank": 1, "signature": '{"replica_id": "r3"}', "size": 40, "support": 0.5,
           "risk_ratio": 3.0, "score": 0.3, "summary": "replica r3 fails json_adherence 25 % of the time: 10 of 40",
           "suggested_fix": "drain it", "example_trace_ids": ["t1"], "bad_reason": "x", "symptom": "score:x",
           "excess": 8.0, "bad": 10}  # fmt: skip
    run = RunRecord("clusters", at, WINDOW, "ok", 0.1, rows=1, conditions=0)
    empty.detector_store.persist(EvaluationRecord(run, {"clusters": pl.DataFrame([row])}))

    incidents = IncidentPass(empty.incident_store, IncidentsConfig())
    [opened] = incidents.run(
        at
    ).incidents  # the alert resolved days ago is outside the lookback: no incident of its own
    assert (opened.alert_ids, opened.cluster_ids, opened.impact["bad_requests"]) == (
        (drift.alert_id,), ("00000000000000c1",), 10,
    )  # fmt: skip
    later = at + timedelta(minutes=5)
    empty.detector_store.persist(
        evaluation("replica_skew", later, {}, changed=[replace(drift, state="resolved", resolved_at=later,
                                                               updated_at=later)])
    )  # fmt: skip
    [held] = incidents.run(later).incidents
    [over] = incidents.run(later + timedelta(seconds=IncidentsConfig().hold_off_seconds)).incidents
    assert (held.state, over.state, over.incident_id) == ("open", "resolved", opened.incident_id)

    listed = [Incident.from_row(r) for r in empty.incident_store.incidents().to_pylist()]
    assert listed == [over]  # one row an incident, the newest version of it
    assert empty.incident_store.incidents(state="open").num_rows == 0
    assert over.updated_at == later  # its last alert's resolution
    assert empty.incident_store.incidents(since=later - timedelta(seconds=1)).num_rows == 1
    assert empty.incident_store.incidents(since=later).num_rows == 0


def test_figures_past_the_limit_keep_every_stride_th_window_back_from_the_newest_oldest_first(empty: Storage) -> None:
    # Eleven one-minute windows, two rows each: a model's (no tenant) and a tenant's.
    rows = pl.DataFrame(
        [{"window_start": T0 + timedelta(minutes=m - 1), "window_end": T0 + timedelta(minutes=m), "model": "llama",
          "deployment": "vllm-a", "tenant_id": tenant, "grouping": "model" if tenant is None else "tenant", "n": 100,
          "breached": False}
         for m in range(1, 12) for tenant in (None, "acme")]
    )  # fmt: skip
    run = RunRecord("token_latency", T0 + timedelta(minutes=11), Window(T0, T0 + timedelta(minutes=11)), "ok", 0.1)
    empty.detector_store.persist(EvaluationRecord(run, {"token_latency": rows}))
    since, until, columns = T0, T0 + timedelta(minutes=11), ("window_end", "tenant_id")

    def read(limit: int) -> tuple[list[tuple[int, str | None]], int, bool]:
        got = empty.console_queries.figures("token_latency", since, until, limit=limit, columns=columns)
        minutes = [(int((r["window_end"] - T0).total_seconds() // 60), r["tenant_id"]) for r in got.table.to_pylist()]
        return minutes, got.stride, got.truncated

    assert read(22) == ([(m, t) for m in range(1, 12) for t in ("acme", None)], 1, False)
    # 22 rows, 7 allowed: every fourth window back from the newest, sorted by the columns, NULLs last.
    assert read(7) == ([(3, "acme"), (3, None), (7, "acme"), (7, None), (11, "acme"), (11, None)], 4, True)
    # 5 allowed: every fifth window (11, 6, 1); six rows still exceed the cap, so the oldest goes.
    assert read(5) == ([(1, None), (6, "acme"), (6, None), (11, "acme"), (11, None)], 5, True)
    # One row allowed: one window in 22, so the newest alone, its row that sorts last.
    assert read(1) == ([(11, None)], 22, True)
