"""Engine metric points → the `engine_metrics` batch, whichever way they arrived (OTLP or a scrape).

Both the OTLP metrics decoder and the scraper feed `PointColumns`, so validation, name matching and
the replica/deployment rules are written once. A point is rejected only when it cannot be stored
(no name, no usable time, no finite value); a name Tailwatch does not know, or a known name of
another type, is stored with `metric` NULL: kept for SQL, not joined to requests.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from collector.engine_names import EngineNames, Kind
from collector.normalize import Plan, resolve
from collector.reasons import MetricRejectReason, MetricUnjoined, Rejections
from model.columns import ENGINE_METRIC_BATCH_SCHEMA, MAX_TIME_NS


class Temporality:
    GAUGE = "gauge"
    CUMULATIVE = "cumulative"
    DELTA = "delta"


@dataclass(frozen=True)
class Origin:
    """Who reported a point: the resolved replica and deployment, and the resource as JSON."""

    replica_id: str | None
    deployment: str | None
    resource: dict[str, Any]
    resource_json: str


@dataclass(frozen=True)
class Point:
    """One data point as it arrived; a histogram carries its sum in `value` (NaN without one) and `count`."""

    name: str
    arrived: Kind
    temporality: str
    time_ns: int
    start_ns: int
    labels: dict[str, Any]
    value: float
    count: float | None = None


def _problem(p: Point) -> tuple[MetricRejectReason, str] | None:
    """Why a point cannot be stored, or None."""
    if not p.name:
        return MetricRejectReason.MISSING_NAME, "a metric needs a name"
    if p.time_ns <= 0:
        return MetricRejectReason.MISSING_TIME, "time_unix_nano is 0"
    if p.time_ns > MAX_TIME_NS or p.start_ns > MAX_TIME_NS:
        return MetricRejectReason.INVALID_TIME, f"{p.name}: a time is at or beyond 2^63 ns"
    if p.arrived is Kind.HISTOGRAM:
        if p.count is None or not math.isfinite(p.count) or math.isinf(p.value):
            return MetricRejectReason.NON_FINITE_VALUE, f"{p.name}: a histogram's sum or count is not finite"
    elif not math.isfinite(p.value):
        return MetricRejectReason.NON_FINITE_VALUE, f"{p.name} is {p.value}"
    return None


class PointColumns:
    """Accumulates valid points as columns; rejections and unjoined points are counted by reason."""

    def __init__(self, names: EngineNames, plan: Plan, source: str) -> None:
        self._names = names
        self._plan = plan
        self._source = source
        self._label_keys = {
            field: frozenset(src.key for src in plan.sources[field] if src.scope == "span")
            for field in ("replica_id", "deployment")
        }
        self.rejections = Rejections()
        self.unjoined: Counter[MetricUnjoined] = Counter()
        self.points = 0
        self._rows: list[tuple[Any, ...]] = []  # in ENGINE_METRIC_BATCH_SCHEMA order, transposed once at the end
        self._found: dict[tuple[str, Kind], str | MetricUnjoined] = {}  # a name's verdict, looked up once
        self._any_label_key = self._label_keys["replica_id"] | self._label_keys["deployment"]

    def origin(self, resource: dict[str, Any], replica_id: str | None = None, deployment: str | None = None) -> Origin:
        """Resolve a resource once; explicit values (a scrape target's configuration) win."""
        return Origin(
            replica_id if replica_id is not None else resolve(self._plan, "replica_id", resource, {}),
            deployment if deployment is not None else resolve(self._plan, "deployment", resource, {}),
            resource,
            orjson.dumps(resource).decode(),
        )

    def reject(self, reason: MetricRejectReason, explanation: str) -> None:
        self.rejections.add(reason, explanation)

    def add(self, origin: Origin, point: Point) -> None:
        problem = _problem(point)
        if problem is not None:
            self.rejections.add(*problem)
            return
        verdict = self._verdict(point.name, point.arrived)
        canonical: str | None = None
        if isinstance(verdict, MetricUnjoined):
            self.unjoined[verdict] += 1
        else:
            canonical = verdict
        self.points += 1
        labels = point.labels
        # Most points carry no label that names a replica or deployment (Ray Serve's do): the
        # resource's answer, resolved once, stands.
        replica, deployment = origin.replica_id, origin.deployment
        if labels and not self._any_label_key.isdisjoint(labels):
            if self._named_by(labels, "replica_id"):
                replica = resolve(self._plan, "replica_id", origin.resource, labels)
            if self._named_by(labels, "deployment"):
                deployment = resolve(self._plan, "deployment", origin.resource, labels)
        model = labels.get("model_name", labels.get("model"))
        engine = labels.get("engine")
        shared = (
            point.temporality,
            point.time_ns,
            point.start_ns or None,
            replica,
            deployment,
            None if model is None else str(model),
            None if engine is None else str(engine),
            orjson.dumps(labels).decode(),
            origin.resource_json,
        )
        if point.arrived is not Kind.HISTOGRAM:
            self._row(point.name, canonical, point.value, shared)
            return
        if not math.isnan(point.value):
            self._row(f"{point.name}_sum", _part(canonical, "sum"), point.value, shared)
        self._row(f"{point.name}_count", _part(canonical, "count"), float(point.count or 0), shared)

    def _verdict(self, name: str, arrived: Kind) -> str | MetricUnjoined:
        """The canonical metric a name of this type joins as, or why it does not join."""
        key = (name, arrived)
        verdict = self._found.get(key)
        if verdict is None:
            found = self._names.lookup(name)
            if found is None:
                verdict = MetricUnjoined.UNKNOWN_NAME
            elif found[1] is not arrived:
                verdict = MetricUnjoined.TYPE_MISMATCH
            else:
                verdict = found[0]
            self._found[key] = verdict
        return verdict

    def _named_by(self, labels: dict[str, Any], field: str) -> bool:
        return not self._label_keys[field].isdisjoint(labels)

    def _row(self, name: str, metric: str | None, value: float, shared: tuple[Any, ...]) -> None:
        kind, time_ns, start_ns, replica, deployment, model, engine, labels_json, resource_json = shared
        self._rows.append((
            time_ns, start_ns, name, metric, kind, value, replica, deployment, model, engine, self._source,
            self._names.interval_seconds, labels_json, resource_json,
        ))  # fmt: skip

    def table(self) -> pa.Table:
        arrays = []
        columns = zip(*self._rows, strict=True) if self._rows else ([] for _ in ENGINE_METRIC_BATCH_SCHEMA)
        for f, values in zip(ENGINE_METRIC_BATCH_SCHEMA, columns, strict=True):
            if pa.types.is_timestamp(f.type):
                arrays.append(pa.array(values, pa.int64()).cast(f.type))
            else:
                arrays.append(pa.array(values, f.type))
        return pa.Table.from_arrays(arrays, schema=ENGINE_METRIC_BATCH_SCHEMA)


def _part(canonical: str | None, part: str) -> str | None:
    return None if canonical is None else f"{canonical}_{part}"
