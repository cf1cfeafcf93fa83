"""Settling engine facts: each LLM span's engine facts stored beside it once the engine metrics around it
have arrived, so reads of settled windows join nothing. (tests/test_engine_join.py runs every join rule
both live and settled.)
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import counter, gauge
from conftest import RunningService, service_settings
from test_engine_join import (
    ENGINE_COLUMNS,
    LATER,
    T0,
    every_5s,
    joined,
    pod,
    request_span,
    store_metrics,
    store_spans,
    two_pods,
)
from waiting import HANG_GUARD, wait_until

from storage.duckdb.backend import DuckDBStorage
from storage.ports import Requests, Window
from tailwatch.settings import MetricsSettings


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[DuckDBStorage]:
    store = DuckDBStorage.open(tmp_path / "settle.duckdb")
    yield store
    store.close()


def settled_flags(storage: DuckDBStorage) -> dict[str, bool | None]:
    rows = storage.analyst.run("SELECT span_id, engine_settled FROM spans").table.to_pylist()
    return {r["span_id"]: r["engine_settled"] for r in rows}


def forget_engine_metrics(storage: DuckDBStorage) -> None:
    storage.writer.submit(lambda con: con.execute("DELETE FROM engine_metrics")).result(timeout=HANG_GUARD)


def test_a_settled_request_keeps_its_facts_after_the_engine_points_are_gone(storage: DuckDBStorage) -> None:
    two_pods(storage)
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    live = joined(storage)["0000000000000002"]
    assert storage.engine_facts.settle(LATER) == 1
    forget_engine_metrics(storage)
    # Nothing is left to join: the values can only come from what settling stored.
    assert joined(storage)["0000000000000002"] == live
    assert live["queue_depth"] == 5 and live["preemptions"] == 3


def test_an_unsettled_request_is_joined_live_and_settles_at_the_next_call(storage: DuckDBStorage) -> None:
    two_pods(storage)
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    assert storage.engine_facts.settle(LATER) == 1
    # Stored after settling, as a span held up in an exporter's retries would be.
    store_spans(storage, [request_span(3, "pod-b", T0 + timedelta(seconds=2), T0 + timedelta(seconds=9))])
    assert settled_flags(storage)["0000000000000004"] is None
    live = joined(storage)["0000000000000004"]
    assert live["queue_depth"] == 5 and live["running_requests"] == 4
    assert storage.engine_facts.settle(LATER) == 1
    assert settled_flags(storage) == {"0000000000000002": True, "0000000000000004": True}
    assert joined(storage)["0000000000000004"] == live


def test_points_arriving_after_a_request_settled_do_not_change_it(storage: DuckDBStorage) -> None:
    times = every_5s(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    store_metrics(storage, pod("pod-a", [gauge("vllm:num_requests_waiting", [(t, 2.0) for t in times])]))
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    storage.engine_facts.settle(LATER)
    store_metrics(storage, pod("pod-b", [gauge("vllm:num_requests_waiting", [(t, 3.0) for t in times])]))
    row = joined(storage, "queue_depth", "replica_count")["0000000000000002"]
    assert (row["queue_depth"], row["replica_count"]) == (2, 1)


def test_a_request_settled_without_facts_stays_without_them_when_its_replica_s_points_arrive_late(
    storage: DuckDBStorage,
) -> None:
    times = every_5s(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    store_metrics(storage, pod("pod-a", [gauge("vllm:kv_cache_usage_perc", [(t, 0.5) for t in times])]))
    store_spans(storage, [request_span(1, "pod-b", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    assert storage.engine_facts.settle(LATER) == 1
    store_metrics(storage, pod("pod-b", [gauge("vllm:kv_cache_usage_perc", [(t, 0.9) for t in times])]))
    # A request not yet settled on the same replica and seconds is joined live; the settled one is not.
    store_spans(storage, [request_span(3, "pod-b", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    rows = joined(storage, "kv_cache_usage")
    assert (rows["0000000000000002"]["kv_cache_usage"], rows["0000000000000004"]["kv_cache_usage"]) == (None, 0.9)


def test_spans_settle_only_as_far_as_the_engine_points_have_arrived(storage: DuckDBStorage) -> None:
    # The engines have reported up to T0 + 1 min; a request ending later waits for them, whatever `until` says.
    two_pods(storage)
    store_spans(
        storage,
        [
            request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13)),
            request_span(3, "pod-a", T0 + timedelta(seconds=50), T0 + timedelta(seconds=61)),
        ],
    )
    assert storage.engine_facts.settle(T0 + timedelta(seconds=10)) == 0
    assert storage.engine_facts.settle(LATER) == 1
    assert settled_flags(storage) == {"0000000000000002": True, "0000000000000004": None}


def test_without_engine_metrics_nothing_is_settled(storage: DuckDBStorage) -> None:
    store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    assert storage.engine_facts.settle(LATER) == 0
    assert settled_flags(storage) == {"0000000000000002": None}


def test_settling_goes_an_hour_of_spans_at_a_time_and_leaves_none_behind(storage: DuckDBStorage) -> None:
    # Three hours of requests, one a minute, with the engines reporting throughout.
    hours = 3
    times = every_5s(T0 - timedelta(minutes=1), T0 + timedelta(hours=hours, minutes=1))
    store_metrics(storage, pod("pod-a", [gauge("vllm:num_requests_waiting", [(t, 1.0) for t in times])]))
    spans = [
        request_span(2 * i + 1, "pod-a", T0 + timedelta(minutes=i), T0 + timedelta(minutes=i, seconds=7))
        for i in range(hours * 60)
    ]
    store_spans(storage, spans)
    assert storage.engine_facts.settle(LATER) == hours * 60
    assert set(settled_flags(storage).values()) == {True}
    rows = storage.analyst.run("SELECT DISTINCT queue_depth, queue_depth_source FROM llm_requests").table.to_pylist()
    assert rows == [{"queue_depth": 1, "queue_depth_source": "engine"}]


def test_a_request_seen_by_a_gateway_and_a_replica_takes_the_replica_s_settled_facts(storage: DuckDBStorage) -> None:
    two_pods(storage)
    server = request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))
    client: dict[str, Any] = {
        **server, "span_id": "00000000000000aa", "kind": "CLIENT", "llm_role": "client", "replica_id": "gateway-0",
        "deployment": "gateway", "start_time": T0, "end_time": T0 + timedelta(seconds=14), "tenant_id": "acme",
    }  # fmt: skip
    store_spans(storage, [server, client])
    live = joined(storage)
    storage.engine_facts.settle(LATER)
    forget_engine_metrics(storage)
    settled = joined(storage)
    assert settled == live
    row = settled["00000000000000aa"]
    assert (row["queue_depth"], row["replica_count"], row["running_requests"]) == (5, 2, 4)
    assert all(row[c] is not None for c in ENGINE_COLUMNS)


def test_the_service_settles_requests_on_its_schedule(db_path: Path) -> None:
    settings = service_settings(db_path, metrics={"settle_interval_seconds": 1, "settle_after_seconds": 60})
    with RunningService(settings) as running:
        storage = running.service.storage
        two_pods(storage)
        store_spans(storage, [request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
        wait_until(
            lambda: running.rows("SELECT engine_settled, engine_queue_depth FROM spans") == [(True, 5)],
            "the request's engine facts settled by the scheduled job",
        )


def test_the_service_leaves_a_request_unsettled_for_settle_after_seconds_so_late_points_still_reach_it(
    db_path: Path,
) -> None:
    # No scheduled jobs: the test makes the service's settling call itself, on the wall clock it reads.
    settings = service_settings(db_path, scheduler=False, metrics={"settle_after_seconds": 600})
    with RunningService(settings) as running:
        storage = running.service.storage
        now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
        end = now - timedelta(minutes=5)
        # Another replica has reported up to now, so the engine points as a whole are past the request's end.
        pod_b = [(t, 0.5) for t in every_5s(end - timedelta(minutes=1), now)]
        store_metrics(storage, pod("pod-b", [gauge("vllm:kv_cache_usage_perc", pod_b)]))
        store_spans(storage, [request_span(1, "pod-a", end - timedelta(seconds=12), end)])
        # Ended 5 minutes ago, 10 are asked for: not yet.
        assert running.service.settle_engine_facts() == 0
        # Its own replica's points arrive late, as from a Collector that fell behind, inside those 10 minutes.
        pod_a = [(t, 0.75) for t in every_5s(end - timedelta(minutes=1), end + timedelta(minutes=1))]
        store_metrics(storage, pod("pod-a", [gauge("vllm:kv_cache_usage_perc", pod_a)]))
        # Once its end is 10 minutes old the service's call settles it, as this one with that horizon does.
        assert storage.engine_facts.settle(end + timedelta(seconds=1)) == 1
        assert running.rows("SELECT engine_settled, engine_kv_cache_usage FROM spans") == [(True, 0.75)]


def test_a_window_half_settled_reads_the_settled_part_without_the_join_and_the_rest_joined(
    storage: DuckDBStorage,
) -> None:
    two_pods(storage)
    store_spans(
        storage,
        [
            request_span(1, "pod-a", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13)),
            request_span(3, "pod-b", T0 + timedelta(seconds=21), T0 + timedelta(seconds=40)),
            request_span(5, "pod-a", T0 + timedelta(seconds=41), T0 + timedelta(seconds=52)),
        ],
    )
    live = joined(storage)
    assert storage.engine_facts.settle(T0 + timedelta(seconds=30)) == 1  # the first request only
    window = Window(T0 - timedelta(minutes=5), T0 + timedelta(minutes=5))
    model, params = storage.windows._model(ENGINE_COLUMNS, window)
    assert "UNION ALL" in model and params[1] == T0 + timedelta(seconds=40)  # split at the first unsettled end
    assert joined(storage) == live
    assert storage.windows.requests(Requests(window, ENGINE_COLUMNS)).num_rows == 3  # none twice, none lost
    assert {k: r["queue_depth"] for k, r in live.items()} == {
        "0000000000000002": 5, "0000000000000004": 5, "0000000000000006": 5
    }  # fmt: skip


def facts(storage: DuckDBStorage) -> dict[str, tuple[Any, ...]]:
    rows = storage.analyst.run(
        "SELECT span_id, engine_settled, engine_queue_depth, engine_replica_count, engine_kv_cache_usage, "
        "engine_preemptions, engine_facts_reason FROM spans"
    ).table.to_pylist()
    return {r.pop("span_id"): tuple(r.values()) for r in rows}


def kv_and_queue(name: str, start: datetime, end: datetime, kv: float, waiting: float) -> bytes:
    times = every_5s(start, end)
    return pod(
        name,
        [
            gauge("vllm:kv_cache_usage_perc", [(t, kv) for t in times]),
            gauge("vllm:num_requests_waiting", [(t, waiting) for t in times]),
            counter("vllm:num_preemptions_total", [(t, 0.0) for t in times]),
        ],
    )


def test_a_lagging_source_holds_back_its_own_replicas_requests_until_its_points_arrive(
    storage: DuckDBStorage,
) -> None:
    # pod-a's Collector is current, ten minutes past the requests; pod-b's is minutes behind: what it has
    # delivered so far ends two minutes before them. pod-c has never reported.
    store_metrics(storage, kv_and_queue("pod-a", T0 - timedelta(minutes=5), T0 + timedelta(minutes=10), 0.5, 2.0))
    store_metrics(storage, kv_and_queue("pod-b", T0 - timedelta(minutes=5), T0 - timedelta(minutes=2), 0.75, 3.0))
    start, end = T0 + timedelta(seconds=1), T0 + timedelta(seconds=13)
    store_spans(storage, [request_span(i, name, start, end) for i, name in ((1, "pod-a"), (3, "pod-b"), (5, "pod-c"))])
    assert storage.engine_facts.settle(LATER) == 2
    assert facts(storage) == {
        "0000000000000002": (True, 2, 1, 0.5, 0, None),
        "0000000000000004": (None, None, None, None, None, None),
        # Nothing to wait for: settled at once, and saying why it has no facts.
        "0000000000000006": (True, 2, 1, None, None, "no_points_for_replica"),
    }
    # pod-b's Collector catches up: its request settles with its own replica's facts.
    store_metrics(storage, kv_and_queue("pod-b", T0 - timedelta(minutes=2), T0 + timedelta(minutes=10), 0.75, 3.0))
    assert storage.engine_facts.settle(LATER) == 1
    assert facts(storage)["0000000000000004"] == (True, 5, 2, 0.75, 0, None)


def test_a_source_that_never_catches_up_settles_an_hour_on_with_what_exists_and_says_what_is_missing(
    storage: DuckDBStorage,
) -> None:
    # pod-b's points stop at T0 + 5 s, inside its request; pod-a's go on.
    store_metrics(storage, kv_and_queue("pod-a", T0 - timedelta(minutes=1), T0 + timedelta(minutes=50), 0.5, 2.0))
    store_metrics(storage, kv_and_queue("pod-b", T0 - timedelta(minutes=1), T0 + timedelta(seconds=5), 0.75, 3.0))
    store_spans(storage, [request_span(1, "pod-b", T0 + timedelta(seconds=1), T0 + timedelta(seconds=13))])
    assert storage.engine_facts.settle(LATER) == 0  # the engines are 50 minutes past its end: it still waits
    store_metrics(storage, kv_and_queue("pod-a", T0 + timedelta(minutes=50), T0 + timedelta(minutes=61), 0.5, 2.0))
    assert storage.engine_facts.settle(LATER) == 1
    # At arrival it had its replica's state; its lifetime figures needed a point after its end that never came.
    assert facts(storage)["0000000000000002"] == (True, 5, 2, 0.75, None, "source_behind")


def test_requests_settle_only_after_the_shipped_collector_has_stopped_retrying() -> None:
    # A batch the Collector retries may arrive after newer ones from the same source: settling must wait out
    # its retry window (and the batch and the last attempt before it), or that batch's points are lost to the
    # requests they describe.
    config = yaml.safe_load((Path(__file__).parents[1] / "deploy" / "otel-collector.yaml").read_text())
    exporter = config["exporters"]["otlp"]
    retrying = seconds(exporter["retry_on_failure"]["max_elapsed_time"])
    last_attempt = seconds(exporter.get("timeout", "5s"))  # the exporter's default timeout
    batching = seconds(config["processors"]["batch"]["timeout"])
    assert (retrying, last_attempt, batching) == (300, 5, 1)
    assert MetricsSettings().settle_after_seconds >= retrying + last_attempt + batching


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60}
    number = duration.rstrip("ms")
    return float(number) * units[duration[len(number) :]]
