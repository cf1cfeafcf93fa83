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


def request_span(i: int, replica: str | None, start: datetime, end: datetime, **extra: Any) -> dict[str, Any]:
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
    # And one on a replica the metrics do not know, so that every column, its reason too, has values to compare.
    spans.append(request_span(41, "pod-c", T0 + timedelta(seconds=3), T0 + timedelta(seconds=9)))
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


# --- the fleet, from the metrics themselves ---------------------------------------------------------------


def scraped(name: str, metrics: list[Any], job: str = "vllm", **resource: str) -> bytes:
    """A pod's metrics as a Collector's scrape job forwards them: service.name is the job, not the spans' service."""
    attributes = {"service.name": job, "service.instance.id": f"{name}:8000", "k8s.pod.name": name, **resource}
    return metrics_request(metrics, attributes).SerializeToString()


def engine(times: list[int], waiting: float, model: str, kv: float = 0.5, running: float = 4.0) -> list[Any]:
    labels = {"engine": "0", "model_name": model}
    return [
        gauge("vllm:num_requests_waiting", [(t, waiting) for t in times], labels),
        gauge("vllm:num_requests_running", [(t, running) for t in times], labels),
        gauge("vllm:kv_cache_usage_perc", [(t, kv) for t in times], labels),
    ]


def around_t0() -> list[int]:
    return every_5s(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))


def test_a_fleet_scraped_under_a_job_not_named_as_its_spans_service_is_found_through_its_replicas(
    storage: Storage,
) -> None:
    # Spans say service.name=vllm-llama70b; the Collector scrapes the same pods under job `vllm`, which also
    # scrapes an 8B fleet. The 70B request's fleet is its replica's: same job, namespace and model.
    times = around_t0()
    for name, waiting, model in (("pod-a", 2.0, "llama-70b"), ("pod-b", 3.0, "llama-70b"), ("pod-c", 7.0, "llama-8b")):
        store_metrics(storage, scraped(name, engine(times, waiting, model), **{"k8s.namespace.name": "serving"}))
    span = request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13), deployment="vllm-llama70b")
    store_spans(storage, [span])
    row = joined(storage, "queue_depth", "replica_count", "kv_cache_usage", "engine_facts_reason")["0000000000000002"]
    assert (row["queue_depth"], row["replica_count"], row["kv_cache_usage"]) == (5, 2, 0.5)
    assert row["engine_facts_reason"] is None
    assert sources(storage)["0000000000000002"][:2] == ("engine", "engine")


def test_spans_and_metrics_named_alike_make_the_fleet_by_that_name_over_the_metrics_identity(storage: Storage) -> None:
    # The operator's own mapping (a scrape job or target named after the spans' service) wins: the two pods are
    # one fleet by name, though they serve different models and would be two by their metrics.
    times = around_t0()
    for name, waiting, model in (("pod-a", 2.0, "llama-70b"), ("pod-b", 3.0, "llama-70b-fp8")):
        store_metrics(storage, scraped(name, engine(times, waiting, model), job=DEPLOYMENT))
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    row = joined(storage, "queue_depth", "replica_count")["0000000000000002"]
    assert (row["queue_depth"], row["replica_count"]) == (5, 2)


def burst(storage: Storage) -> None:
    """pod-a idle (nothing waiting, one running, 10 % KV) until a burst its T0 + 10 s scrape is the first to see:
    16 waiting, 4 running, 80 % KV, draining by 4 a scrape."""
    times = around_t0()
    first = ns(T0 + timedelta(seconds=10))

    def level(t: int, idle: float, peak: float, step: float = 0.0) -> float:
        return idle if t < first else max(idle, peak - step * (t - first) / (5 * S))

    labels = {"engine": "0", "model_name": "llama-70b"}
    store_metrics(
        storage,
        scraped(
            "pod-a",
            [
                gauge("vllm:num_requests_waiting", [(t, level(t, 0.0, 16.0, 4.0)) for t in times], labels),
                gauge("vllm:num_requests_running", [(t, level(t, 1.0, 4.0)) for t in times], labels),
                gauge("vllm:kv_cache_usage_perc", [(t, level(t, 0.1, 0.8)) for t in times], labels),
            ],
        ),
    )


def test_the_head_of_a_burst_meets_the_queue_it_waited_in_not_the_idle_engine_before_it(storage: Storage) -> None:
    burst(storage)
    arrival, end = T0 + timedelta(seconds=9, milliseconds=500), T0 + timedelta(seconds=20)
    store_spans(
        storage,
        [
            # Waited 3 s in vLLM's queue (its time_in_queue), across the burst's first scrape.
            request_span(1, "pod-a", arrival, end, queue_ms=3000.0),
            # No queue time on the span: its wait is its time to first token less its prefill.
            request_span(3, "pod-a", arrival, end, ttft_ms=3300.0, prefill_ms=300.0),
            # Arrived with it, scheduled at once: the idle engine is what it met.
            request_span(5, "pod-a", arrival, end, queue_ms=0.0),
            # Waited, but was scheduled before the burst's first scrape.
            request_span(7, "pod-a", arrival, end, queue_ms=400.0),
        ],
    )
    rows = joined(storage, "queue_depth", "replica_count", "running_requests", "kv_cache_usage")
    met = {
        k: (r["queue_depth"], r["replica_count"], r["running_requests"], r["kv_cache_usage"]) for k, r in rows.items()
    }
    assert met == {
        "0000000000000002": (16, 1, 4, 0.8),
        "0000000000000004": (16, 1, 4, 0.8),
        "0000000000000006": (0, 1, 1, 0.1),
        "0000000000000008": (0, 1, 1, 0.1),
    }


def test_a_wait_across_several_scrapes_meets_the_deepest_queue_among_them(storage: Storage) -> None:
    burst(storage)  # none waiting until T0 + 5 s, then 16 at T0 + 10 s, 12 at + 15 s, 8 at + 20 s
    store_spans(
        storage,
        [
            request_span(1, "pod-a", T0 + timedelta(seconds=6), T0 + timedelta(seconds=30), queue_ms=12000.0),
            request_span(3, "pod-a", T0 + timedelta(seconds=16), T0 + timedelta(seconds=30), queue_ms=6000.0),
        ],
    )
    rows = joined(storage, "queue_depth")
    assert {k: r["queue_depth"] for k, r in rows.items()} == {"0000000000000002": 16, "0000000000000004": 12}


def test_a_difference_over_a_request_needs_its_replica_current_at_both_ends(storage: Storage) -> None:
    # pod-a reports until T0 - 30 s, then nothing until T0 + 15 s: a request arriving at T0 + 1 s finds a
    # state 31 s old. The counters' growth since then is not the request's: no preemptions, no hit ratio.
    # pod-z, scraped once a minute, makes the join read states two minutes around the request, so pod-a's
    # old state is read, and must be judged by pod-a's own interval.
    slow = decode_metrics(
        pod("pod-z", [gauge("vllm:num_requests_waiting", [(ns(T0), 1.0)])]),
        Encoding.PROTOBUF,
        names=EngineNames(interval_seconds=60.0),
    )
    done = storage.sink.try_submit(None, None, slow.metrics)
    assert done is not None
    done.result(timeout=HANG_GUARD)
    times = [t for t in around_t0() if t <= ns(T0 - timedelta(seconds=30)) or t >= ns(T0 + timedelta(seconds=15))]
    store_metrics(
        storage,
        pod(
            "pod-a",
            [
                counter("vllm:num_preemptions_total", [(t, float(k)) for k, t in enumerate(times)]),
                counter("vllm:prefix_cache_queries_total", [(t, 1000.0 * k) for k, t in enumerate(times)]),
                counter("vllm:prefix_cache_hits_total", [(t, 600.0 * k) for k, t in enumerate(times)]),
            ],
        ),
    )
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    row = joined(storage, "preemptions", "cache_hit_ratio", "step_tokens", "engine_facts_reason")["0000000000000002"]
    assert (row["preemptions"], row["cache_hit_ratio"], row["engine_facts_reason"]) == (None, None, "stale")


def test_a_replica_seen_only_while_the_request_waited_is_stale_not_absent(storage: Storage) -> None:
    # One point of pod-a, at T0 + 5 s, inside the request's 6-s wait: nothing current at arrival or at its end,
    # yet the replica was seen, and what the request met while waiting is joined.
    labels = {"engine": "0"}
    at = ns(T0 + timedelta(seconds=5))
    store_metrics(
        storage,
        pod(
            "pod-a",
            [
                gauge("vllm:num_requests_running", [(at, 7.0)], labels),
                gauge("vllm:kv_cache_usage_perc", [(at, 0.9)], labels),
            ],
        ),
    )
    span = request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=40), queue_ms=6000.0)
    store_spans(storage, [span])
    row = joined(storage, "running_requests", "kv_cache_usage", "engine_facts_reason")["0000000000000002"]
    assert (row["running_requests"], row["kv_cache_usage"], row["engine_facts_reason"]) == (7, 0.9, "stale")


def test_a_scrape_in_the_second_a_wait_ended_counts_toward_it(storage: Storage) -> None:
    # pod-a is idle at T0 + 5 s and T0 + 10 s and shows the burst at T0 + 12 s. A request arriving at T0 + 10.1 s
    # and waiting 2 s (until T0 + 12.1 s) met it; one waiting 1.5 s (until T0 + 11.6 s) did not.
    labels = {"engine": "0", "model_name": "llama-70b"}
    times = [ns(T0 + timedelta(seconds=s)) for s in (5, 10, 12)]
    store_metrics(
        storage,
        scraped("pod-a", [gauge("vllm:num_requests_waiting", list(zip(times, (0.0, 0.0, 16.0), strict=True)), labels)]),
    )
    arrival = T0 + timedelta(seconds=10, milliseconds=100)
    store_spans(
        storage,
        [
            request_span(1, "pod-a", arrival, arrival + timedelta(seconds=8), queue_ms=2000.0),
            request_span(3, "pod-a", arrival, arrival + timedelta(seconds=8), queue_ms=1500.0),
        ],
    )
    rows = joined(storage, "queue_depth")
    assert {k: r["queue_depth"] for k, r in rows.items()} == {"0000000000000002": 16, "0000000000000004": 0}


# --- bad input: nothing crashes, nothing joins to the wrong replica, each is counted or explained ----------


def test_a_replica_present_in_spans_and_absent_from_metrics_borrows_nothing_and_says_why(storage: Storage) -> None:
    times = around_t0()
    for name, waiting in (("pod-a", 2.0), ("pod-b", 3.0)):
        store_metrics(storage, scraped(name, engine(times, waiting, "llama-70b")))
    start, end = T0 + timedelta(seconds=1), T0 + timedelta(seconds=13)
    store_spans(
        storage,
        [
            # pod-c is in no metrics, and nothing names its fleet.
            request_span(1, "pod-c", start, end, deployment="vllm-llama70b"),
            # pod-d neither, but its spans' service is the scrape job's name: its fleet is found by name.
            request_span(3, "pod-d", start, end, deployment="vllm"),
            # A span naming no replica at all.
            request_span(5, None, start, end, deployment="vllm-llama70b"),
        ],
    )
    columns = ("queue_depth", "replica_count", "kv_cache_usage", "running_requests", "cache_hit_ratio")
    rows = joined(storage, *columns, "engine_facts_reason")
    got = {k: (*(r[c] for c in columns), r["engine_facts_reason"]) for k, r in rows.items()}
    assert got == {
        "0000000000000002": (None, None, None, None, None, "no_points_for_replica"),
        "0000000000000004": (5, 2, None, None, None, "no_points_for_replica"),
        "0000000000000006": (None, None, None, None, None, "no_replica"),
    }


def test_metrics_of_pods_no_span_names_count_in_their_fleet_and_reach_no_request(storage: Storage) -> None:
    times = around_t0()
    serving = {"k8s.namespace.name": "serving"}
    store_metrics(storage, scraped("pod-a", engine(times, 2.0, "llama-70b", kv=0.5, running=4.0), **serving))
    # pod-x serves the same fleet and no traced request; pod-y is the same model in another namespace.
    store_metrics(storage, scraped("pod-x", engine(times, 3.0, "llama-70b", kv=0.9, running=9.0), **serving))
    staging = {"k8s.namespace.name": "staging"}
    store_metrics(storage, scraped("pod-y", engine(times, 11.0, "llama-70b", kv=0.2, running=1.0), **staging))
    span = request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13), deployment="vllm-llama70b")
    store_spans(storage, [span])
    row = joined(storage, "queue_depth", "replica_count", "kv_cache_usage", "running_requests")["0000000000000002"]
    assert (row["queue_depth"], row["replica_count"], row["kv_cache_usage"], row["running_requests"]) == (5, 2, 0.5, 4)


def test_a_rollout_keeps_one_fleet_across_replica_sets_and_moves_a_replica_whose_model_changes(
    storage: Storage,
) -> None:
    times = around_t0()

    def between(first: datetime, last: datetime) -> list[int]:
        return [t for t in times if ns(first) <= t <= ns(last)]

    # A Deployment's rollout: the old ReplicaSet's pod reports until T0, the new one's from T0 - 10 s; one fleet.
    for name, waiting, reported in (
        ("llama-6d9f-x", 2.0, between(T0 - timedelta(minutes=1), T0)),
        ("llama-7c4b-y", 3.0, between(T0 - timedelta(seconds=10), T0 + timedelta(minutes=1))),
    ):
        rollout = {"k8s.namespace.name": "serving", "k8s.deployment.name": "llama", "k8s.replicaset.name": name[:10]}
        store_metrics(storage, scraped(name, engine(reported, waiting, "llama-70b"), **rollout))
    # A StatefulSet's pod keeps its name and restarts with another model at T0 + 30 s: another fleet from then on.
    stateful = {"k8s.namespace.name": "serving", "k8s.statefulset.name": "qwen"}
    switch = T0 + timedelta(seconds=30)
    changed = engine(between(T0 - timedelta(minutes=1), switch - timedelta(seconds=5)), 4.0, "qwen-32b")
    changed += engine(between(switch, T0 + timedelta(minutes=1)), 6.0, "qwen-72b")
    store_metrics(storage, scraped("qwen-0", changed, **stateful))
    store_metrics(storage, scraped("qwen-1", engine(times, 1.0, "qwen-32b"), **stateful))
    store_spans(
        storage,
        [
            request_span(i, replica, T0 + timedelta(seconds=at), T0 + timedelta(seconds=at + 4), deployment="x")
            for i, replica, at in (
                (1, "llama-7c4b-y", 1),
                (3, "llama-7c4b-y", 21),
                (5, "qwen-0", 16),
                (7, "qwen-0", 41),
            )
        ],
    )
    rows = joined(storage, "queue_depth", "replica_count", "engine_facts_reason")
    assert {k: (r["queue_depth"], r["replica_count"], r["engine_facts_reason"]) for k, r in rows.items()} == {
        "0000000000000002": (5, 2, None),  # the old pod is current until T0 + 10 s
        "0000000000000004": (3, 1, None),
        "0000000000000006": (5, 2, None),
        "0000000000000008": (6, 1, None),  # qwen-1 still serves the other model
    }


def test_clock_skew_of_seconds_between_spans_and_scrapes_keeps_every_request_on_its_own_replica(
    storage: Storage,
) -> None:
    # The scrapes run from T0 - 1 min; the spans' clock is 3 s off either way.
    times = around_t0()
    store_metrics(storage, scraped("pod-a", engine(times, 2.0, "llama-70b", kv=0.25, running=4.0)))
    store_metrics(storage, scraped("pod-b", engine(times, 3.0, "llama-70b", kv=0.75, running=6.0)))
    store_spans(
        storage,
        [
            request_span(1, "pod-a", T0 + timedelta(seconds=4), T0 + timedelta(seconds=16), deployment="x"),
            request_span(3, "pod-b", T0 - timedelta(seconds=2), T0 + timedelta(seconds=10), deployment="x"),
            # Its skewed arrival is before pod-b's first scrape: nothing at arrival, the rest after it.
            request_span(5, "pod-b", T0 - timedelta(seconds=63), T0 - timedelta(seconds=50), deployment="x"),
        ],
    )
    columns = ("queue_depth", "replica_count", "kv_cache_usage", "running_requests", "engine_facts_reason")
    got = {k: tuple(r[c] for c in columns) for k, r in joined(storage, *columns).items()}
    assert got == {
        "0000000000000002": (5, 2, 0.25, 4, None),
        "0000000000000004": (5, 2, 0.75, 6, None),
        "0000000000000006": (None, None, None, None, "stale"),
    }


def test_the_fleet_totals_analysts_read_sum_current_replicas_and_drop_one_two_intervals_after_it_stops(
    tmp_path: Path,
) -> None:
    """engine_fleet_states_between (by the metrics' identity) and engine_deployment_states_between (by name):
    pod-a (2 waiting) and pod-b (3) make a fleet of 5 waiting on 2 replicas; pod-b's last point is at T0, so
    it leaves two intervals (10 s) later, and pod-a's 2 are left."""
    store = DuckDBStorage.open(tmp_path / "fleet.duckdb")
    try:
        store_metrics(store, scraped("pod-a", engine(around_t0(), 2.0, "llama-70b"), job=DEPLOYMENT))
        stops = every_5s(T0 - timedelta(minutes=1), T0)
        store_metrics(store, scraped("pod-b", engine(stops, 3.0, "llama-70b"), job=DEPLOYMENT))
        t0, t1 = T0 - timedelta(minutes=1), T0 + timedelta(minutes=2)
        for macro, name in (
            ("engine_fleet_states_between", f"{DEPLOYMENT} model=llama-70b"),
            ("engine_deployment_states_between", DEPLOYMENT),
        ):
            rows = store.analyst.run(
                f"SELECT * FROM {macro}(TIMESTAMP '{t0}', TIMESTAMP '{t1}') ORDER BY time"
            ).table.to_pylist()
            assert {r.get("fleet", r.get("deployment")) for r in rows} == {name}, macro
            at = {r["time"]: (r["waiting"], r["replicas"]) for r in rows}
            assert at[T0] == (5, 2), macro
            assert at[T0 + timedelta(seconds=10)] == (2, 1), macro
            assert max(t for t in at if at[t][1] == 2) == T0 + timedelta(seconds=5), macro
    finally:
        store.close()
