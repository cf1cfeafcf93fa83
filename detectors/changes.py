"""changes: what changed in each deployment, found from its spans and engine metrics, no deploy hook needed.

Pure: `find` takes a lookback's sightings (`storage.ports.Sightings`: per source, replica and minute, the values
of the tracked attributes its spans and metrics carried) and returns the changes they show as of `at`. The
rules (docs/changes.md):

- A replica's tracked value (its `service.version`, model, quantization, image, replica set, vLLM cache
  settings, and the attributes configured) *switches* when one value is last seen before the next is first seen
  (within `switch_seconds`). Values seen together beyond that — an attribute that flaps span by span, a replica
  reporting two versions at once — are no switch: the value is counted (`two_values`) and not read.
- A switch on a running replica is a `version` change (a version key: `VERSION_KEYS`) or a `config` change
  (anything else); the same switch on several replicas within `neighbourhood_seconds` is one change.
- A replica *appears* when first seen in the newer half of the lookback and is *gone* when unseen for
  `settle_seconds`. Appearances and departures within `neighbourhood_seconds` of each other are one step: a
  `rollout` when the new replicas carry values the ones before did not (a canary, when none left) or when
  replicas were replaced one for one, a `scale` when the count only stepped.
- A change is reported once it is settled (its new state seen for `settle_seconds`; a step's, once no more of
  it can come) and only while what came before is in view (its time in the newer half of the lookback), so a
  pass at any time — a replay with `detect --at` too — finds the same changes. Its id is that of its
  deployment, kind, time and what it changed to: found again, it is the same row.
- A replica seen fewer than `min_sightings` times names nothing; a deployment of more than `max_replicas`
  replicas in a lookback (a replica id that is a request's) is counted and skipped, as is a lookback of more
  than `max_sightings` sightings: bounded, and never a false rollout.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import polars as pl
from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel, ConfigDict, Field, field_validator

from detectors.clusters import clock
from model.attribute_keys import attribute_key
from storage.ports import SIGHTING_COLUMNS, Change, ChangeStore, Sightings, Window

# The resource attributes tracked whatever the configuration says (OpenTelemetry semantic conventions).
RESOURCE_KEYS = ("service.version", "container.image.name", "container.image.tag", "k8s.replicaset.name")
# vLLM's cache settings, from the labels of its `vllm:cache_config_info` point, tracked as `engine.cache.<label>`.
CACHE_LABELS = ("block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "num_gpu_blocks")
# A switch of one of these is a new version of what is served; of any other tracked key, a new configuration.
VERSION_KEYS = frozenset({"model", "service.version", "container.image.name", "container.image.tag",
                          "k8s.replicaset.name"})  # fmt: skip
KINDS = ("rollout", "version", "config", "scale")


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Find the fleet's changes after each detection pass.")
    lookback_minutes: int = Field(
        60, ge=10, description="How far back each pass reads; a change is found while it is in the newer half."
    )
    settle_seconds: int = Field(
        300, gt=0, description="A change is reported once its new state has been seen this long; a replica unseen "
        "this long is gone."
    )  # fmt: skip
    neighbourhood_seconds: int = Field(
        600, gt=0, description="Replicas that come and go this close together, and one switch on several replicas "
        "this close, are one change."
    )  # fmt: skip
    switch_seconds: int = Field(
        60, ge=0, description="A replica's old value seen up to this long after its new one is still a switch "
        "(requests in flight); longer, and the two are counted as seen together."
    )  # fmt: skip
    min_sightings: int = Field(3, ge=1, description="Spans and points a replica needs in a lookback to count.")
    max_replicas: int = Field(
        512, ge=1, description="A deployment with more replicas than this in a lookback is counted and skipped."
    )
    max_sightings: int = Field(
        200_000, ge=1, description="A lookback with more sightings (replica, minute and values) is counted and "
        "skipped."
    )  # fmt: skip
    relook_minutes: int = Field(
        5, ge=1, description="Each pass reads again this much of what the last one read, for spans that came late."
    )
    attributes: tuple[str, ...] = Field(
        (), description="More resource attributes to track, beyond service.version, container.image.name, "
        "container.image.tag and k8s.replicaset.name: a switch of one is a config change."
    )  # fmt: skip

    @field_validator("attributes")
    @classmethod
    def _keys(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(attribute_key(k) for k in keys)

    def resource_keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*RESOURCE_KEYS, *self.attributes]))


@dataclass(frozen=True)
class Seen:
    """One replica's value of one key: when first and last seen, and how often."""

    value: str
    first: datetime
    last: datetime


@dataclass
class Replica:
    replica_id: str
    first: datetime
    last: datetime
    n: int
    start: dict[str, str] = field(default_factory=dict)  # each readable key's value when it was first seen
    end: dict[str, str] = field(default_factory=dict)  # and when last seen
    switches: list[tuple[datetime, str, str, str]] = field(default_factory=list)  # (at, key, before, after)


@dataclass(frozen=True)
class Found:
    """One lookback's changes, and what was not read, by reason."""

    changes: list[Change]
    skipped: Counter[str]


def keys_of(sightings: pl.DataFrame) -> list[str]:
    return [c for c in sightings.columns if c not in SIGHTING_COLUMNS]


def find(sightings: pl.DataFrame, config: Config, at: datetime) -> Found:
    """The changes the sightings of [at - lookback, at) show, settled as of `at`, oldest first."""
    lookback = timedelta(minutes=config.lookback_minutes)
    start = at - lookback
    skipped: Counter[str] = Counter()
    if sightings.height > config.max_sightings:
        skipped["too_many_sightings"] += 1
        return Found([], skipped)
    frame = sightings.filter((pl.col("last_seen") >= start) & (pl.col("first_seen") < at))
    nameless = frame.filter(pl.col("deployment").is_null())
    if nameless.height:
        skipped["no_deployment"] += int(nameless["n"].sum())
    changes: list[Change] = []
    for (deployment,), rows in sorted(frame.filter(pl.col("deployment").is_not_null()).group_by("deployment")):
        if rows["replica_id"].n_unique() > config.max_replicas:
            skipped["too_many_replicas"] += 1
            continue
        replicas = _replicas(rows, config, skipped)
        where = _Where(str(deployment), replicas, config, start + lookback / 2, at)
        changes += where.switched() + where.stepped()
    return Found(sorted(changes, key=lambda c: (c.at, c.change_id)), skipped)


def _replicas(rows: pl.DataFrame, config: Config, skipped: Counter[str]) -> list[Replica]:
    """Each replica of one deployment seen often enough, with its values and their switches."""
    keys = keys_of(rows)
    presence = rows.group_by("replica_id").agg(pl.col("first_seen").min(), pl.col("last_seen").max(), pl.col("n").sum())
    kept = presence.filter(pl.col("n") >= config.min_sightings)
    skipped["few_sightings"] += presence.height - kept.height
    replicas = {
        r["replica_id"]: Replica(r["replica_id"], r["first_seen"], r["last_seen"], r["n"])
        for r in kept.sort("replica_id").iter_rows(named=True)
    }
    values = (
        rows.filter(pl.col("replica_id").is_in(list(replicas)))
        .with_columns(pl.col(k).cast(pl.Utf8) for k in keys)
        .unpivot(index=["source", "replica_id", "first_seen", "last_seen"], on=keys, variable_name="key",
                 value_name="value")
        .drop_nulls("value")
        .group_by(["replica_id", "source", "key", "value"])
        .agg(pl.col("first_seen").min(), pl.col("last_seen").max())
        .sort(["replica_id", "key", "source", "first_seen", "value"])
    )  # fmt: skip
    switch = timedelta(seconds=config.switch_seconds)
    seen: dict[tuple[str, str, str], list[Seen]] = {}
    for r in values.iter_rows(named=True):
        seen.setdefault((r["replica_id"], r["key"], r["source"]), []).append(
            Seen(r["value"], r["first_seen"], r["last_seen"])
        )
    # Spans say what a replica served; metrics fill in what spans do not carry (the engine's own settings).
    read: set[tuple[str, str]] = set()
    for (replica_id, key, _), line in sorted(seen.items(), key=lambda kv: (*kv[0][:2], kv[0][2] != "spans")):
        if (replica_id, key) in read:
            continue
        read.add((replica_id, key))
        if any(a.last > b.first + switch for a, b in pairwise(line)):
            skipped["two_values"] += 1
            continue
        replica = replicas[replica_id]
        replica.start[key], replica.end[key] = line[0].value, line[-1].value
        replica.switches += [(b.first, key, a.value, b.value) for a, b in pairwise(line)]
    return list(replicas.values())


class _Where:
    """One deployment's replicas, and the changes they show as of `at` from `horizon` on."""

    def __init__(self, deployment: str, replicas: list[Replica], config: Config, horizon: datetime,
                 at: datetime) -> None:  # fmt: skip
        self.deployment = deployment
        self.replicas = replicas
        self.config = config
        self.horizon = horizon
        self.at = at
        self.settle = timedelta(seconds=config.settle_seconds)
        self.reach = timedelta(seconds=config.neighbourhood_seconds)

    def switched(self) -> list[Change]:
        """Values switched on running replicas: one change per switch (the same keys to the same values) and
        stretch of time."""
        each: list[tuple[datetime, str, dict[str, str], dict[str, str]]] = []
        for replica in self.replicas:
            for group in _stretches(sorted(replica.switches), self.reach):
                before = {key: old for _, key, old, _ in group}
                after = {key: new for _, key, _, new in group}
                each.append((group[0][0], replica.replica_id, before, after))
        out = []
        by_switch: dict[str, list[tuple[datetime, str, dict[str, str], dict[str, str]]]] = {}
        for item in sorted(each, key=lambda e: (e[0], e[1])):
            by_switch.setdefault(json.dumps([item[2], item[3]], sort_keys=True), []).append(item)
        for items in by_switch.values():
            for group in _stretches(items, self.reach):
                at, _, before, after = group[0]
                if not (self.horizon <= at <= self.at - self.settle):
                    continue
                kind = "version" if set(after) & VERSION_KEYS else "config"
                replicas = sorted({replica_id for _, replica_id, _, _ in group})
                scope = {"deployment": self.deployment, "model": self._model(replicas), "replicas": replicas,
                         "changed": replicas}  # fmt: skip
                out.append(self._change(kind, at, scope, before, after))
        return out

    def stepped(self) -> list[Change]:
        """Replicas come and gone, step by step."""
        events = [(r.first, "added", r) for r in self.replicas if r.first >= self.horizon]
        events += [(r.last, "removed", r) for r in self.replicas
                   if self.horizon <= r.last <= self.at - self.settle]  # fmt: skip
        out = []
        for step in _stretches(sorted(events, key=lambda e: (e[0], e[1], e[2].replica_id)), self.reach):
            added = {r.replica_id: r for _, what, r in step if what == "added"}
            removed = {r.replica_id: r for _, what, r in step if what == "removed"}
            for passing in set(added) & set(removed):  # came and went within one step: a crash loop, not a change
                del added[passing], removed[passing]
            if not added and not removed:
                continue
            began = step[0][0]
            before = [r for r in self.replicas if r.first < began and r.replica_id not in added
                      and (r.last >= began or r.replica_id in removed)]  # fmt: skip
            old = _usual([r.end if r.replica_id in removed else r.start for r in before])
            new = _usual([r.start for r in added.values()])
            differ = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
            closed = self.at >= step[-1][0] + self.reach + self.settle  # no more of this step can come
            names = sorted([*added, *removed])
            scope: dict[str, Any] = {"deployment": self.deployment, "model": self._model(names), "replicas": names,
                                     "added": sorted(added), "removed": sorted(removed)}  # fmt: skip
            if added and differ:
                # What changed is known as soon as the new replicas have settled; the step may still grow.
                at = min(r.first for r in added.values())
                if self.horizon <= at <= self.at - self.settle:
                    out.append(self._change("rollout", at, scope, {k: old[k] for k in differ},
                                            {k: new[k] for k in differ}))  # fmt: skip
            elif closed and began >= self.horizon:
                if added and removed:
                    out.append(self._change("rollout", began, scope, {"replicas": sorted(removed)},
                                            {"replicas": sorted(added)}))  # fmt: skip
                else:
                    count = len(before) + len(added) - len(removed)
                    out.append(self._change("scale", began, scope, {"replica_count": len(before)},
                                            {"replica_count": count}))  # fmt: skip
        return out

    def _model(self, replica_ids: Sequence[str]) -> str | None:
        models = [r.start.get("model") for r in self.replicas if r.replica_id in replica_ids]
        return _usual([{"model": m} for m in models if m]).get("model")

    def _change(self, kind: str, at: datetime, scope: dict[str, Any], before: dict[str, Any],
                after: dict[str, Any]) -> Change:  # fmt: skip
        key = json.dumps([self.deployment, kind, at.isoformat(), after], sort_keys=True)
        return Change(
            change_id=hashlib.sha256(f"change/{key}".encode()).hexdigest()[:16], at=at, kind=kind, scope=scope,
            before=before, after=after, summary=describe(kind, at, scope, before, after), found_at=self.at,
        )  # fmt: skip


def _stretches(items: Sequence[Any], reach: timedelta) -> list[list[Any]]:
    """Items in time order (each a tuple whose first element is its time), cut where two are further apart."""
    out: list[list[Any]] = []
    for item in items:
        if out and item[0] - out[-1][-1][0] <= reach:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def _usual(identities: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """Each key's most common value among the identities (the smallest of the most common, for ties)."""
    counts: dict[str, Counter[str]] = {}
    for identity in identities:
        for key, value in identity.items():
            counts.setdefault(key, Counter())[value] += 1
    return {key: min(c, key=lambda v: (-c[v], v)) for key, c in counts.items()}


def describe(kind: str, at: datetime, scope: Mapping[str, Any], before: Mapping[str, Any],
             after: Mapping[str, Any]) -> str:  # fmt: skip
    """One line a person reads: `rollout of vllm-b at 12:03 UTC: service.version 1.4.2 → 1.5.0; replicas r6, r7
    added, r4, r5 removed`."""
    if kind == "scale":
        what = f"{before['replica_count']} → {after['replica_count']} replicas"
    elif "replicas" in after:
        what = "replicas replaced, attributes unchanged"
    else:
        what = ", ".join(f"{k} {before.get(k)} → {after[k]}" for k in _ordered(after))
    moved = [f"{', '.join(scope[part])} {part}" for part in ("added", "removed", "changed") if scope.get(part)]
    return f"{kind} of {scope['deployment']} at {clock(at)}: {what}" + (
        f"; replicas {'; '.join(moved)}" if moved else ""
    )


def introduced(change: Change) -> str:
    """What a change brought, as a title names it: `1.5.0, int4`, or `4 → 6 replicas`."""
    if change.kind == "scale":
        return f"{change.before['replica_count']} → {change.after['replica_count']} replicas"
    if "replicas" in change.after:
        return "of new replicas"
    return ", ".join(str(change.after[k]) for k in _ordered(change.after))


def _ordered(after: Mapping[str, Any]) -> list[str]:
    """The keys of a change, versions first: what people name a rollout by."""
    return sorted(after, key=lambda k: (k not in VERSION_KEYS, k))


class ChangeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.found = Gauge(
            "tailwatch_changes_in_lookback", "Changes found in the last pass's lookback, by kind.", ["kind"],
            registry=registry,
        )  # fmt: skip
        self.skipped = Gauge(
            "tailwatch_change_sightings_skipped", "What the last change pass did not read, by reason: replicas "
            "seen too seldom, values seen together (two_values), deployments of too many replicas, sightings "
            "without a deployment, a lookback of too many sightings.", ["reason"], registry=registry,
        )  # fmt: skip

    def show(self, found: Found) -> None:
        for kind in KINDS:
            self.found.labels(kind).set(sum(c.kind == kind for c in found.changes))
        for reason in SKIPPED:
            self.skipped.labels(reason).set(found.skipped.get(reason, 0))


SKIPPED = ("few_sightings", "two_values", "too_many_replicas", "no_deployment", "too_many_sightings")


class ChangePass:
    """After a detection pass: the lookback's changes found again and those that are new or grew kept.

    The sightings of the lookback are kept between passes by minute, so a pass reads only the minutes since the
    last one (and `relook_minutes` before, for late spans); a pass as of another time (a replay) reads its own
    lookback whole."""

    def __init__(self, store: ChangeStore, config: Config, *, metrics: ChangeMetrics | None = None) -> None:
        self._store = store
        self.config = config
        self._metrics = metrics
        self._kept: pl.DataFrame | None = None
        self._through: datetime | None = None

    def sightings(self, at: datetime) -> pl.DataFrame:
        start = at - timedelta(minutes=self.config.lookback_minutes)
        start = start.replace(second=0, microsecond=0)
        since = start
        if self._kept is not None and self._through is not None and start <= self._through <= at:
            since = max(start, self._through - timedelta(minutes=self.config.relook_minutes)).replace(
                second=0, microsecond=0
            )
        read = Sightings(Window(since, at), self.config.resource_keys(), CACHE_LABELS, self.config.max_sightings)
        fresh = pl.DataFrame(self._store.sightings(read))
        if since > start and self._kept is not None:
            kept = self._kept.filter((pl.col("minute") >= start) & (pl.col("minute") < since))
            fresh = pl.concat([kept, fresh], how="vertical_relaxed")
        self._kept, self._through = fresh, at
        return fresh

    def run(self, at: datetime) -> Found:
        found = find(self.sightings(at), self.config, at)
        start = at - timedelta(minutes=self.config.lookback_minutes)
        stored = {
            c.change_id: c for c in map(Change.from_row, self._store.changes(since=start, limit=10_000).to_pylist())
        }
        # A change found again keeps the earliest time it was found at (a replay's, if earlier); only what grew
        # (its scope) is written again.
        fresh = [
            replace(c, found_at=min(c.found_at, stored[c.change_id].found_at)) if c.change_id in stored else c
            for c in found.changes
        ]
        self._store.keep_changes([c for c in fresh if stored.get(c.change_id) != c])
        if self._metrics is not None:
            self._metrics.show(found)
        return Found(fresh, found.skipped)
