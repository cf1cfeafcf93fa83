"""Alert state: one firing alert per fingerprint, hold-down, refresh, resolution."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from detectors.alerts import Alert, Evaluation, evaluate, fingerprint
from detectors.base import Condition, Severity, Window

T0 = datetime(2026, 11, 20, 12, 0)
W = Window(T0 - timedelta(minutes=5), T0)


def cond(tenant: str = "smallco", value: float = 2.0, severity: Severity | None = None) -> Condition:
    return Condition({"tenant_id": tenant}, value, 1.5, f"tenant {tenant} is slow", severity)


def run(
    conditions: list[Condition],
    firing: Mapping[str, Alert] | None = None,
    breaches: Mapping[str, int] | None = None,
    for_evaluations: int = 1,
    at: datetime = T0,
) -> Evaluation:
    return evaluate(
        "tenant_fairness",
        conditions,
        firing or {},
        breaches or {},
        for_evaluations=for_evaluations,
        default_severity=Severity.WARNING,
        window=W,
        at=at,
    )


def test_fingerprint_depends_on_detector_and_labels_only() -> None:
    assert fingerprint("d", {"a": "1", "b": "2"}) == fingerprint("d", {"b": "2", "a": "1"})
    assert fingerprint("d", {"a": "1"}) != fingerprint("e", {"a": "1"})


def test_first_breach_fires_and_a_second_breach_refreshes_the_same_alert() -> None:
    first = run([cond(value=2.0)])
    assert len(first.fired) == 1
    alert = first.fired[0]
    assert (alert.state, alert.severity, alert.started_at) == ("firing", "warning", T0)
    later = T0 + timedelta(minutes=5)
    second = run([cond(value=3.0)], firing={alert.fingerprint: alert}, breaches=first.breaches, at=later)
    assert second.fired == [] and len(second.updated) == 1
    assert second.updated[0].alert_id == alert.alert_id
    assert second.updated[0].value == 3.0 and second.updated[0].started_at == T0


def test_a_refreshed_alert_takes_the_severity_and_threshold_of_the_condition_that_still_holds() -> None:
    """A detector may escalate a group (warning to critical) or run with a changed threshold; the alert says so."""
    alert = run([cond(value=2.0)]).fired[0]
    assert (alert.severity, alert.threshold) == ("warning", 1.5)
    later = T0 + timedelta(minutes=5)
    worse = Condition({"tenant_id": "smallco"}, 4.0, 3.0, "tenant smallco is very slow", Severity.CRITICAL)
    [updated] = run([worse], firing={alert.fingerprint: alert}, at=later).updated
    assert updated.alert_id == alert.alert_id
    assert (updated.severity, updated.threshold, updated.value, updated.summary) == (
        "critical",
        3.0,
        4.0,
        "tenant smallco is very slow",
    )
    assert (updated.started_at, updated.updated_at) == (T0, later)


def test_hold_down_waits_for_consecutive_breaches() -> None:
    one = run([cond()], for_evaluations=3)
    assert one.fired == [] and list(one.breaches.values()) == [1]
    two = run([cond()], breaches=one.breaches, for_evaluations=3)
    assert two.fired == []
    three = run([cond()], breaches=two.breaches, for_evaluations=3)
    assert len(three.fired) == 1
    # A clear evaluation resets the count.
    assert run([], breaches=two.breaches, for_evaluations=3).breaches == {}


def test_the_alert_resolves_when_the_condition_clears() -> None:
    alert = run([cond()]).fired[0]
    cleared = run([], firing={alert.fingerprint: alert}, at=T0 + timedelta(minutes=5))
    assert len(cleared.resolved) == 1
    resolved = cleared.resolved[0]
    assert (resolved.state, resolved.resolved_at) == ("resolved", T0 + timedelta(minutes=5))
    assert cleared.firing == []


def test_condition_severity_overrides_the_detector_default() -> None:
    assert run([cond(severity=Severity.CRITICAL)]).fired[0].severity == "critical"


def test_two_groups_are_two_alerts() -> None:
    out = run([cond("a"), cond("b"), cond("a")])
    assert sorted(a.labels["tenant_id"] for a in out.fired) == ["a", "b"]


def test_an_alert_row_stores_its_labels_as_json_with_sorted_keys() -> None:
    """The stored text is canonical, so the same labels compare equal in SQL whatever order a detector used."""
    condition = Condition({"model": "llama", "deployment": "vllm-a"}, 2.4, 2.0, "tpot p99 is 2.4x the baseline")
    alert = run([condition]).fired[0]
    row = alert.as_row()
    assert row["labels"] == '{"deployment": "vllm-a", "model": "llama"}'
    assert {k: v for k, v in row.items() if k != "labels"} == {k: v for k, v in alert.__dict__.items() if k != "labels"}
