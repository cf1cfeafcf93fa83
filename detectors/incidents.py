"""incidents: one story per fault. The alerts and clusters one cause produced, tied together, in the words a
person paged reads first.

Pure: `build` takes the alerts and clusters of a lookback and returns the incidents they make, as of `at`. The
rules (docs/incidents.md):

- An incident opens with a firing alert; a cluster alone opens none.
- Two alerts are one incident when they name the same specific group (a replica, a tenant, a bucket, a variant,
  a traffic pattern, a prompt bucket: any dimension but `deployment` and `model`) and the later one started
  within `neighbourhood_seconds` of the earlier one's last evaluation, or when they are one alert firing again
  (the same fingerprint) within that time: a flapping alert is one incident.
- An alert and a cluster are one incident when the alert's explanation names the cluster (the cluster holds the
  alert's group's bad requests), or when the cluster's signature holds the alert's specific group and its
  window lies within `neighbourhood_seconds` of the alert's firing. A cluster of the same signature found again
  in a window starting within `neighbourhood_seconds` of the previous finding's end is the same cause.
- A deployment or model is no cause: two alerts sharing only those stay apart, and an alert naming no specific
  group joins only the incident of a cluster its explanation names.
- An incident resolves when every alert in it has resolved and `hold_off_seconds` have passed since the last
  did; an alert joining it before that keeps it open, the same incident.

Deterministic: the same alerts and clusters give the same incidents, whatever their order; an incident's id is
that of its earliest alert.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

import polars as pl
from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel, ConfigDict, Field

from detectors.changes import introduced
from detectors.clusters import EXPLAINED_BY, NOUNS, alert_group, clock, subject
from detectors.slo_burn import PAGE_BURN_RATE
from storage.ports import Alert, Change, ChangeStore, Incident, IncidentStore, Requests, Window, WindowSource

_KEPT = 10_000  # incidents of one lookback, far more than a fleet has

# Sharing these says nothing about a cause: a fleet's faults all share its deployment and model.
BROAD = frozenset({"deployment", "model"})
SEVERITIES = ("info", "warning", "critical")
_EXPLAINED_BY = re.compile(rf"{EXPLAINED_BY} ([0-9a-f]{{16}})")


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Tie alerts and clusters into incidents after each detection pass.")
    neighbourhood_seconds: int = Field(
        1800, gt=0, description="Alerts on one group this close in time, and clusters this close to them, are one "
        "incident."
    )  # fmt: skip
    hold_off_seconds: int = Field(
        900, ge=0, description="An incident resolves this long after its last alert did; a re-fire before that "
        "keeps it open."
    )  # fmt: skip
    lookback_hours: float = Field(
        24.0, gt=0, description="Alerts resolved and clusters found this long ago are still read to build incidents."
    )
    examples: int = Field(5, ge=0, description="Example traces an incident lists.")
    critical_bad_requests: int = Field(
        1000, ge=1, description="An incident with this many bad requests is critical, whatever its alerts say."
    )
    change_lookback_minutes: int = Field(
        30, ge=0, description="An incident lists the changes in its scope (changes) from this long before it "
        "started to its first alert."
    )  # fmt: skip


@dataclass(frozen=True)
class ClusterRow:
    """What an incident reads of a `clusters` row."""

    cluster_id: str
    window_start: datetime
    window_end: datetime
    signature: dict[str, str]
    size: int
    bad: int | None
    excess: float | None
    symptom: str | None
    summary: str
    suggested_fix: str
    example_trace_ids: tuple[str, ...]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ClusterRow:
        return cls(
            cluster_id=str(row["cluster_id"]), window_start=row["window_start"], window_end=row["window_end"],
            signature=json.loads(row["signature"]), size=int(row["size"]), bad=row.get("bad"),
            excess=row.get("excess"), symptom=row.get("symptom"), summary=str(row["summary"]),
            suggested_fix=str(row["suggested_fix"]), example_trace_ids=tuple(row.get("example_trace_ids") or ()),
        )  # fmt: skip


def specific(alert: Alert) -> dict[str, str]:
    """The group an alert names, less what names no cause (deployment, model)."""
    return {k: v for k, v in alert_group(alert.detector, alert.labels).items() if k not in BROAD}


def explained_by(alert: Alert) -> str | None:
    """The cluster an alert's explanation names, if it names one."""
    found = _EXPLAINED_BY.search(alert.explanation or "")
    return found.group(1) if found else None


def _last_seen(alert: Alert) -> datetime:
    """When the alert was last evaluated firing: its resolution, or its latest refresh."""
    return alert.resolved_at or alert.updated_at


def _holds(cluster: ClusterRow, group: Mapping[str, str]) -> bool:
    return bool(group) and all(cluster.signature.get(k) == v for k, v in group.items())


def _near(cluster: ClusterRow, alert: Alert, reach: timedelta) -> bool:
    return cluster.window_end >= alert.started_at - reach and cluster.window_start <= _last_seen(alert) + reach


class _Parts:
    """Union-find over alerts and clusters, by id."""

    def __init__(self, ids: Iterable[str]) -> None:
        self._up = {i: i for i in ids}

    def find(self, i: str) -> str:
        while self._up[i] != i:
            self._up[i] = self._up[self._up[i]]
            i = self._up[i]
        return i

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self._up[max(ra, rb)] = min(ra, rb)


EngineOf = Callable[[Incident], Mapping[str, Any]]


Members = tuple[list[Alert], list[ClusterRow]]


def group(alerts: Sequence[Alert], clusters: Sequence[ClusterRow], config: Config) -> list[Members]:
    """Which alerts and clusters are one incident: each incident's alerts (oldest first) and clusters."""
    reach = timedelta(seconds=config.neighbourhood_seconds)
    alerts = sorted(alerts, key=lambda a: (a.started_at, a.alert_id))
    by_cluster = {c.cluster_id: c for c in clusters}
    parts = _Parts([*(f"a:{a.alert_id}" for a in alerts), *(f"c:{c}" for c in by_cluster)])
    groups = {a.alert_id: specific(a) for a in alerts}
    # The clusters naming each dimension's value: an alert's group is looked up, not tested against every cluster.
    naming: dict[tuple[str, str], list[ClusterRow]] = {}
    for c in clusters:
        for item in c.signature.items():
            naming.setdefault(item, []).append(c)
    for i, a in enumerate(alerts):
        for b in alerts[i + 1 :]:
            if b.started_at > _last_seen(a) + reach:
                break  # the alerts are in order of start: every later one began later still
            same_group = groups[a.alert_id] and groups[a.alert_id].items() & groups[b.alert_id].items()
            if same_group or a.fingerprint == b.fingerprint:
                parts.join(f"a:{a.alert_id}", f"a:{b.alert_id}")
        named = explained_by(a)
        if named in by_cluster:
            parts.join(f"a:{a.alert_id}", f"c:{named}")
        mine = groups[a.alert_id]
        candidates = min((naming.get(item, []) for item in mine.items()), key=len, default=[])
        for c in candidates:
            if _holds(c, mine) and _near(c, a, reach):
                parts.join(f"a:{a.alert_id}", f"c:{c.cluster_id}")
    # One group found again in the windows after: the same cause, as long as each finding follows the one before
    # within the neighbourhood.
    ordered = sorted(clusters, key=lambda c: (c.window_end, c.cluster_id))
    last: dict[str, ClusterRow] = {}
    for c in ordered:
        key = json.dumps(c.signature, sort_keys=True)
        before = last.get(key)
        if before is not None and c.window_start <= before.window_end + reach:
            parts.join(f"c:{before.cluster_id}", f"c:{c.cluster_id}")
        last[key] = c
    members: dict[str, Members] = {}
    for a in alerts:  # oldest first: an incident's first alert is its earliest
        members.setdefault(parts.find(f"a:{a.alert_id}"), ([], []))[0].append(a)
    for c in ordered:
        root = parts.find(f"c:{c.cluster_id}")
        if root in members:  # a cluster that no alert ties to opens nothing
            members[root][1].append(c)
    return list(members.values())


def render(
    members: Sequence[Members], config: Config, at: datetime, engine_of: EngineOf = lambda _: {}, *,
    changes: Sequence[Change] = (),
) -> list[Incident]:  # fmt: skip
    """Each incident as it reads, oldest first; `engine_of` says what the engines showed during one
    (`engine_during`), for its summary; `changes`, what changed in the fleet, for those shortly before one."""
    incidents = [_incident(a, c, config, at, engine_of, changes=changes) for a, c in members]
    return sorted(incidents, key=lambda i: (i.started_at, i.incident_id))


def build(
    alerts: Sequence[Alert], clusters: Sequence[ClusterRow], config: Config, at: datetime,
    engine_of: EngineOf = lambda _: {}, *, changes: Sequence[Change] = (),
) -> list[Incident]:  # fmt: skip
    """The incidents the alerts and clusters make as of `at`, oldest first."""
    return render(group(alerts, clusters, config), config, at, engine_of, changes=changes)


def _incident(
    alerts: list[Alert], clusters: list[ClusterRow], config: Config, at: datetime, engine_of: EngineOf, *,
    changes: Sequence[Change] = (),
) -> Incident:  # fmt: skip
    first = alerts[0]
    resolved = [a.resolved_at for a in alerts if a.resolved_at is not None]
    last_resolved = max(resolved) if len(resolved) == len(alerts) else None
    hold_off = timedelta(seconds=config.hold_off_seconds)
    over = last_resolved is not None and at >= last_resolved + hold_off
    strongest = max(clusters, key=lambda c: (c.excess or 0.0, c.size, c.cluster_id), default=None)
    scope = _scope(alerts, clusters)
    impact = _impact(alerts, clusters, scope)
    severity = _severity(alerts, impact, config)
    title = _title(first, strongest, scope)
    examples: list[str] = []
    for c in sorted(clusters, key=lambda c: -(c.excess or 0.0)):
        examples += [t for t in c.example_trace_ids if t not in examples]
    incident = Incident(
        incident_id=hashlib.sha256(f"incident/{first.alert_id}".encode()).hexdigest()[:16],
        state="resolved" if over else "open",
        started_at=began(alerts, clusters),
        updated_at=max([*(a.updated_at for a in alerts), *(c.window_end for c in clusters)]),
        resolved_at=last_resolved if over else None,
        severity=severity,
        title=title,
        summary="",
        cause=_cause(first, strongest),
        scope=scope,
        impact=impact,
        engine={},
        alert_ids=tuple(a.alert_id for a in alerts),
        cluster_ids=tuple(c.cluster_id for c in clusters),
        change_ids=(),
        suggested_fix=strongest.suggested_fix if strongest else None,
        example_trace_ids=tuple(examples[: config.examples]),
    )
    before = changes_before(incident, first, changes, config)
    named = [c for c in before if names(incident.cause, c)]
    if named:
        title = f"{since(named[-1])}: {title}"
    incident = replace(incident, engine=dict(engine_of(incident)), change_ids=tuple(c.change_id for c in before),
                       title=title)  # fmt: skip
    return replace(incident, summary=_summary(incident, alerts, strongest, at, before))


def changes_before(incident: Incident, first: Alert, changes: Sequence[Change], config: Config) -> list[Change]:
    """The changes in an incident's scope from `change_lookback_minutes` before it started to its first alert,
    oldest first: of a deployment, replica or model it touched, or any where it names none of these."""
    earliest = incident.started_at - timedelta(minutes=config.change_lookback_minutes)
    scope = incident.scope
    fleet_wide = not (scope["deployments"] or scope["replicas"] or scope["models"])

    def touches(change: Change) -> bool:
        return (
            change.scope.get("deployment") in scope["deployments"]
            or bool(set(change.scope.get("replicas", ())) & set(scope["replicas"]))
            or change.scope.get("model") in scope["models"]
        )

    found = [c for c in changes if earliest <= c.at <= first.started_at and (fleet_wide or touches(c))]
    return sorted(found, key=lambda c: (c.at, c.change_id))


def names(cause: Mapping[str, Any], change: Change) -> bool:
    """Whether an incident's cause is what a change brought: a replica it added or changed, or a value it
    introduced (`quantization=int4`, `model=…`)."""
    signature = cause.get("signature") or {}
    brought = set(change.scope.get("added", ())) | set(change.scope.get("changed", ()))
    return signature.get("replica_id") in brought or any(
        signature.get(key) == value for key, value in change.after.items() if key != "replicas"
    )


def since(change: Change) -> str:
    """How a title names the change before its cause: `since rollout 1.5.0, int4 of vllm-b at 12:03 UTC`."""
    return f"since {change.kind} {introduced(change)} of {change.scope.get('deployment')} at {clock(change.at)}"


def began(alerts: Sequence[Alert], clusters: Sequence[ClusterRow]) -> datetime:
    """When the fault began: the start of the earliest window its evidence was seen in. An alert fires at the end
    of the window it breached in, so it began a window (its detector's, as the alert's window spans) before."""
    firsts = [a.started_at - (a.window_end - a.window_start) for a in alerts]
    return min(firsts + [c.window_start for c in clusters])


def _severity(alerts: Sequence[Alert], impact: Mapping[str, Any], config: Config) -> str:
    """Its alerts' gravest, raised to critical by its impact: many bad requests, or an SLO budget burning fast."""
    gravest = max((a.severity for a in alerts), key=_rank)
    burning = (impact["slo_burn_rate"] or 0.0) >= PAGE_BURN_RATE
    if burning or (impact["bad_requests"] or 0) >= config.critical_bad_requests:
        return "critical"
    return gravest


def _rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


def _named(group: Mapping[str, str]) -> str:
    return ", ".join(f"{NOUNS[k]} {v}" if k in NOUNS else f"{k}={v}" for k, v in sorted(group.items()))


def _lead(text: str) -> str:
    """The plain fact a summary leads with: up to its first clause of counts or statistics."""
    for stop in (": ", " (", "; ", ". "):
        if stop in text:
            text = text[: text.index(stop)]
    return text.strip().rstrip(".")


def _fact(group: Mapping[str, str], text: str) -> str:
    """`group: what happened`: the summary's own naming of the group taken off its front (a cluster's names it
    as clusters' `subject` does, an alert's as `group: …`), then its plain fact."""
    named = _named(group)
    for prefix in (f"{named}: ", f"{subject(group)[0]} "):
        text = text.removeprefix(prefix)
    return f"{named}: {_lead(text)}"


def _title(first: Alert, strongest: ClusterRow | None, scope: Mapping[str, list[str]]) -> str:
    """The cause first: the strongest cluster's group, where (replicas) when the group does not say, and what."""
    if strongest is None:
        group = specific(first) or alert_group(first.detector, first.labels)
        return _fact(group, first.summary) if group else f"{first.detector}: {_lead(first.summary)}"
    title = _fact(strongest.signature, strongest.summary)
    replicas = scope["replicas"]
    if "replica_id" not in strongest.signature and 0 < len(replicas) <= 3:
        where = f" on replica{'s' if len(replicas) > 1 else ''} {', '.join(replicas)}"
        named = _named(strongest.signature)
        title = named + where + title[len(named) :]
    return title


def _cause(first: Alert, strongest: ClusterRow | None) -> dict[str, Any]:
    if strongest is not None:
        return {"signature": strongest.signature, "symptom": strongest.symptom, "cluster_id": strongest.cluster_id}
    group = alert_group(first.detector, first.labels)
    return {"signature": group, "symptom": first.labels.get("signal"), "alert_id": first.alert_id}


_SCOPE = {"tenant_id": "tenants", "replica_id": "replicas", "deployment": "deployments", "model": "models"}


def _scope(alerts: list[Alert], clusters: list[ClusterRow]) -> dict[str, list[str]]:
    seen: dict[str, set[str]] = {name: set() for name in _SCOPE.values()}
    groups = [alert_group(a.detector, a.labels) for a in alerts] + [c.signature for c in clusters]
    for group in groups:
        for key, name in _SCOPE.items():
            if key in group:
                seen[name].add(group[key])
    return {name: sorted(values) for name, values in seen.items()}


def _impact(alerts: list[Alert], clusters: list[ClusterRow], scope: Mapping[str, list[str]]) -> dict[str, Any]:
    # A window's clusters are one cause seen several ways: its largest speaks for the window's requests.
    per_window: dict[tuple[datetime, datetime], ClusterRow] = {}
    for c in clusters:
        key = (c.window_start, c.window_end)
        if key not in per_window or (c.size, c.bad or 0) > (per_window[key].size, per_window[key].bad or 0):
            per_window[key] = c
    burned = [a.value for a in alerts if a.detector == "slo_burn" and a.value is not None]
    return {
        "requests": sum(c.size for c in per_window.values()) if per_window else None,
        "bad_requests": sum(c.bad or 0 for c in per_window.values()) if per_window else None,
        "tenants": len(scope["tenants"]),
        "replicas": len(scope["replicas"]),
        "slo_burn_rate": max(burned) if burned else None,
    }


def _summary(
    incident: Incident, alerts: list[Alert], strongest: ClusterRow | None, at: datetime, changes: Sequence[Change]
) -> str:
    end = incident.resolved_at or at
    minutes = int((end - incident.started_at).total_seconds() // 60)
    state = f"resolved at {clock(incident.resolved_at)}" if incident.resolved_at else "still open"
    out = [f"Since {clock(incident.started_at)} on {incident.started_at:%Y-%m-%d} ({minutes} min, {state})."]
    peak = max(
        (a for a in alerts if a.value is not None and a.threshold),
        key=lambda a: (a.value or 0.0) / (a.threshold or 1.0),
        default=None,
    )
    if peak is not None:
        out.append(f"Peak: {peak.detector} at {peak.value:.3g} against {peak.threshold:.3g}.")
    impact, scope = incident.impact, incident.scope
    if impact["requests"] is not None:
        out.append(f"Requests in the groups found: {impact['requests']:,}, {impact['bad_requests']:,} of them bad.")
    touched = [f"{name} {', '.join(scope[name])}" for name in ("tenants", "replicas") if scope[name]]
    if touched:
        out.append("Touched: " + "; ".join(touched) + ".")
    if impact["slo_burn_rate"] is not None:
        out.append(f"SLO budget burning at {impact['slo_burn_rate']:.3g}x.")
    firing = sum(a.state == "firing" for a in alerts)
    out.append(f"Alerts: {len(alerts)} ({firing} firing): " + "; ".join(_lead(a.summary) for a in alerts[:5]) + ".")
    if set(incident.engine) & set(_ENGINE_WORDS):
        out.append(_engine_said(incident.engine))
    if changes:
        out.append("Changed just before: " + "; ".join(c.summary for c in changes[-3:]) + ".")
    if strongest is not None:
        out.append(f"Strongest evidence: {strongest.summary.rstrip('.')}.")
        out.append(f"Fix first: {strongest.suggested_fix.rstrip('.')}.")
    return " ".join(out)


# What an incident's summary says the engines showed: the request model's engine facts, as its requests met them.
ENGINE_COLUMNS = ("replica_id", "end_time", "queue_depth", "kv_cache_usage", "preemptions", "cache_hit_ratio")
ENGINE_HOUR = timedelta(hours=1)


def engine_window(incident: Incident, at: datetime) -> tuple[datetime, datetime, datetime]:
    """The hour before an incident, and its first hour (to its end or `at` if sooner): (before, start, end)."""
    start = incident.started_at
    end = min(incident.resolved_at or at, at, start + ENGINE_HOUR)
    return start - ENGINE_HOUR, start, max(end, start)


def engine_during(
    requests: pl.DataFrame, incident: Incident, at: datetime, known: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Its replicas' engine facts (the fleet's where it names none) in its first hour against the hour before:
    mean queue depth and KV-cache usage, the share of requests preempted, the mean cache hit ratio, and the
    queue by replica during it; `through`, the end of what was read of its first hour. No facts where no request
    of either hour has one. `known`: its facts as read before, whose hour before stands (the same start and
    replicas), so `requests` need only hold its first hour."""
    before, start, end = engine_window(incident, at)
    replicas = incident.scope["replicas"]
    mine = requests.filter(pl.col("replica_id").is_in(replicas)) if replicas else requests
    hours = {
        "during": mine.filter((pl.col("end_time") >= start) & (pl.col("end_time") < end)),
        "before": mine.filter((pl.col("end_time") >= before) & (pl.col("end_time") < start)),
    }
    figures = {
        "queue_depth": pl.col("queue_depth").cast(pl.Float64).mean(),
        "kv_cache_usage": pl.col("kv_cache_usage").mean(),
        "preempted_share": (pl.col("preemptions") > 0).cast(pl.Float64).mean(),
        "cache_hit_ratio": pl.col("cache_hit_ratio").mean(),
    }
    out: dict[str, Any] = {"through": end.isoformat()}
    for name, expr in figures.items():
        values = {hour: frame.select(expr).item() for hour, frame in hours.items()}
        if known is not None:
            values["before"] = known.get(name, {}).get("before")
        if any(v is not None for v in values.values()):
            out[name] = values
    if len(out) == 1:
        return out
    queues = (
        hours["during"].group_by("replica_id").agg(pl.col("queue_depth").cast(pl.Float64).mean())
        .drop_nulls().sort(["queue_depth", "replica_id"], descending=[True, False]).head(3)
    )  # fmt: skip
    out["queue_by_replica"] = dict(zip(queues["replica_id"].to_list(), queues["queue_depth"].to_list(), strict=True))
    return out


_ENGINE_WORDS = {
    "queue_depth": ("queue depth", "{:.3g}"),
    "kv_cache_usage": ("KV-cache usage", "{:.0%}"),
    "preempted_share": ("preempted", "{:.0%}"),
    "cache_hit_ratio": ("cache hits", "{:.0%}"),
}


def _engine_said(engine: Mapping[str, Any]) -> str:
    said = []
    for name, (words, form) in _ENGINE_WORDS.items():
        if name in engine:
            during, before = ("none" if engine[name][h] is None else form.format(engine[name][h])
                              for h in ("during", "before"))  # fmt: skip
            said.append(f"{words} {during} against {before}")
    queues = ", ".join(f"{r} {q:.3g}" for r, q in engine.get("queue_by_replica", {}).items())
    tail = f" (queue by replica: {queues})" if queues else ""
    return "Engines in its first hour against the hour before: " + "; ".join(said) + tail + "."


Transition = Literal["opened", "updated", "resolved"]


def transitions(kept: Mapping[str, Incident], incidents: Sequence[Incident]) -> list[tuple[Transition, Incident]]:
    """What to page about: an incident opened, grown (an alert or cluster more) or of another severity, or
    resolved, against what was kept before. One seen for the first time already resolved pages nobody."""
    out: list[tuple[Transition, Incident]] = []
    for incident in incidents:
        before = kept.get(incident.incident_id)
        if before is None:
            if incident.state == "open":
                out.append(("opened", incident))
        elif before.state == "open" and incident.state == "resolved":
            out.append(("resolved", incident))
        elif incident.state == "open" and (
            set(incident.alert_ids) - set(before.alert_ids)
            or set(incident.cluster_ids) - set(before.cluster_ids)
            or incident.severity != before.severity
        ):
            out.append(("updated", incident))
    return out


@dataclass(frozen=True)
class Tied:
    """One incident pass: every incident of the lookback, and what changed to page about."""

    incidents: list[Incident]
    transitions: list[tuple[Transition, Incident]]

    def of_alerts(self) -> dict[str, Incident]:
        """The incident each alert is in, by alert_id."""
        return {a: i for i in self.incidents for a in i.alert_ids}


class IncidentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.open = Gauge(
            "tailwatch_incidents_open", "Incidents open after the last pass, by severity.", ["severity"],
            registry=registry,
        )  # fmt: skip

    def show(self, incidents: Sequence[Incident]) -> None:
        for severity in SEVERITIES:
            self.open.labels(severity).set(sum(i.state == "open" and i.severity == severity for i in incidents))


class IncidentPass:
    """After a detection pass: the incidents of the lookback built again from what is stored, and those that
    changed kept. What the engines showed is read once an incident's first hour is over no more."""

    def __init__(
        self, store: IncidentStore, config: Config, *, source: WindowSource | None = None,
        metrics: IncidentMetrics | None = None, changes: ChangeStore | None = None,
    ) -> None:  # fmt: skip
        self._store = store
        self._changes = changes
        self._source = source
        self.config = config
        self._metrics = metrics

    def run(self, at: datetime) -> Tied:
        since = at - timedelta(hours=self.config.lookback_hours)
        alerts, table = self._store.incident_evidence(since)
        # A pass as of an earlier time (a replay) sees what had begun by then, not what came after.
        alerts = [a for a in alerts if a.started_at <= at]
        clusters = [c for c in map(ClusterRow.from_row, table.to_pylist()) if c.window_end <= at]
        kept = {
            i.incident_id: i
            for i in map(Incident.from_row, self._store.incidents(since=since, limit=_KEPT).to_pylist())
        }
        members = group(alerts, clusters, self.config)
        engine = self._engine(render(members, self.config, at), kept, at)
        changes = self._changes_of(since, at)
        incidents = render(members, self.config, at, lambda i: engine.get(i.incident_id, {}), changes=changes)
        self._store.keep_incidents([i for i in incidents if kept.get(i.incident_id) != i])
        if self._metrics is not None:
            self._metrics.show(incidents)
        return Tied(incidents, transitions(kept, incidents))

    def _changes_of(self, since: datetime, at: datetime) -> list[Change]:
        """The changes an incident of the lookback may name: found by then (a replay sees none found later)."""
        if self._changes is None:
            return []
        reach = since - timedelta(minutes=self.config.change_lookback_minutes)
        rows = self._changes.changes(since=reach, until=at, limit=_KEPT).to_pylist()
        return [c for c in map(Change.from_row, rows) if c.found_at <= at]

    def _engine(self, draft: list[Incident], kept: Mapping[str, Incident], at: datetime) -> dict[str, Any]:
        """Each incident's engine facts: read when it opens or its start or replicas change, and once more when its
        first hour is over; kept otherwise, so a pass reads them only for incidents that changed that way."""
        out: dict[str, Any] = {}
        due = []
        for incident in draft:
            stored = kept.get(incident.incident_id)
            if stored is not None and "through" in stored.engine and not engine_due(stored, incident, at):
                out[incident.incident_id] = stored.engine
            else:
                due.append(incident)
        if not due or self._source is None:
            return out
        # An incident that began where it did and on the same replicas keeps its hour before: only its first
        # hour is read again.
        known = {
            i.incident_id: stored.engine
            for i in due
            if (stored := kept.get(i.incident_id)) is not None and "through" in stored.engine
            and (stored.started_at, stored.scope["replicas"]) == (i.started_at, i.scope["replicas"])
        }  # fmt: skip
        spans = []
        for incident in due:
            before, start, end = engine_window(incident, at)
            spans.append((start if incident.incident_id in known else before, end))
        frames = [pl.from_arrow(Requests(Window(a, b), ENGINE_COLUMNS).fetch(self._source)) for a, b in _merged(spans)]
        frame = pl.concat([f for f in frames if isinstance(f, pl.DataFrame)])
        for incident in due:
            out[incident.incident_id] = engine_during(frame, incident, at, known.get(incident.incident_id))
        return out


def engine_due(stored: Incident, incident: Incident, at: datetime) -> bool:
    """Whether an incident's engine facts are to be read again: they are its replicas' over its first hour and
    the hour before, so only when it now began elsewhere or spans other replicas, or when that hour (or its life,
    if shorter) ended since they were read. An alert or cluster joining on the same replicas changes none."""
    grew = (stored.started_at, stored.scope["replicas"]) != (incident.started_at, incident.scope["replicas"])
    final = min(incident.resolved_at or incident.started_at + ENGINE_HOUR, incident.started_at + ENGINE_HOUR)
    return grew or datetime.fromisoformat(stored.engine["through"]) < final <= at


def _merged(spans: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """Overlapping time spans as one: each stretch of requests is read once."""
    out: list[tuple[datetime, datetime]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
