"""Incidents: which alerts and clusters are one fault, when it resolves, and what it says (detectors/incidents.py)."""

from __future__ import annotations

import itertools
import json
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import RunningService, service_settings
from receivers import Alertmanager, WebhookReceiver
from waiting import HANG_GUARD, wait_until

from detectors.alerts import Evaluation, fingerprint
from detectors.incidents import (
    ClusterRow,
    Config,
    began,
    build,
    engine_due,
    engine_during,
    engine_window,
    transitions,
)
from detectors.notify import alertmanager_payload, incident_payload
from simulator import model, simulate
from storage.ports import Alert, Incident

T0 = datetime(2026, 11, 28, 12, 0)
CONFIG = Config()
_ids = itertools.count()


def alert(
    detector: str, labels: dict[str, str], started: int, *, resolved: int | None = None, updated: int | None = None,
    explanation: str | None = None, severity: str = "warning", value: float = 2.0,
) -> Alert:  # fmt: skip
    """An alert that started `started` minutes after T0 (and resolved `resolved` minutes after it)."""
    start = T0 + timedelta(minutes=started)
    end = T0 + timedelta(minutes=resolved) if resolved is not None else None
    return Alert(
        alert_id=f"a{next(_ids):03d}", detector=detector, fingerprint=fingerprint(detector, labels), severity=severity,
        state="resolved" if end else "firing", labels=labels, summary=f"{detector} on {labels}", value=value,
        threshold=1.5, window_start=start - timedelta(minutes=5), window_end=start, started_at=start,
        resolved_at=end, updated_at=end or T0 + timedelta(minutes=updated if updated is not None else started),
        explanation=explanation,
    )  # fmt: skip


def cluster(cluster_id: str, signature: dict[str, str], ends: int, *, size: int = 100, bad: int = 30) -> ClusterRow:
    end = T0 + timedelta(minutes=ends)
    return ClusterRow(
        cluster_id=cluster_id, window_start=end - timedelta(minutes=5), window_end=end, signature=signature,
        size=size, bad=bad, excess=bad * 0.8, symptom="latency_tail",
        summary=f"{', '.join(f'{k}={v}' for k, v in signature.items())} is slow 30 % of the time: {bad} of {size}",
        suggested_fix="do the thing", example_trace_ids=(f"t-{cluster_id}",),
    )  # fmt: skip


R3 = {"replica_id": "r3", "signal": "json_adherence"}
SMALLCO = {"tenant_id": "smallco", "signal": "latency_p99"}
AT = T0 + timedelta(minutes=20)


def test_three_faults_in_one_fleet_are_three_incidents_each_with_its_alerts_and_clusters() -> None:
    drift = alert("replica_skew", R3, 0, explanation="explained by cluster 00000000000000c1 on score: ...")
    neighbour = alert("tenant_fairness", SMALLCO, 5)
    kv = alert("cache_curve", {"bucket": "low", "signal": "groundedness"}, 5)
    clusters = [
        cluster("00000000000000c1", {"replica_id": "r3"}, 5),
        cluster("00000000000000c2", {"tenant_id": "smallco"}, 10),
        cluster("00000000000000c3", {"cache_bucket": "low"}, 10),
        cluster("00000000000000c4", {"provider": "x"}, 10),  # ties to no alert: opens nothing
    ]
    incidents = build([drift, neighbour, kv], clusters, CONFIG, AT)
    assert [(i.alert_ids, i.cluster_ids) for i in incidents] == [
        ((drift.alert_id,), ("00000000000000c1",)),
        ((neighbour.alert_id,), ("00000000000000c2",)),
        ((kv.alert_id,), ("00000000000000c3",)),
    ]
    assert [i.title.split(":")[0] for i in incidents] == ["replica r3", "tenant smallco", "cache_bucket=low"]
    assert all(i.state == "open" for i in incidents)


def test_sharing_only_a_deployment_or_model_does_not_join_two_faults() -> None:
    first = alert("token_latency", {"deployment": "d", "model": "m", "tenant_id": "a"}, 0)
    second = alert("token_latency", {"deployment": "d", "model": "m", "tenant_id": "b"}, 2)
    assert len(build([first, second], [], CONFIG, AT)) == 2


def test_a_deployment_wide_alert_joins_only_the_incident_of_the_cluster_it_explains() -> None:
    drift = alert("replica_skew", R3, 0)
    wide = alert("quantization_delta", {"model": "m", "quantization": "int4", "signal": "json_adherence"}, 1,
                 explanation="explained by cluster 00000000000000c1 on score:json_adherence: ...")  # fmt: skip
    other = alert("token_latency", {"deployment": "d", "model": "m"}, 1)
    incidents = build([drift, wide, other], [cluster("00000000000000c1", {"replica_id": "r3"}, 5)], CONFIG, AT)
    assert sorted(i.alert_ids for i in incidents) == [(drift.alert_id, wide.alert_id), (other.alert_id,)]


def test_a_cluster_holding_an_alerts_group_joins_it_only_near_the_alert_in_time() -> None:
    drift = alert("replica_skew", R3, 0, updated=10)
    near = cluster("00000000000000c1", {"replica_id": "r3", "tenant_id": "a"}, 35)  # 25 min after its last pass
    far = cluster("00000000000000c2", {"replica_id": "r3"}, 50)
    [incident] = build([drift], [near, far], CONFIG, AT + timedelta(minutes=40))
    assert incident.cluster_ids == ("00000000000000c1",)


def test_a_flapping_alert_is_one_incident_that_resolves_after_the_hold_off() -> None:
    flaps = [alert("replica_skew", R3, m, resolved=m + 5) for m in (0, 10, 20)]
    assert len({a.fingerprint for a in flaps}) == 1
    at_end = T0 + timedelta(minutes=25)
    [held] = build(flaps, [], CONFIG, at_end + timedelta(seconds=CONFIG.hold_off_seconds - 1))
    assert (held.state, held.resolved_at, held.alert_ids) == ("open", None, tuple(a.alert_id for a in flaps))
    [over] = build(flaps, [], CONFIG, at_end + timedelta(seconds=CONFIG.hold_off_seconds))
    assert (over.state, over.resolved_at, over.incident_id) == ("resolved", at_end, held.incident_id)


def test_a_cluster_joins_an_alert_only_when_it_holds_the_whole_group_up_to_the_edges_of_the_neighbourhood() -> None:
    reach = CONFIG.neighbourhood_seconds // 60
    both = alert("replica_skew", {"replica_id": "r3", "tenant_id": "a", "signal": "x"}, 60, updated=70)
    half = cluster("00000000000000c1", {"replica_id": "r3"}, 65)  # names the replica, not the tenant
    whole = cluster("00000000000000c2", {"replica_id": "r3", "tenant_id": "a"}, 65)
    # Clusters naming the tenant elsewhere make the replica the group's rarer value, looked up first.
    elsewhere = [cluster(f"00000000000000d{i}", {"tenant_id": "a", "model": f"m{i}"}, 65) for i in range(3)]
    [incident] = build([both], [half, whole, *elsewhere], CONFIG, AT + timedelta(hours=3))
    assert incident.cluster_ids == ("00000000000000c2",)

    # A window ending right at the alert's start less the neighbourhood, and one starting right at its last
    # evaluation plus it, are near; a minute further, neither is.
    def joins(ends: int) -> bool:
        found = cluster("00000000000000c3", {"replica_id": "r3", "tenant_id": "a"}, ends)
        return build([both], [found], CONFIG, AT + timedelta(hours=3))[0].cluster_ids == ("00000000000000c3",)

    assert [joins(60 - reach), joins(70 + reach + 5)] == [True, True]
    assert [joins(60 - reach - 1), joins(70 + reach + 6)] == [False, False]


def test_a_refire_after_the_neighbourhood_is_a_new_incident() -> None:
    first = alert("replica_skew", R3, 0, resolved=5)
    reach = CONFIG.neighbourhood_seconds // 60
    at_the_edge = alert("replica_skew", R3, 5 + reach)
    assert len(build([first, at_the_edge], [], CONFIG, AT + timedelta(hours=1))) == 1
    later = alert("replica_skew", R3, 5 + reach + 1)
    assert len(build([first, later], [], CONFIG, AT + timedelta(hours=1))) == 2


def test_a_group_found_again_is_one_cause_only_while_each_finding_follows_the_last_within_the_neighbourhood() -> None:
    drift = alert("replica_skew", R3, 0, resolved=5, explanation="explained by cluster 00000000000000c1 on x: ...")
    reach = CONFIG.neighbourhood_seconds // 60
    # The second window starts right at the first's end plus the neighbourhood; the third a minute past it.
    chain = [
        cluster("00000000000000c1", {"provider": "p"}, 5 + reach),
        cluster("00000000000000c2", {"provider": "p"}, 10 + 2 * reach),
    ]
    gone = cluster("00000000000000c9", {"provider": "p"}, 10 + 3 * reach + 6)
    [incident] = build([drift], [*chain, gone], CONFIG, AT + timedelta(hours=3))
    assert incident.cluster_ids == ("00000000000000c1", "00000000000000c2")
    # One signature whatever order its dimensions were written in.
    pair = [cluster("00000000000000c1", {"provider": "p", "tenant_id": "a"}, 5 + reach),
            cluster("00000000000000c2", {"tenant_id": "a", "provider": "p"}, 10 + 2 * reach)]  # fmt: skip
    assert build([drift], pair, CONFIG, AT + timedelta(hours=3))[0].cluster_ids == (
        "00000000000000c1",
        "00000000000000c2",
    )


def test_incidents_are_the_same_whatever_the_order_of_the_evidence() -> None:
    alerts = [alert("replica_skew", R3, 0), alert("tenant_fairness", SMALLCO, 1), alert("replica_skew", R3, 9)]
    clusters = [
        cluster("00000000000000c1", {"replica_id": "r3"}, 5),
        cluster("00000000000000c2", {"tenant_id": "smallco"}, 5),
    ]
    expected = build(alerts, clusters, CONFIG, AT)
    assert len(expected) == 2
    for a_order in itertools.permutations(alerts):
        assert build(list(a_order), clusters[::-1], CONFIG, AT) == expected


def test_an_incident_says_its_cause_scope_impact_severity_and_fix() -> None:
    kv = [alert("replica_skew", {"replica_id": r, "signal": "groundedness"}, 0, severity=s, value=v,
                explanation="explained by cluster 00000000000000c3 on score:groundedness, which holds ...")
          for r, s, v in (("r0", "warning", 2.0), ("r1", "critical", 4.5))]  # fmt: skip
    slo = alert("slo_burn", {"slo": "latency", "tenant_id": "a"}, 1, value=14.4,
                explanation="explained by cluster 00000000000000c3 on latency_tail: ...")  # fmt: skip
    clusters = [
        cluster("00000000000000c3", {"cache_bucket": "low"}, 5, size=400, bad=390),
        cluster("00000000000000c4", {"cache_bucket": "low"}, 10, size=300, bad=280),
        cluster("00000000000000c5", {"replica_id": "r0"}, 10, size=200, bad=150),  # the same window: not added twice
    ]
    [incident] = build([*kv, slo], clusters, CONFIG, AT)
    assert incident.title.startswith("cache_bucket=low on replicas r0, r1: ")
    assert incident.severity == "critical"  # r1's alert is
    assert incident.cause == {"signature": {"cache_bucket": "low"}, "symptom": "latency_tail",
                              "cluster_id": "00000000000000c3"}  # fmt: skip
    assert incident.scope == {"tenants": ["a"], "replicas": ["r0", "r1"], "deployments": [], "models": []}
    assert incident.impact == {"requests": 700, "bad_requests": 670, "tenants": 1, "replicas": 2, "slo_burn_rate": 14.4}
    assert incident.suggested_fix == "do the thing"
    assert incident.example_trace_ids[0] == "t-00000000000000c3"
    assert "Peak: slo_burn at 14.4 against 1.5" in incident.summary
    assert "Requests in the groups found: 700, 670 of them bad." in incident.summary
    json.dumps(incident.as_row(), default=str)  # storable as it is


def test_the_engine_facts_are_its_replicas_in_its_first_hour_against_the_hour_before() -> None:
    [incident] = build(
        [alert("replica_skew", {"replica_id": "r0", "signal": "x"}, 60)], [], CONFIG, AT + timedelta(hours=2)
    )
    assert incident.started_at == began([alert("replica_skew", {}, 60)], []) == T0 + timedelta(minutes=55)
    start = incident.started_at

    def req(replica: str, minutes: float, queue: int, kv: float | None, preempted: int, cache: float) -> dict[str, Any]:
        return {"replica_id": replica, "end_time": start + timedelta(minutes=minutes), "queue_depth": queue,
                "kv_cache_usage": kv, "preemptions": preempted, "cache_hit_ratio": cache}  # fmt: skip

    frame = pl.DataFrame([
        req("r0", -30, 1, 0.4, 0, 0.9), req("r0", -61, 50, 0.9, 1, 0.0),  # before the hour before: not read
        req("r0", 10, 9, 0.9, 2, 0.2), req("r0", 59, 11, None, 0, 0.4), req("r0", 61, 90, 1.0, 5, 0.0),
        req("r1", 10, 40, 1.0, 3, 0.0),  # another replica: not this incident's
    ])  # fmt: skip
    engine = engine_during(frame, incident, AT + timedelta(hours=2))
    assert engine.pop("through") == (start + timedelta(hours=1)).isoformat()
    assert engine == {
        "queue_depth": {"during": 10.0, "before": 1.0},
        "kv_cache_usage": {"during": 0.9, "before": 0.4},
        "preempted_share": {"during": 0.5, "before": 0.0},
        "cache_hit_ratio": {"during": pytest.approx(0.3), "before": 0.9},
        "queue_by_replica": {"r0": 10.0},
    }
    # Read again after it grew, its hour before stands as first read: only its first hour is read.
    first_hour = frame.filter(pl.col("end_time") >= start)
    known = {"queue_depth": {"during": 1.0, "before": 7.0}, "through": start.isoformat()}
    again = engine_during(first_hour, incident, AT + timedelta(hours=2), known)
    assert again["queue_depth"] == {"during": 10.0, "before": 7.0}
    assert again["kv_cache_usage"] == {"during": 0.9, "before": None}  # none known before
    # An incident that ended within its first hour: what came after its end is not its hour.
    ended = replace(incident, resolved_at=start + timedelta(minutes=30))
    assert engine_during(frame, ended, AT + timedelta(hours=2))["queue_depth"]["during"] == 9.0
    # A replay as of a time before it ended reads up to that time only.
    assert engine_window(ended, start + timedelta(minutes=20))[2] == start + timedelta(minutes=20)
    later = AT + timedelta(hours=2)
    none = engine_during(frame.filter(pl.col("replica_id") == "r9"), incident, later)
    assert none == {"through": (start + timedelta(hours=1)).isoformat()}  # read, and nothing found


def test_engine_facts_are_read_when_it_opens_or_grows_and_once_more_when_its_first_hour_is_over() -> None:
    first = alert("replica_skew", R3, 0)
    [young] = build([first], [], CONFIG, AT)
    hour_over = young.started_at + timedelta(hours=1)

    def read_at(at: datetime) -> Incident:
        return replace(young, engine={"through": engine_window(young, at)[2].isoformat()})

    kept = read_at(AT)
    assert not engine_due(kept, young, AT + timedelta(minutes=5))  # young and unchanged: what was read stands
    assert engine_due(kept, young, hour_over)  # its first hour is over: read it whole, once
    assert not engine_due(read_at(hour_over), young, hour_over + timedelta(hours=3))
    # An alert more on the same replica changes no engine fact; one on another replica, or an earlier start, does.
    [grown] = build([first, alert("replica_skew", R3, 4)], [], CONFIG, AT)
    assert not engine_due(kept, grown, AT + timedelta(minutes=5))
    wider = replace(young, scope={**young.scope, "replicas": ["r3", "r4"]})
    assert engine_due(kept, wider, AT + timedelta(minutes=5))
    assert engine_due(kept, replace(young, started_at=young.started_at - timedelta(minutes=5)), AT)
    ended = replace(young, state="resolved", resolved_at=AT + timedelta(minutes=10))
    assert engine_due(kept, ended, AT + timedelta(minutes=30)) and not engine_due(
        read_at(ended.resolved_at), ended, AT + timedelta(hours=5)
    )


def test_an_incident_pages_when_it_opens_grows_changes_severity_and_resolves_and_not_otherwise() -> None:
    first = alert("replica_skew", R3, 0)
    [opened] = build([first], [], CONFIG, AT)
    same = replace(opened, updated_at=opened.updated_at + timedelta(minutes=5), summary="refreshed")
    grown = replace(opened, alert_ids=(*opened.alert_ids, "a-new"))
    clustered = replace(opened, cluster_ids=("c-new",))
    graver = replace(opened, severity="critical")
    resolved = replace(opened, state="resolved", resolved_at=AT)
    kept = {opened.incident_id: opened}
    assert transitions({}, [opened]) == [("opened", opened)]
    assert transitions({}, [resolved]) == []  # first seen already over: nobody to page
    assert transitions(kept, [same]) == []
    for changed in (grown, clustered, graver):
        assert transitions(kept, [changed]) == [("updated", changed)]
    assert transitions(kept, [resolved]) == [("resolved", resolved)]
    assert transitions({opened.incident_id: resolved}, [resolved]) == []


def test_webhooks_get_the_incident_whole_and_alertmanager_its_id_on_each_alert() -> None:
    first = alert("replica_skew", R3, 0)
    [incident] = build([first], [], CONFIG, AT)
    body = incident_payload("opened", incident)
    assert (body["receiver"], body["kind"], body["status"], body["transition"]) == (
        "tailwatch", "incident", "firing", "opened",
    )  # fmt: skip
    assert body["incident"]["incident_id"] == incident.incident_id and body["incident"]["scope"]["replicas"] == ["r3"]
    assert body["incident"]["started_at"].endswith("Z")
    assert incident_payload("resolved", incident)["status"] == "resolved"
    evaluation = Evaluation(fired=[first])
    [sent] = alertmanager_payload(evaluation, AT, {first.alert_id: incident})
    assert sent["labels"]["incident_id"] == incident.incident_id
    assert sent["annotations"] == {"summary": first.summary, "incident": incident.title}
    [alone] = alertmanager_payload(evaluation, AT)
    assert "incident_id" not in alone["labels"] and "incident" not in alone["annotations"]


def test_its_impact_makes_an_incident_critical_many_bad_requests_or_a_fast_burning_budget() -> None:
    drift = alert("replica_skew", R3, 0, explanation="explained by cluster 00000000000000c1 on latency_tail: ...")
    bad = CONFIG.critical_bad_requests

    def severity(bad_requests: int, burn: float | None = None) -> str:
        slo = [alert("slo_burn", {"slo": "s", "replica_id": "r3"}, 1, value=burn)] if burn is not None else []
        found = [cluster("00000000000000c1", {"replica_id": "r3"}, 5, size=5000, bad=bad_requests)]
        [incident] = build([drift, *slo], found, CONFIG, AT)
        return incident.severity

    assert (severity(bad - 1), severity(bad)) == ("warning", "critical")
    assert (severity(0, burn=14.3), severity(0, burn=14.4)) == ("warning", "critical")


def test_an_incidents_severity_is_its_gravest_alerts_without_impact() -> None:
    def severity(*levels: str, config: Config = CONFIG) -> str:
        alerts = [alert("replica_skew", R3, i, severity=level) for i, level in enumerate(levels)]
        [incident] = build(alerts, [], config, AT)
        return incident.severity

    assert severity("warning", "critical", "info") == "critical"
    assert severity("info", "warning") == severity("warning", "info") == "warning"
    assert severity("info") == "info"
    # No cluster: no count of bad requests, so even a bar of one is not reached.
    assert severity("info", config=Config(critical_bad_requests=1)) == "info"


def test_impact_counts_a_windows_largest_cluster_and_says_none_where_nothing_was_counted() -> None:
    drift = alert("replica_skew", R3, 0, value=9.0)
    [alone] = build([drift], [], CONFIG, AT)
    assert alone.impact == {"requests": None, "bad_requests": None, "tenants": 0, "replicas": 1, "slo_burn_rate": None}
    # Two clusters of one window the same size: the one with more bad requests speaks for it, whichever comes first.
    same = [cluster("00000000000000c1", {"replica_id": "r3"}, 5, size=100, bad=40),
            cluster("00000000000000c2", {"replica_id": "r3", "tenant_id": "a"}, 5, size=100, bad=60)]  # fmt: skip
    for found in (same, same[::-1]):
        [incident] = build([drift], found, CONFIG, AT)
        assert (incident.impact["requests"], incident.impact["bad_requests"]) == (100, 60)
    # A cluster stored before clusters counted bad requests adds none.
    legacy = replace(cluster("00000000000000c3", {"replica_id": "r3"}, 10), bad=None)
    assert build([drift], [legacy], CONFIG, AT)[0].impact["bad_requests"] == 0


def test_an_incident_without_a_cluster_is_titled_by_its_first_alert_group_and_fact() -> None:
    drift = replace(
        alert("replica_skew", R3, 0),
        summary="replica r3: json_adherence mean 0.82 vs 0.88 on the rest of the fleet (−0.06) over 12:00–12:05 UTC",
    )
    [incident] = build([drift], [], CONFIG, AT)
    assert incident.title == "replica r3: json_adherence mean 0.82 vs 0.88 on the rest of the fleet"
    # A cluster's summary names its group as clusters do: two dimensions, one subject.
    both = cluster("00000000000000c1", {"tenant_id": "a", "replica_id": "r3"}, 5)
    both = replace(both, summary="tenant a with replica r3 is slow 30 % of the time since 12:00 UTC: 30 of 100")
    [joined] = build([drift], [both], CONFIG, AT)
    assert joined.title == "replica r3, tenant a: is slow 30 % of the time since 12:00 UTC"


def test_a_cluster_alone_opens_no_incident_and_no_alerts_none() -> None:
    assert build([], [cluster("00000000000000c1", {"replica_id": "r3"}, 5)], CONFIG, AT) == []


def test_an_incident_is_named_by_its_first_alert_and_keeps_that_id_as_it_grows() -> None:
    first = alert("replica_skew", R3, 0)
    [alone] = build([first], [], CONFIG, AT)
    grown = build([first, replace(alert("replica_skew", R3, 3), fingerprint="other")], [], CONFIG, AT)
    assert [i.incident_id for i in grown] == [alone.incident_id]


def simulated(
    db: Path, scenario: str, alerting: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    """`scenario` sent to a real service, one detection pass after it: the incidents `GET /v1/incidents` lists,
    the `/metrics` text and the OpenAPI document."""
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    shape: dict[str, Any] = {"seed": 7, "end": end, "history_hours": 2.0, "history_rate": 0.1, "rate": 3.0}
    settings = service_settings(db, scheduler=False, metrics={"interval_seconds": 5}, alerting=alerting or {})
    with RunningService(settings) as svc:
        simulate.run([scenario], endpoint=svc.grpc_target, protocol="grpc", **shape)
        svc.wait_committed()
        detection = svc.service.detection
        assert detection is not None
        detection.run(end + timedelta(seconds=30))

        def get(path: str) -> Any:
            with urllib.request.urlopen(svc.api_url + path, timeout=HANG_GUARD) as response:
                body = response.read().decode()
            return json.loads(body) if path != "/metrics" else body

        return get("/v1/incidents?state=open")["incidents"], get("/metrics"), get("/openapi.json")


def test_three_simultaneous_causes_are_three_open_incidents_each_naming_its_cause(tmp_path: Path) -> None:
    incidents, metrics, openapi = simulated(tmp_path / "three.duckdb", "three_causes")
    by_cause = {i["title"].split(":")[0]: i for i in incidents}
    r0, r1, r3 = (model.pod(r) for r in ("r0", "r1", "r3"))
    assert set(by_cause) == {f"replica {r3}", "tenant smallco", f"cache_bucket=low on replicas {r0}, {r1}"}
    assert by_cause[f"replica {r3}"]["scope"]["replicas"] == [r3]
    assert by_cause["tenant smallco"]["scope"]["tenants"] == ["smallco"]
    kv = by_cause[f"cache_bucket=low on replicas {r0}, {r1}"]
    assert len(kv["alert_ids"]) == 3  # cache_curve's low bucket, replica_skew on each pod
    assert kv["impact"]["bad_requests"] > 0 and kv["suggested_fix"].startswith("KV-cache pressure")
    # Its pods served from cache a fraction as often as in the hour before, and queued more.
    cache, queue = kv["engine"]["cache_hit_ratio"], kv["engine"]["queue_depth"]
    assert cache["during"] < 0.5 * cache["before"] and queue["during"] > queue["before"]
    assert set(kv["engine"]["queue_by_replica"]) == {r0, r1}
    assert "Engines in its first hour against the hour before: queue depth" in kv["summary"]
    for incident in incidents:
        assert incident["state"] == "open" and incident["cluster_ids"] and incident["example_trace_ids"]
        assert incident["summary"].startswith("Since ")
    # The pods' incident holds over a thousand bad requests: critical, whatever its alerts said.
    assert kv["severity"] == "critical" and kv["impact"]["bad_requests"] >= 1000
    assert 'tailwatch_incidents_open{severity="warning"} 2.0' in metrics
    assert 'tailwatch_incidents_open{severity="critical"} 1.0' in metrics
    assert "/v1/incidents" in openapi["paths"] and "Incident" in openapi["components"]["schemas"]


def test_healthy_traffic_opens_no_incident(tmp_path: Path) -> None:
    incidents, metrics, _ = simulated(tmp_path / "steady.duckdb", "steady")
    assert incidents == []
    assert 'tailwatch_incidents_open{severity="warning"} 0.0' in metrics


def test_each_incident_is_one_page_grouped_by_its_id_in_a_real_alertmanager_and_one_webhook_post(
    tmp_path: Path,
) -> None:
    pages = WebhookReceiver()  # where Alertmanager sends its notifications
    ours = WebhookReceiver()  # Tailwatch's own webhook
    route = (
        "route:\n  receiver: pages\n  group_by: [incident_id]\n  group_wait: 1s\n  group_interval: 1s\n"
        f"  repeat_interval: 1h\nreceivers:\n  - name: pages\n    webhook_configs:\n      - url: '{pages.url}'\n"
    )
    manager = Alertmanager(tmp_path, route)
    try:
        incidents, _, _ = simulated(
            tmp_path / "paged.duckdb", "three_causes",
            {"alertmanager_url": manager.url, "webhook_urls": [ours.url], "backoff_seconds": 0.1},
        )  # fmt: skip
        by_id = {i["incident_id"]: i for i in incidents}

        def latest() -> dict[str, Any]:
            return {p["groupLabels"]["incident_id"]: p for p in list(pages.bodies)}

        # Alertmanager pages once an incident opens and again as its alerts arrive, each page one incident's.
        wait_until(
            lambda: (
                {i: len(p["alerts"]) for i, p in latest().items()}
                == {i: len(incident["alert_ids"]) for i, incident in by_id.items()}
            ),
            "a page an incident, holding all of its alerts",
        )
        for incident_id, page in latest().items():
            assert {a["annotations"]["incident"] for a in page["alerts"]} == {by_id[incident_id]["title"]}
            assert {a["labels"]["incident_id"] for a in page["alerts"]} == {incident_id}
        # One post to Tailwatch's own webhook an incident: opened, with the incident whole.
        wait_until(lambda: len(ours.bodies) == 3, "an opened post an incident")
        assert sorted((b["kind"], b["transition"], b["incident"]["incident_id"]) for b in ours.bodies) == sorted(
            ("incident", "opened", i) for i in by_id
        )
    finally:
        manager.close()
        pages.close()
        ours.close()
