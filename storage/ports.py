"""The ports: what the rest of Tailwatch needs from storage, each named for its caller.

A backend (`storage.duckdb`, `storage.clickhouse`) implements these and nothing else is visible to the
collector, the detectors or the API: no SQL, no connection, no dialect crosses this line (but for the
service's own tools: `WriteJobs`, `StoreReader`). A detector
declares what it reads as one of the `Read` values below (which requests, which columns, which
window) and the detection pass hands that to a `WindowSource`.

Times are naive UTC throughout, like the stored columns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar, Literal, Protocol, TypeVar

import polars as pl
import pyarrow as pa

T = TypeVar("T")

# What the ClickHouse backend does with the OpenTelemetry Collector clickhouseexporter's traces table: `write`
# (its receivers store every span there too), `follow` (a user's Collector fills it; Tailwatch normalizes its
# rows), `off` (neither: spans live in Tailwatch's own tables alone).
OtelTraces = Literal["write", "follow", "off"]


@dataclass(frozen=True)
class Window:
    """Half-open event-time interval [start, end) over span end_time, naive UTC."""

    start: datetime
    end: datetime

    def label(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M} UTC"


# ---- what the collector writes ------------------------------------------------------------------


@dataclass(frozen=True)
class WriteResult:
    """What one accepted batch did once committed: spans stored, and spans dropped as already stored."""

    inserted: int
    duplicates: int


class SpanSink(Protocol):
    """Where decoded spans, scores and engine metric points go. The future resolves once they are durable."""

    def try_submit(
        self, spans: pa.Table | None, scores: pa.Table | None = None, metrics: pa.Table | None = None
    ) -> Future[WriteResult] | None:
        """Queue a batch; None when the backend cannot take it now (the receiver answers 'retry later')."""
        ...


# ---- what the scraper reports ------------------------------------------------------------------


@dataclass(frozen=True)
class TargetHealth:
    """One scrape of one target (metrics.scrape.targets), as its `scrape_targets` row records it.

    `error` is None when the page's points were handed to storage; otherwise why not (`timeout`,
    `http_503`, `parse_error`, `connection`, `overloaded`). `up`: the target answered with a page.
    """

    url: str
    replica_id: str | None
    deployment: str | None
    up: bool
    scraped_at: datetime
    error: str | None
    points: int
    seconds: float


class ScrapeHealth(Protocol):
    """Where each round's target health goes: one row per target, replacing the one before."""

    def record(self, rows: Sequence[TargetHealth]) -> Future[None]:
        """Queue the rows; a target's last success survives a failed scrape. Resolves once stored."""
        ...


# ---- what a detector reads ----------------------------------------------------------------------


class FrameTooLarge(Exception):
    """A per-request read would pass what the detection pass may hold (`FrameBudget`)."""


@dataclass
class FrameBudget:
    """The bytes of per-request frames the detection pass may still hold. A source charges each batch as
    it reads, so a window that holds more stops one batch past the limit instead of after all of it."""

    limit: int
    used: int = 0

    def charge(self, nbytes: int) -> None:
        self.used += nbytes
        if self.used > self.limit:
            raise FrameTooLarge(f"its frames passed {self.limit / 2**20:.0f} MiB (storage.detection_memory_mb)")


# Every read returns Arrow with a 64-bit `request_key` per request (the same for a request's scores,
# labels and row), so frames join on one integer; the two id strings come only when asked for, where
# a detector quotes them: a day of ids is ~1.5 GiB once in Python.


@dataclass(frozen=True)
class Requests:
    """The LLM requests (client/server pairs counted once) that ended inside `window`.

    Columns: `request_key`, then `columns` (names from the request model); `trace_id` and `span_id`
    too with `ids`; with `traffic_pattern`, the pattern the traffic_pattern detector stored for each
    request when it evaluated this same window (NULL where it has not). Only rows where every
    `require` column is not NULL. With `categorical`, text columns other than the ids come
    dictionary-encoded (Polars Categorical): a few bytes a request instead of the text, for a detector
    that only groups by them and compares them.
    """

    window: Window
    columns: tuple[str, ...]
    require: tuple[str, ...] = ()
    ids: bool = False
    traffic_pattern: bool = False
    categorical: bool = False
    cacheable = False

    def fetch(self, source: WindowSource, budget: FrameBudget | None = None) -> pa.Table:
        return source.requests(self, budget)


@dataclass(frozen=True)
class Scores:
    """Every non-NULL score of the requests that ended inside `window`: `request_key`, `name`, `score`
    (and `trace_id`, `span_id` with `ids`)."""

    window: Window
    ids: bool = False
    cacheable = False

    def fetch(self, source: WindowSource, budget: FrameBudget | None = None) -> pa.Table:
        return source.scores(self, budget)


class Aggregate(StrEnum):
    COUNT = "count"  # rows in the group; `column` unused
    MEAN = "mean"
    QUANTILE = "quantile"  # linear interpolation between closest ranks, as `quantile_cont`


@dataclass(frozen=True)
class Measure:
    """One output column of a `RequestSummary`: `name` = `aggregate` of `column` (at `q` for a quantile)."""

    name: str
    aggregate: Aggregate
    column: str | None = None
    q: float | None = None


@dataclass(frozen=True)
class LeftOut:
    """Requests of one group that ended in [start, end): `values` by column (None: any value, where the
    column is one of `Breached.optional`; else NULL matches NULL)."""

    start: datetime
    end: datetime
    values: tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class Breached:
    """Leave out of a summary the requests of each group in the windows where `detector`'s figures say it
    `breached`, so a trailing baseline does not take in the fault it is to show. A figures row matches a
    request when each of `keys` equals the request's (NULL equal to NULL) and each of `optional` does or is
    NULL in the row (a group over all its values: a model's breach leaves out every tenant's requests).
    Contiguous windows of a group are one range; at most `MAX_LEFT_OUT` ranges, the newest, are left out.
    `ranges` is filled in by storage."""

    detector: str
    keys: tuple[str, ...]
    optional: tuple[str, ...] = ()
    ranges: tuple[LeftOut, ...] | None = None


MAX_LEFT_OUT = 256


@dataclass(frozen=True)
class RequestSummary:
    """Measures of the requests that ended inside `window`, per group, for each grouping set.

    Computed where the data is: a day of requests comes back as one row per group. Columns: every
    column named in any grouping set (NULL where that set does not group by it), `grouping_set` (the
    index into `grouping_sets`), then each measure by name. `cacheable`: the window lies wholly in
    the past, so the same read gives the same answer and the pass may reuse it while it repeats.
    """

    window: Window
    grouping_sets: tuple[tuple[str, ...], ...]
    measures: tuple[Measure, ...]
    require: tuple[str, ...] = ()
    cacheable: bool = False
    leave_out: Breached | None = None

    def fetch(self, source: WindowSource, budget: FrameBudget | None = None) -> pa.Table:
        return source.request_summary(self)


@dataclass(frozen=True)
class FiringAlerts:
    """Every firing alert, oldest id first: `alert_id`, `detector`, `labels` (a JSON object), `started_at` (the
    evaluation time it began firing at)."""

    cacheable = False

    def fetch(self, source: WindowSource, budget: FrameBudget | None = None) -> pa.Table:
        return source.firing_alerts()


@dataclass(frozen=True)
class Episode:
    """`read` (requests or scores) over what came before its window while alerts fire: from `lead` before the
    oldest firing alert of `detectors` started (the start of the window the pass that fired it evaluated), at
    most `longest` before `read.window`, up to `read.window.start`. Empty (`read`'s columns, no rows) when no
    such alert fires, and when the episode would pass the frame budget: the caller then has the window alone,
    and the budget is left as it was."""

    read: Requests | Scores
    detectors: tuple[str, ...]
    lead: timedelta
    longest: timedelta
    cacheable = False

    def since(self, source: WindowSource) -> datetime:
        start = self.read.window.start
        firing = source.firing_alerts().select(["detector", "started_at"]).to_pylist()
        began: list[datetime] = [row["started_at"] for row in firing if row["detector"] in self.detectors]
        if not began:
            return start
        return min(start, max(min(began) - self.lead, start - self.longest))

    def fetch(self, source: WindowSource, budget: FrameBudget | None = None) -> pa.Table:
        start = self.read.window.start
        earlier = replace(self.read, window=Window(self.since(source), start))
        held = budget.used if budget is not None else 0
        try:
            return earlier.fetch(source, budget)
        except FrameTooLarge:
            if budget is None:  # only a budget refuses
                raise
            budget.used = held
            return replace(self.read, window=Window(start, start)).fetch(source)


@dataclass(frozen=True)
class SloCounts:
    """The per-minute SLO counts slo_burn stored before `before`, summed per (slo, group) over each trailing
    window [end - seconds, before) in `windows`: `slo`, `tenant_id`, `deployment`, `model`,
    `window_seconds`, `good`, `total` (requests), `good_slices`, `slices` (minutes with a judged request,
    and those judged good). Groups with nothing stored in a window have no row for it."""

    end: datetime
    before: datetime
    windows: tuple[int, ...]
    cacheable = False

    def fetch(self, source: WindowSource, budget: FrameBudget | None = None) -> pa.Table:
        return source.slo_counts(self)


Read = Requests | Scores | RequestSummary | FiringAlerts | Episode | SloCounts


class WindowSource(Protocol):
    """The reads detectors declare, answered as Arrow tables."""

    # The per-request reads grow with traffic: given a budget, they charge it batch by batch.
    def requests(self, read: Requests, budget: FrameBudget | None = None) -> pa.Table: ...
    def scores(self, read: Scores, budget: FrameBudget | None = None) -> pa.Table: ...
    def request_summary(self, read: RequestSummary) -> pa.Table: ...
    def firing_alerts(self) -> pa.Table: ...
    def slo_counts(self, read: SloCounts) -> pa.Table: ...
    def first_span_end(self, since: datetime) -> datetime | None:
        """The earliest span end at or after `since`: where the data begins, for catching up on windows."""
        ...


# ---- what the detection pass keeps --------------------------------------------------------------


@dataclass(frozen=True)
class Alert:
    """One row of the `alerts` table: a firing (or resolved) condition of one detector's group."""

    alert_id: str
    detector: str
    fingerprint: str
    severity: str
    state: str  # firing | resolved
    labels: dict[str, str]
    summary: str
    value: float | None
    threshold: float | None
    window_start: datetime
    window_end: datetime
    started_at: datetime
    resolved_at: datetime | None
    updated_at: datetime
    # What clusters found about the alert's group: the cluster that explains it, or why none passed.
    explanation: str | None = None

    def as_row(self) -> dict[str, Any]:
        return {**self.__dict__, "labels": json.dumps(self.labels, sort_keys=True)}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Alert:
        return cls(**{**row, "labels": json.loads(row["labels"])})


@dataclass(frozen=True)
class Incident:
    """One row of the `incidents` table: a fault episode and the alerts and clusters it caused."""

    incident_id: str
    state: str  # open | resolved
    started_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    severity: str
    title: str
    summary: str
    cause: dict[str, Any]
    scope: dict[str, list[str]]
    impact: dict[str, Any]
    engine: dict[str, Any]  # its replicas' engine facts in its first hour against the hour before
    alert_ids: tuple[str, ...]
    cluster_ids: tuple[str, ...]
    change_ids: tuple[str, ...]
    suggested_fix: str | None
    example_trace_ids: tuple[str, ...]

    JSON_COLUMNS: ClassVar[tuple[str, ...]] = ("cause", "scope", "impact", "engine")
    LIST_COLUMNS: ClassVar[tuple[str, ...]] = ("alert_ids", "cluster_ids", "change_ids", "example_trace_ids")

    def as_row(self) -> dict[str, Any]:
        row = dict(self.__dict__)
        for name in self.JSON_COLUMNS:
            row[name] = json.dumps(row[name], sort_keys=True)
        for name in self.LIST_COLUMNS:
            row[name] = list(row[name])
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Incident:
        values = {name: row[name] for name in cls.__dataclass_fields__ if name in row}
        for name in cls.JSON_COLUMNS:
            values[name] = json.loads(values[name])
        for name in cls.LIST_COLUMNS:
            values[name] = tuple(values[name] or ())
        return cls(**values)


@dataclass(frozen=True)
class Change:
    """One row of the `changes` table: what changed in one deployment, found from its spans and engine metrics."""

    change_id: str
    at: datetime
    kind: str  # rollout | version | config | scale
    scope: dict[str, Any]  # deployment, model, replicas (and which were added, removed or changed)
    before: dict[str, Any]  # the attributes that differ, as they were
    after: dict[str, Any]  # and as they became
    summary: str
    found_at: datetime

    JSON_COLUMNS: ClassVar[tuple[str, ...]] = ("scope", "before", "after")

    def as_row(self) -> dict[str, Any]:
        row = dict(self.__dict__)
        for name in self.JSON_COLUMNS:
            row[name] = json.dumps(row[name], sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Change:
        values = {f.name: row[f.name] for f in fields(cls)}
        for name in cls.JSON_COLUMNS:
            values[name] = json.loads(values[name])
        return cls(**values)


@dataclass(frozen=True)
class FiringState:
    """A detector's state between evaluations: its firing alerts and consecutive breaches, by fingerprint."""

    firing: dict[str, Alert] = field(default_factory=dict)
    breaches: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    """One line of the run log (`detector_runs`)."""

    detector: str
    at: datetime
    window: Window
    outcome: str  # ok | error
    seconds: float
    rows: int | None = None
    conditions: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class EvaluationRecord:
    """Everything one evaluation of one detector changes, persisted together or not at all.

    `figures`: by table, the rows that replace whatever that table held for the window (a replay or
    a backfill of a window overwrites it). `fired` are new alerts, `changed` alerts whose row is
    updated (refreshed or resolved), `breaches` the detector's counters after the evaluation,
    `explanations` what it says of firing alerts (of any detector) by alert_id.
    """

    run: RunRecord
    figures: Mapping[str, pl.DataFrame]
    fired: Sequence[Alert] = ()
    changed: Sequence[Alert] = ()
    breaches: Mapping[str, int] = field(default_factory=dict)
    explanations: Mapping[str, str] = field(default_factory=dict)  # by alert_id: stored as the alert's explanation


# Figure tables of per-minute counts summed over long windows: a minute counted again (a replay, overlapping
# windows, an evaluation off the schedule) replaces the count stored before, so a sum never counts it twice.
# `persist` replaces their rows by minute as well as by window.
COUNTED_ONCE_PER_MINUTE = frozenset({"slo_burn_minutes"})


class DetectorStore(Protocol):
    """Firing state, atomic persistence of an evaluation, and the run log."""

    def firing_state(self, detector: str) -> FiringState: ...

    def persist(self, evaluation: EvaluationRecord) -> None:
        """Write the evaluation in one transaction: on failure nothing of it is stored."""
        ...

    def log_run(self, run: RunRecord) -> None:
        """Record a run that stored nothing else (a failed one)."""
        ...

    def evaluated(self, detector: str, since: datetime) -> set[datetime]:
        """The evaluation times (`at`) of the detector's logged runs at or after `since`, whatever the outcome."""
        ...


# ---- what the API and the console read ----------------------------------------------------------


class AlertQueries(Protocol):
    """Alerts and clusters, newest first, for the API."""

    def alerts(self, *, state: str | None = None, detector: str | None = None, limit: int = 100) -> pa.Table: ...

    def clusters(self, *, detector: str | None = None, limit: int = 50) -> pa.Table: ...


class IncidentStore(Protocol):
    """What incidents are built from, and where they are kept."""

    def incident_evidence(self, since: datetime) -> tuple[list[Alert], pa.Table]:
        """The alerts still firing, resolved since `since` or in an incident still open, and the `clusters`
        rows of the windows ending after `since`."""
        ...

    def keep_incidents(self, incidents: Sequence[Incident]) -> None:
        """Store each incident in place of the row with its id."""
        ...

    def incidents(self, *, state: str | None = None, since: datetime | None = None, limit: int = 100) -> pa.Table:
        """Incidents updated after `since`, newest first."""
        ...

    def incident(self, incident_id: str) -> Incident | None:
        """The incident of that id, if there is one."""
        ...


# vLLM's cache configuration, one point a replica whose labels are its settings.
CACHE_CONFIG_METRIC = "vllm:cache_config_info"
# The columns of a sightings read: where and when a replica was seen, then one column per tracked attribute.
SIGHTING_COLUMNS = ("source", "deployment", "replica_id", "minute", "first_seen", "last_seen", "n")


@dataclass(frozen=True)
class Sightings:
    """What change tracking reads: per source (`spans`, `metrics`), deployment, replica and minute of `window`,
    the values its spans and engine metrics carried of each tracked attribute (`model`, `quantization`, the
    resource keys named, and vLLM's cache configuration labels from metrics as `engine.cache.<label>`), with
    when they were first and last seen and how often. At most `limit` rows: one more says there were more."""

    window: Window
    resource_keys: tuple[str, ...]
    cache_labels: tuple[str, ...]
    limit: int


class ChangeStore(Protocol):
    """Where the fleet's changes are found from and kept."""

    def sightings(self, read: Sightings) -> pa.Table:
        """`SIGHTING_COLUMNS`, then `model`, `quantization`, each resource key and `engine.cache.<label>`."""
        ...

    def keep_changes(self, changes: Sequence[Change]) -> None:
        """Store each change in place of the row with its id."""
        ...

    def changes(self, *, since: datetime | None = None, until: datetime | None = None, limit: int = 100) -> pa.Table:
        """Changes at or after `since` and before `until`, newest first."""
        ...

    def change(self, change_id: str) -> Change | None:
        """The change of that id, if there is one."""
        ...


@dataclass(frozen=True)
class DetectorHealth:
    """A detector's last evaluation and its failures over the day before `as_of`."""

    detector: str
    last_run: datetime | None
    last_outcome: str | None
    last_seconds: float | None
    last_error: str | None
    failures_24h: int
    runs_24h: int


# How far around a trace its replicas' engine metric points are shown (`ConsoleQueries.trace`): a few scrape
# intervals either side, so the request view's charts show the queue before arrival and after the end.
TRACE_ENGINE_MARGIN = timedelta(minutes=1)


@dataclass(frozen=True)
class Figures:
    """A detector's figures over a range (storage/figure_shape.py): `table`, the rows, oldest first; `stride`,
    every how many windows were kept counting back from the newest (1: all); `truncated`, rows of the range
    are missing (a stride above 1, or the cap cut the oldest)."""

    table: pa.Table
    stride: int
    truncated: bool


class ConsoleQueries(Protocol):
    """What the console reads besides alerts and clusters: detector figures over time, detector health and
    one trace with everything known about it."""

    def figures(
        self,
        detector: str,
        since: datetime,
        until: datetime,
        *,
        limit: int,
        columns: Sequence[str] = (),
        where: Mapping[str, str] | None = None,
        distinct: bool = False,
    ) -> Figures:
        """The figures `detector` stored for the windows ending in (since, until], oldest first; only `columns`
        (default all but evaluated_at, and then sorted by them), only rows whose columns equal `where`'s
        values, each row once with `distinct`. At most `limit` rows: past it, every stride-th window counting
        back from the newest, then the oldest rows cut. An unknown detector is a KeyError, an unknown column a
        ValueError."""
        ...

    def detector_health(self, as_of: datetime) -> list[DetectorHealth]:
        """Every detector that has run, by key."""
        ...

    def trace(self, trace_id: str, around: Window | None = None) -> dict[str, pa.Table]:
        """`spans` (canonical columns and attributes), `requests` (the request model's rows), `scores`, and
        `engine` (the engine metric points of its replicas from a minute before to a minute after it).
        `around`, when given, bounds the search to spans ending inside it: a hint that spares a full scan."""
        ...


class SpanRetention(Protocol):
    def delete_ended_before(self, cutoff: datetime) -> int:
        """Delete spans whose end_time, and engine metric points whose time, is before `cutoff`; returns how
        many spans."""
        ...


class EngineFacts(Protocol):
    def settle(self, until: datetime) -> int:
        """Store the engine facts of the LLM spans that ended before `until`, held back to the newest engine
        point, so reads of them join nothing; returns how many spans were settled."""
        ...


Params = Sequence[Any] | Mapping[str, Any] | None


class QueryError(Exception):
    """A query that cannot run or failed; `code` is stable for clients, `message` is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class QueryResult:
    table: pa.Table
    truncated: bool
    types: list[str]  # the backend's type of each column, e.g. "TIMESTAMP", "MAP(VARCHAR, DOUBLE)"
    seconds: float


class AnalystSQL(Protocol):
    """Analysts' read-only statements, in the backend's own SQL dialect, under a time limit and a row cap.

    Failures are `QueryError`s; an export of an unknown dataset or an empty range is an `ExportError`.
    """

    @property
    def timeout_seconds(self) -> float: ...

    @property
    def max_rows(self) -> int: ...

    def run(self, sql: str, params: Params = None, *, max_rows: int | None = None) -> QueryResult: ...

    def stream(self, sql: str, params: Params = None) -> AbstractContextManager[pa.RecordBatchReader]: ...

    def export(self, dataset: str, since: datetime, until: datetime) -> AbstractContextManager[pa.RecordBatchReader]:
        """One export dataset's rows in [since, until) with `date` and `tenant_id` partition columns."""
        ...


# ---- what only some backends have ----------------------------------------------------------------


class Lease(Protocol):
    """Turns at the scheduler's jobs among the processes that share one store: one holds it at a time."""

    def hold(self) -> bool:
        """Take the lease, or renew it; whether this process holds it now."""
        ...

    def release(self) -> None:
        """Give the lease up (at shutdown), so another process takes it without waiting for it to expire."""
        ...


class OtelTracesRows(Protocol):
    """The `otel_traces` table a user's OpenTelemetry Collector fills, read by follow mode from a cursor."""

    def oldest(self) -> datetime | None: ...
    def cursor(self) -> datetime | None: ...
    def advance(self, to: datetime) -> None: ...
    def walk_rows(
        self, since: datetime, until: datetime, span_keys: tuple[str, ...], resource_keys: tuple[str, ...]
    ) -> pa.Table: ...


class WriteJobs(Protocol):
    """Functions run on a backend's one writer, each in a transaction, in order with ingest: a change made as
    the service itself makes it. The function gets the backend's own connection."""

    def submit(self, fn: Callable[[Any], T]) -> Future[T]: ...


class StoreReader(Protocol):
    """Statements in the backend's own SQL on the service's store, read-only, without the analyst walls: for the
    service's own tools and tests, never for a client."""

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]: ...
    def arrow(self, sql: str, params: list[Any] | None = None) -> pa.Table: ...


class Storage(Protocol):
    """A backend: every port over one store, and its lifecycle. The optional ports are None where a backend
    has no such thing."""

    @property
    def sink(self) -> SpanSink: ...
    @property
    def windows(self) -> WindowSource: ...
    @property
    def detector_store(self) -> DetectorStore: ...
    @property
    def alert_queries(self) -> AlertQueries: ...
    @property
    def incident_store(self) -> IncidentStore: ...
    @property
    def change_store(self) -> ChangeStore: ...
    @property
    def console_queries(self) -> ConsoleQueries: ...
    @property
    def analyst(self) -> AnalystSQL: ...
    @property
    def retention(self) -> SpanRetention: ...
    @property
    def scrape_health(self) -> ScrapeHealth: ...
    @property
    def engine_facts(self) -> EngineFacts: ...
    @property
    def refusing_writes(self) -> bool:
        """Whether every write is refused for now (a full disk): readiness says so to load balancers."""
        ...

    @property
    def lease(self) -> Lease | None:
        """Turns at the scheduler's jobs where several processes share the store (ClickHouse); None where one
        process owns it (a DuckDB file)."""
        ...

    @property
    def otel_traces(self) -> OtelTracesRows | None:
        """The `otel_traces` table a user's Collector fills, where the backend follows one (ClickHouse with
        `otel_traces: follow`); None otherwise."""
        ...

    @property
    def write_jobs(self) -> WriteJobs | None:
        """The one writer every change goes through, where there is one (DuckDB); None otherwise."""
        ...

    @property
    def reader(self) -> StoreReader | None:
        """Read statements on the service's own store, where they share its connection (DuckDB); None otherwise."""
        ...

    def stop_writes(self) -> None:
        """Commit everything queued and take no more writes. Idempotent."""
        ...

    def close(self) -> None:
        """Stop writes and release the store. Idempotent."""
        ...
