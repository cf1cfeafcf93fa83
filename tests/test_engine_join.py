"""The request model joined to engine metrics: what a request without engine facts of its own gets, and from where.

Spans carry nothing but timings (as vLLM's do); the replica's and deployment's engine metrics arrive as
OTLP metrics through the real decoder into a real DuckDB file, and the detectors' read port answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from builders import counter, gauge, histogram, metrics_request
from waiting import HANG_GUARD

from collector.decode import Encoding, decode_metrics
from collector.engine_names import EngineNames
from model.columns import ENGINE_JOINED, SPAN_BATCH_SCHEMA
from storage.duckdb.backend import DuckDBStorage
from storage.ports import Requests, Storage, Window

T0 = datetime(2026, 11, 20, 12, 0)
S = 1_000_000_000
DEPLOYMENT = "vllm-llama8b"
ENGINE_COLUMNS = (
    "queue_depth", "replica_count", "cache_hit_ratio", "kv_cache_usage", "running_requests", "preemptions",
    "step_tokens",
)  # fmt: skip


def ns(at: datetime) -> int:
    return int((at - datetime(1970, 1, 1)).total_seconds()) * S


def every_5s(start: datetime, end: datetime) -> list[int]:
    return list(range(ns(start), ns(end) + 1, 5 * S))


def pod(name: str, metrics: list[Any]) -> bytes:
    resource = {"service.name": DEPLOYMENT, "service.instance.id": f"{name}:8000", "k8s.pod.name": name}
    return metrics_request(metrics, resource).SerializeToString()


def store_metrics(storage: Storage, payload: bytes) -> None:
    decoded = decode_metrics(payload, Encoding.PROTOBUF, names=EngineNames(interval_seconds=5.0))
    assert decoded.rejections.total == 0
    future = storage.sink.try_submit(None, None, decoded.metrics)
    assert future is not None
    future.result(timeout=HANG_GUARD)


def request_span(i: int, replica: str, start: datetime, end: datetime, **extra: Any) -> dict[str, Any]:
    duration = (end - start).total_seconds() * 1000
    return {
        "trace_id": f"{i:032x}", "span_id": f"{i + 1:016x}", "name": "llm_request", "kind": "SERVER",
        "start_time": start, "end_time": end, "duration_ms": duration, "status_code": "OK", "is_llm": True,
        "llm_role": "server", "deployment": DEPLOYMENT, "replica_id": replica, "e2e_ms": duration,
        "tpot_ms": 20.0, **extra,
    }  # fmt: skip


def store_spans(storage: Storage, rows: list[dict[str, Any]]) -> None:
    future = storage.sink.try_submit(pa.Table.from_pylist(rows, schema=SPAN_BATCH_SCHEMA))
    assert future is not None
    future.result(timeout=HANG_GUARD)


# Storages whose spans are settled before every read: each test runs once joined live, once settled, and
# both must give the same answers.
SETTLED: set[int] = set()
LATER = T0 + timedelta(days=1)


@pytest.fixture(params=["live", "settled"])
def storage(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Storage]:
    store = DuckDBStorage.open(tmp_path / "join.duckdb")
    if request.param == "settled":
        SETTLED.add(id(store))
    yield store
    SETTLED.discard(id(store))
    store.close()


def settle_if_asked(storage: Storage) -> None:
    if id(storage) in SETTLED:
        storage.engine_facts.settle(LATER)


def joined(storage: Storage, *columns: str) -> dict[str, dict[str, Any]]:
    """Each request's engine-filled columns, by span_id."""
    settle_if_asked(storage)
    table = storage.windows.requests(
        Requests(Window(T0 - timedelta(minutes=5), T0 + timedelta(minutes=5)), columns or ENGINE_COLUMNS, ids=True)
    )
    return {row["span_id"]: row for row in table.to_pylist()}


def sources(storage: Storage) -> dict[str, tuple[str | None, str | None, str | None]]:
    settle_if_asked(storage)
    rows = storage.analyst.run(
        "SELECT span_id, queue_depth_source, replica_count_source, cache_hit_ratio_source FROM llm_requests"
    ).table.to_pylist()
    return {
        r["span_id"]: (r["queue_depth_source"], r["replica_count_source"], r["cache_hit_ratio_source"]) for r in rows
    }


def two_pods(storage: Storage) -> None:
    """pod-a and pod-b report every 5 s over the two minutes around T0."""
    times = every_5s(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    for name, waiting in (("pod-a", 2.0), ("pod-b", 3.0)):
        store_metrics(
            storage,
            pod(
                name,
                [
                    gauge("vllm:num_requests_waiting", [(t, waiting) for t in times], {"engine": "0"}),
                    gauge("vllm:num_requests_running", [(t, 4.0) for t in times], {"engine": "0"}),
                    gauge("vllm:kv_cache_usage_perc", [(t, 0.5 if t < ns(T0) else 0.97) for t in times]),
                    # 1000 prompt tokens looked up every 5 s, 600 of them hits: a 0.6 hit rate.
                    counter("vllm:prefix_cache_queries_total", [(t, 1000.0 * k) for k, t in enumerate(times)]),
                    counter("vllm:prefix_cache_hits_total", [(t, 600.0 * k) for k, t in enumerate(times)]),
                    # One preemption every 5 s from T0 on.
                    counter("vllm:num_preemptions_total", [(t, max(0.0, (t - ns(T0)) / (5 * S))) for t in times]),
                    histogram("vllm:iteration_tokens_total", [(t, 512.0 * k, 2 * k) for k, t in enumerate(times)]),
                ],
            ),
        )


def test_a_request_without_engine_facts_gets_its_replica_and_deployment_state(storage: Storage) -> None:
    two_pods(storage)
    # Arrives 1 s after the T0 scrape, ends 12 s later: the lifetime runs from the T0 point to T0+15 s.
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    row = joined(storage)["0000000000000002"]
    assert row["queue_depth"] == 5  # 2 waiting on pod-a + 3 on pod-b
    assert row["replica_count"] == 2
    assert row["cache_hit_ratio"] == pytest.approx(0.6)
    assert row["kv_cache_usage"] == pytest.approx(0.97)
    assert row["running_requests"] == 4
    assert row["preemptions"] == 3  # T0 → T0+15 s
    assert row["step_tokens"] == pytest.approx(256.0)
    assert sources(storage)["0000000000000002"] == ("engine", "engine", "engine")


def test_a_span_s_own_value_wins_and_says_so(storage: Storage) -> None:
    two_pods(storage)
    store_spans(
        storage,
        [
            request_span(
                1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13), queue_depth=9, cache_hit_ratio=0.1
            )
        ],
    )
    row = joined(storage)["0000000000000002"]
    assert (row["queue_depth"], row["replica_count"], row["cache_hit_ratio"]) == (9, 2, 0.1)
    assert sources(storage)["0000000000000002"] == ("span", "engine", "span")


def test_waiting_and_running_requests_of_two_engine_series_on_one_replica_are_summed(storage: Storage) -> None:
    # Data-parallel vLLM reports its queues once per engine core: one pod, two `engine` series.
    times = every_5s(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    series = [
        gauge(name, [(t, value) for t in times], {"engine": engine})
        for engine, waiting, running in (("0", 2.0, 3.0), ("1", 4.0, 7.0))
        for name, value in (("vllm:num_requests_waiting", waiting), ("vllm:num_requests_running", running))
    ]
    store_metrics(storage, pod("pod-a", series))
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    row = joined(storage, "queue_depth", "replica_count", "running_requests")["0000000000000002"]
    # Averaged they would be 3 waiting and 5 running; one replica however many engines it runs.
    assert (row["queue_depth"], row["running_requests"], row["replica_count"]) == (6, 10, 1)


def test_a_replica_that_stopped_reporting_two_intervals_ago_is_gone(storage: Storage) -> None:
    times = every_5s(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    store_metrics(storage, pod("pod-a", [gauge("vllm:num_requests_waiting", [(t, 2.0) for t in times])]))
    # pod-b's last point is at T0: current until T0+10 s, gone after.
    store_metrics(storage, pod("pod-b", [gauge("vllm:num_requests_waiting", [(t, 3.0) for t in times if t <= ns(T0)])]))
    store_spans(
        storage,
        [
            request_span(1, "pod-a", T0 + timedelta(seconds=9), T0 + timedelta(seconds=20)),
            request_span(3, "pod-a", T0 + timedelta(seconds=11), T0 + timedelta(seconds=20)),
            request_span(5, "pod-b", T0 + timedelta(seconds=11), T0 + timedelta(seconds=20)),
        ],
    )
    rows = joined(storage, "queue_depth", "replica_count", "running_requests")
    assert (rows["0000000000000002"]["queue_depth"], rows["0000000000000002"]["replica_count"]) == (5, 2)
    assert (rows["0000000000000004"]["queue_depth"], rows["0000000000000004"]["replica_count"]) == (2, 1)
    # The deployment's figures do not depend on the replica still reporting; its own gauges do.
    assert rows["0000000000000006"]["replica_count"] == 1


def test_a_counter_reset_inside_a_request_counts_from_the_new_value(storage: Storage) -> None:
    times = every_5s(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    restart = ns(T0 + timedelta(seconds=7))
    queries, hits = [], []
    for t in times:
        # Before the restart the counters are large; after it they count again from zero.
        base = 1_000_000.0 if t < restart else 0.0
        k = (t - (times[0] if t < restart else restart)) / (5 * S)
        queries.append((t, base + 1000.0 * k))
        hits.append((t, base / 2 + (200.0 if t >= restart else 600.0) * k))
    store_metrics(
        storage,
        pod(
            "pod-a",
            [counter("vllm:prefix_cache_queries", queries), counter("vllm:prefix_cache_hits", hits)],
        ),
    )
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    # T0 → T0+10 s: 1000 queries / 600 hits, then the reset to (600, 120) at T0+10 s, then +1000 / +200.
    hit_ratio = joined(storage, "cache_hit_ratio")["0000000000000002"]["cache_hit_ratio"]
    assert hit_ratio == pytest.approx((600 + 120 + 200) / (1000 + 600 + 1000))


def test_a_retried_export_and_points_out_of_order_change_nothing(storage: Storage) -> None:
    times = every_5s(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    late, early = [t for t in times if t >= ns(T0)], [t for t in times if t < ns(T0)]
    for part in (late, early, late):
        store_metrics(
            storage,
            pod(
                "pod-a",
                [
                    gauge("vllm:num_requests_waiting", [(t, 2.0) for t in part]),
                    counter("vllm:prefix_cache_queries", [(t, 10.0 * (t - times[0]) / S) for t in part]),
                    counter("vllm:prefix_cache_hits", [(t, 4.0 * (t - times[0]) / S) for t in part]),
                ],
            ),
        )
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    row = joined(storage, "queue_depth", "replica_count", "cache_hit_ratio")["0000000000000002"]
    assert (row["queue_depth"], row["replica_count"]) == (2, 1)
    assert row["cache_hit_ratio"] == pytest.approx(0.4)


def test_a_request_with_no_engine_metrics_keeps_nulls(storage: Storage) -> None:
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    row = joined(storage)["0000000000000002"]
    assert all(row[c] is None for c in ENGINE_COLUMNS)
    assert sources(storage)["0000000000000002"] == (None, None, None)


@pytest.mark.parametrize("column", ENGINE_JOINED)
def test_a_read_of_one_engine_column_gives_what_the_whole_request_model_says(storage: Storage, column: str) -> None:
    # Reads join only the state they need (storage.duckdb.window_source picks the macro): the values must not differ.
    two_pods(storage)
    spans = [
        request_span(i, f"pod-{'ab'[i % 2]}", T0 + timedelta(seconds=i), T0 + timedelta(seconds=i + 7))
        for i in range(1, 40, 2)
    ]
    store_spans(storage, spans)
    settle_if_asked(storage)
    full = {
        r["span_id"]: r[column]
        for r in storage.analyst.run(f"SELECT span_id, {column} FROM llm_requests").table.to_pylist()
    }
    assert any(v is not None for v in full.values())
    assert {k: r[column] for k, r in joined(storage, column).items()} == full


def test_retention_deletes_the_engine_points_older_than_the_cutoff_with_the_spans(storage: Storage) -> None:
    two_pods(storage)  # T0 − 1 min … T0 + 1 min, every 5 s, two pods
    before = storage.analyst.run("SELECT count(*) AS n FROM engine_metrics").table.to_pylist()[0]["n"]
    storage.retention.delete_ended_before(T0)
    kept = storage.analyst.run("SELECT count(*) AS n, min(time) AS first FROM engine_metrics").table.to_pylist()[0]
    assert kept["first"] == T0
    assert kept["n"] == before * 13 // 25  # 13 of the 25 scrapes are at or after T0
