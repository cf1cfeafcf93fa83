"""Every scenario with a detector, simulated into a real service through the OTel SDK exporter:
its planted cause raises its alert, and nothing else fires; steady traffic fires nothing at all."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import RunningService, service_settings

from tailwatch import simulate

# scenario -> (the alerts it may raise, the one that must fire with its labels, the top cluster)
EXPECTED: dict[str, tuple[set[str], str, dict[str, str], dict[str, str]]] = {
    "decode_jitter": (
        {"token_latency"},
        "token_latency",
        {"deployment": simulate.DEPLOYMENT},
        {"batch_prefill": "4k+"},
    ),
    "kv_eviction": ({"cache_curve"}, "cache_curve", {"bucket": "low"}, {"cache_bucket": "low"}),
    "noisy_neighbor": ({"tenant_fairness"}, "tenant_fairness", {"tenant_id": "smallco"}, {"tenant_id": "smallco"}),
    # A burst with no new replicas is also a saturation cliff: both detectors see it.
    "morning_burst": (
        {"traffic_pattern", "saturation"},
        "traffic_pattern",
        {"pattern": "burst"},
        {"traffic_pattern": "burst"},
    ),
    "replica_drift": ({"replica_skew"}, "replica_skew", {"replica_id": "r3"}, {"replica_id": "r3"}),
    # The int4 replicas are r2 and r3, so replica_skew rightly sees them too.
    "quantization_regression": (
        {"quantization_delta", "replica_skew"},
        "quantization_delta",
        {"quantization": "int4"},
        {"quantization": "int4"},
    ),
    "long_context": ({"context_length"}, "context_length", {"prompt_bucket": "64k+"}, {"prompt_bucket": "64k+"}),
}


def simulate_and_detect(db: Path, names: list[str], seed: int = 7, protocol: str = "grpc"):
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    with RunningService(service_settings(db)) as svc:
        endpoint = svc.grpc_target if protocol == "grpc" else svc.http_url
        simulate.run(
            names, endpoint=endpoint, protocol=protocol, seed=seed, end=end, history_hours=2.0,
            history_rate=0.1, rate=3.0,
        )  # fmt: skip
        detection = svc.service.detection
        assert detection is not None
        sent = len(simulate.requests(names, seed=seed, end=end, history_hours=2.0, history_rate=0.1, rate=3.0))
        assert svc.rows("SELECT count(*) FROM llm_requests") == [(sent,)]  # every simulated request arrived
        results = detection.run(end + timedelta(seconds=30))
        clusters = [json.loads(row[0]) for row in svc.rows("SELECT signature FROM clusters ORDER BY rank")]
        return results, clusters


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_the_planted_cause_fires_its_alert_and_tops_the_clusters(db_path: Path, scenario: str) -> None:
    allowed, detector, labels, top_cluster = EXPECTED[scenario]
    results, clusters = simulate_and_detect(db_path, [scenario])
    assert all(r.outcome == "ok" for r in results), [r.error for r in results]
    firing = {(r.detector, tuple(sorted(a.labels.items()))) for r in results for a in r.firing}
    ours = [f for f in firing if f[0] == detector and labels.items() <= dict(f[1]).items()]
    assert ours, f"{scenario}: expected a {detector} alert with {labels}; fired: {firing}"
    others = {f[0] for f in firing} - allowed
    assert not others, f"{scenario}: unexpected alerts from {others}: {firing}"
    assert clusters, f"{scenario}: no cluster"
    assert clusters[0] == top_cluster, f"{scenario}: top cluster {clusters[0]}, expected {top_cluster}"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_steady_traffic_fires_nothing(db_path: Path, protocol: str) -> None:
    results, clusters = simulate_and_detect(db_path, ["steady"], protocol=protocol)
    assert all(r.outcome == "ok" for r in results)
    assert [a.summary for r in results for a in r.firing] == []
    assert clusters == []


def test_a_seed_repeats_the_same_requests() -> None:
    end = datetime(2026, 11, 20, 12, 0)
    kwargs = {"seed": 3, "end": end, "history_hours": 0.5, "history_rate": 0.2, "rate": 2.0}
    assert simulate.requests(["kv_eviction"], **kwargs) == simulate.requests(["kv_eviction"], **kwargs)
    assert simulate.requests(["kv_eviction"], **kwargs) != simulate.requests(["kv_eviction"], **{**kwargs, "seed": 4})


def test_two_causes_at_once_are_both_found_as_separate_clusters(db_path: Path) -> None:
    results, clusters = simulate_and_detect(db_path, ["replica_drift", "long_context"])
    fired = {r.detector for r in results if r.firing}
    assert {"replica_skew", "context_length"} <= fired
    assert {"replica_id": "r3"} in clusters[:3]
    assert {"prompt_bucket": "64k+"} in clusters[:3]


def test_clusters_are_served_on_the_api_with_their_fix_and_examples(db_path: Path) -> None:
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    with RunningService(service_settings(db_path)) as svc:
        simulate.run(
            ["replica_drift"], endpoint=svc.grpc_target, protocol="grpc", seed=7, end=end, history_hours=1.0,
            history_rate=0.1, rate=3.0,
        )  # fmt: skip
        request = urllib.request.Request(
            f"{svc.api_url}/v1/detect",
            data=json.dumps({"at": (end + timedelta(seconds=30)).isoformat() + "Z"}).encode(),
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert {r["detector"] for r in json.loads(resp.read())["results"] if r["firing"]} == {"replica_skew"}
        with urllib.request.urlopen(f"{svc.api_url}/v1/clusters?limit=1", timeout=10) as resp:
            [top] = json.loads(resp.read())["clusters"]
    assert top["signature"] == {"replica_id": "r3"}
    assert top["detector"] == "replica_skew"
    assert top["suggested_fix"].startswith("drain and reload the replica")
    assert top["summary"].startswith("replica_id=r3: ")
    assert 1 <= len(top["example_trace_ids"]) <= 5


def test_traffic_labels_are_queryable_per_request_through_the_view(db_path: Path) -> None:
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    with RunningService(service_settings(db_path)) as svc:
        simulate.run(
            ["morning_burst"], endpoint=svc.grpc_target, protocol="grpc", seed=7, end=end, history_hours=0.5,
            history_rate=0.1, rate=3.0,
        )  # fmt: skip
        detection = svc.service.detection
        assert detection is not None
        [result] = detection.run(end + timedelta(seconds=30), ["traffic_pattern"])
        window = (result.window.start, result.window.end)
        ended = svc.rows("SELECT count(*) FROM llm_requests_between(?::TIMESTAMP, ?::TIMESTAMP)", list(window))
        labelled = svc.rows(
            """SELECT count(*), count(DISTINCT (trace_id, span_id)), count(*) FILTER (pattern = 'burst')
               FROM request_traffic_patterns WHERE window_start = ? AND window_end = ?""",
            list(window),
        )
        stored = svc.rows("SELECT sum(requests) FROM traffic_pattern_labels WHERE window_start = ?", [window[0]])
    # Every request of the window once, with the burst among them, from ~one stored row per arrival second.
    [(n, distinct, burst)] = labelled
    assert n == distinct == ended[0][0] == stored[0][0] > 0
    assert burst > 0


def test_two_runs_with_the_same_seed_but_other_scenarios_both_arrive_in_full(db_path: Path) -> None:
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    shape = {"seed": 42, "end": end, "history_hours": 0.1, "history_rate": 0.5, "rate": 2.0}
    with RunningService(service_settings(db_path)) as svc:
        sent = sum(
            simulate.run([name], endpoint=svc.grpc_target, protocol="grpc", **shape)  # type: ignore[arg-type]
            for name in ("replica_drift", "noisy_neighbor")
        )
        # Repeating a run exactly is a retry: its spans are not stored twice.
        simulate.run(["noisy_neighbor"], endpoint=svc.grpc_target, protocol="grpc", **shape)  # type: ignore[arg-type]
        assert svc.rows("SELECT count(*) FROM llm_requests") == [(sent,)]
