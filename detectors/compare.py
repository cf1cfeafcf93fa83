"""compare: which values of which dimensions one set of requests holds more of than another.

Two sets, `a` (the requests in question: after a change, an incident's bad ones) and `b` (a baseline: before
it), each the requests that ended in a time range, optionally of one deployment and, for `a`, only those showing
a symptom. For every value of every dimension — the clusters' (tenant, replica, model, deployment, quantization,
the cache, saturation and prompt buckets, traffic pattern, batch prefill, KV usage, preemption, finish reason,
status, and the configured extra ones) and each tracked resource attribute (`service.version`, the image, the
replica set: what change tracking reads, joined to each request by its replica and minute) — the counts in each
set, their shares, and the evidence that the value is over-represented in `a`: the clusters' exact test
(detectors/evidence.py) with `a` as the "bad" mark, each value held to the Bonferroni bar over every value
tried. Ranked: values that pass first, then by their chance, then by the requests beyond what `b`'s share would
put there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

import polars as pl

from detectors.changes import CACHE_LABELS
from detectors.changes import Config as ChangesConfig
from detectors.clusters import DIMENSIONS, REQUEST_COLUMNS, with_symptoms
from detectors.clusters import Config as ClustersConfig
from detectors.evidence import Evidence, bar
from storage.ports import (
    Change,
    ChangeStore,
    FrameBudget,
    Incident,
    Requests,
    Scores,
    Sightings,
    Window,
    WindowSource,
)

LEVEL = 0.01
# An incident against the hour before it; a change's hour after against its hour before.
BASELINE = timedelta(hours=1)


@dataclass(frozen=True)
class Difference:
    dimension: str
    value: str
    a_count: int
    b_count: int
    a_share: float
    b_share: float
    excess: float  # requests of `a` with the value beyond what `b`'s share would put there
    p_value: float
    passes: bool

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def differences(a: pl.DataFrame, b: pl.DataFrame, dimensions: Sequence[str], level: float = LEVEL) -> list[Difference]:
    """Every value of `dimensions` in either set, ranked by the evidence it is over-represented in `a`."""
    n_a, n_b = a.height, b.height
    counted = []
    for dim in dimensions:
        if dim not in a.columns or dim not in b.columns:
            continue
        per = [
            frame.select(pl.col(dim).cast(pl.Utf8).alias("value")).drop_nulls().group_by("value").len(name=name)
            for frame, name in ((a, "a"), (b, "b"))
        ]
        joined = per[0].join(per[1], on="value", how="full", coalesce=True).fill_null(0)
        counted += [(dim, str(v), int(x), int(y)) for v, x, y in joined.select("value", "a", "b").iter_rows()]
    each = bar(level, len(counted))
    out = []
    for dim, value, x, y in counted:
        evidence = Evidence(size=x + y, bad=x, outside=(n_a - x) + (n_b - y), bad_outside=n_a - x)
        b_share = y / n_b if n_b else 0.0
        p = evidence.p_value
        out.append(Difference(dim, value, x, y, x / n_a if n_a else 0.0, b_share, x - n_a * b_share, p, p <= each))
    return sorted(out, key=lambda d: (not d.passes, d.p_value, -d.excess, d.dimension, d.value))


@dataclass(frozen=True)
class Sets:
    """What to compare: the requests that ended in `a` against those in `b`, of `deployment` if given. With
    `symptom` (a cluster's: `error`, `tpot_tail`, `latency_tail`, `score:<name>`), `a` holds only the requests
    showing it and `b` those measured for it."""

    a: Window
    b: Window
    deployment: str | None = None
    symptom: str | None = None

    @classmethod
    def of_incident(cls, incident: Incident, now: datetime) -> Sets:
        """An incident's bad requests (its strongest cluster's symptom; all its requests when no cluster
        explains it), of its deployment if it names one, against the hour before it began."""
        end = min(incident.resolved_at or now, now)
        deployments = incident.scope.get("deployments") or []
        start = incident.started_at
        return cls(
            Window(start, max(end, start)), Window(start - BASELINE, start),
            deployments[0] if len(deployments) == 1 else None,
            incident.cause.get("symptom") if "cluster_id" in incident.cause else None,
        )  # fmt: skip

    @classmethod
    def of_change(cls, change: Change, now: datetime) -> Sets:
        """A change's deployment for the hour after it against the hour before."""
        end = min(change.at + BASELINE, now)
        return cls(Window(change.at, max(end, change.at)), Window(change.at - BASELINE, change.at),
                   change.scope.get("deployment"))  # fmt: skip


@dataclass(frozen=True)
class Compared:
    sets: Sets
    a_requests: int
    b_requests: int
    differences: list[Difference]


COLUMNS = ("end_time", *REQUEST_COLUMNS)
# What the API calls to compare two sets: `compare` bound to a store and the settings.
Comparing = Callable[[Sets, int], Compared]


def compare(
    source: WindowSource, changes: ChangeStore | None, sets: Sets, clusters: ClustersConfig,
    tracked: ChangesConfig, *, limit: int = 50, budget: FrameBudget | None = None,
) -> Compared:  # fmt: skip
    """The two sets read as clusters reads a window (its dimensions and symptoms), each request given its
    replica's tracked attributes, and their differences over every dimension."""
    frames = []
    for window, side in ((sets.a, "a"), (sets.b, "b")):
        requests = pl.DataFrame(Requests(window, (*COLUMNS, *clusters.extra_dimensions), traffic_pattern=True,
                                         categorical=True).fetch(source, budget))  # fmt: skip
        scored = pl.DataFrame(Scores(window).fetch(source, budget))
        frame, symptoms = with_symptoms({"requests": requests, "scores": scored}, clusters)
        if sets.deployment is not None:
            frame = frame.filter(pl.col("deployment").cast(pl.Utf8) == sets.deployment)
        if sets.symptom is not None:
            keys = [s.key for s in symptoms]
            if sets.symptom not in keys:  # no request of the window was measured for it: the set is empty
                frame = frame.clear()
            else:
                i = keys.index(sets.symptom)
                frame = frame.filter(pl.col(f"_bad{i}" if side == "a" else f"_in{i}"))
        if changes is not None:
            frame = _with_attributes(frame, changes, window, tracked)
        frames.append(frame)
    dimensions = [*DIMENSIONS, *clusters.extra_dimensions, *tracked.resource_keys()]
    found = differences(frames[0], frames[1], dimensions)
    return Compared(sets, frames[0].height, frames[1].height, found[:limit])


def _with_attributes(
    requests: pl.DataFrame, changes: ChangeStore, window: Window, config: ChangesConfig
) -> pl.DataFrame:
    """Each request with its replica's tracked resource attributes in the minute it ended, as its spans said."""
    read = Sightings(window, config.resource_keys(), CACHE_LABELS, config.max_sightings)
    seen = pl.DataFrame(changes.sightings(read))
    keys = list(config.resource_keys())
    if requests.is_empty() or seen.is_empty():
        return requests.with_columns(pl.lit(None, pl.Utf8).alias(k) for k in keys)
    attributes = (
        seen.filter(pl.col("source") == "spans")
        .sort(["replica_id", "minute", "last_seen"])
        .group_by(["replica_id", "minute"], maintain_order=True)
        .agg(pl.col(k).cast(pl.Utf8).drop_nulls().last() for k in keys)
    )
    return (
        requests.with_columns(pl.col("replica_id").cast(pl.Utf8), pl.col("end_time").dt.truncate("1m").alias("minute"))
        .join(attributes, on=["replica_id", "minute"], how="left")
        .drop("minute")
    )
