"""The detection pass: the one way detectors run, whoever asks.

The scheduler in `tailwatch serve`, `POST /v1/detect`, `tailwatch detect` and the benchmarks all call
`DetectionPass.run`. One pass evaluates its detectors in registry order (clusters last, after the
traffic labels and alerts it reads), reads what two detectors both declare once, and holds a lock
for its whole length: a pass asked for while another runs waits for it, so both never read the
same firing state before either persists. For each detector it fetches the declared reads, times
the pure `detect`, applies the alert state, persists the evaluation atomically and notifies. A
failing detector is logged, counted and recorded; it never stops the others.

Per-request frames grow with traffic, not with any setting, so the pass bounds them: with
`max_frame_bytes`, the frames it holds at once (shared ones included) may not pass it, and a detector
whose window needs more is not evaluated that time (outcome `too_large`) rather than growing the
process without limit.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import polars as pl
import pyarrow as pa
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as MetricCounter

from detectors.alerts import Alert, Evaluation, evaluate
from detectors.base import DetectorConfig, Read, Window
from detectors.changes import ChangePass
from detectors.clusters import following
from detectors.figure_gauges import FigureGauges
from detectors.grid import grid_time
from detectors.incidents import IncidentPass, Tied, Transition
from detectors.registry import REGISTRY, get
from storage.ports import (
    DetectorStore,
    EvaluationRecord,
    FiringAlerts,
    FrameBudget,
    FrameTooLarge,
    Incident,
    RunRecord,
    WindowSource,
)

log = logging.getLogger(__name__)
_CACHE_SIZE = 32


class AlertSink(Protocol):
    """Where alert and incident transitions go after they are stored (the notifier)."""

    def publish(
        self, detector: str, evaluation: Evaluation, interval_seconds: int, incidents: Mapping[str, Incident]
    ) -> None:
        """One evaluation's alerts, with the incident each is in (by alert_id) where it is known."""
        ...

    def publish_incident(self, transition: Transition, incident: Incident) -> None: ...


@dataclass
class RunResult:
    detector: str
    window: Window
    outcome: str  # ok | error | too_large
    seconds: float
    rows: int = 0
    conditions: int = 0
    firing: list[Alert] = field(default_factory=list)
    error: str | None = None


class SharedReads:
    """Reads one pass reuses: kept only while another detector still needs them, so a day-long frame
    is not held for the rest of the pass once its last reader is done."""

    def __init__(self, uses: Counter[Read]) -> None:
        self._remaining = uses
        self._tables: dict[Read, pa.Table] = {}

    def take(self, read: Read) -> pa.Table | None:
        table = self._tables.get(read)
        if table is not None:
            self._used(read)
        return table

    def keep(self, read: Read, table: pa.Table) -> None:
        self._used(read)
        if self._remaining[read] > 0:
            self._tables[read] = table

    def _used(self, read: Read) -> None:
        self._remaining[read] -= 1
        if self._remaining[read] <= 0:
            self._tables.pop(read, None)

    def held_bytes(self) -> int:
        """What the tables kept for later detectors take."""
        return sum(table.nbytes for table in self._tables.values())


class DetectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = MetricCounter(
            "tailwatch_detector_runs",
            "Detector evaluations by outcome (ok, error, too_large).",
            ["detector", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "tailwatch_detector_run_seconds",
            "Time of one evaluation: fetch, detect and persist.",
            ["detector"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=registry,
        )
        self.firing = Gauge(
            "tailwatch_alerts_firing", "Alerts firing after the last evaluation.", ["detector"], registry=registry
        )
        # Every detector's latest figures as gauges, tailwatch_<detector>_<column> (detectors/figure_gauges.py).
        self.figures = FigureGauges(registry)

    def show_figures(self, key: str, window: Window, figures: pl.DataFrame | None, limit: int) -> None:
        """Replace `key`'s figure gauges with this evaluation's (None: it failed); never fails the pass."""
        try:
            self.figures.replace(key, window, figures, limit)
        except Exception:  # the figures are stored; only their gauges are missing
            log.exception("could not show the figures of %s for %s as gauges", key, window.label())


class DetectionPass:
    def __init__(
        self,
        source: WindowSource,
        store: DetectorStore,
        configs: Mapping[str, DetectorConfig],
        *,
        sink: AlertSink | None = None,
        metrics: DetectorMetrics | None = None,
        max_frame_bytes: int | None = None,
        incidents: IncidentPass | None = None,
        changes: ChangePass | None = None,
    ) -> None:
        self._source = source
        self._incidents = incidents
        self._changes = changes
        self._max_frame_bytes = max_frame_bytes
        self._store = store
        # Clusters split requests by the buckets the other detectors are configured with, so an alert's bucket
        # label names the requests its detector put there.
        self._configs = following(configs)
        self._sink = sink
        self._metrics = metrics
        self._lock = threading.Lock()
        self._waiting = 0  # passes blocked on the lock behind the running one
        self._counting = threading.Lock()
        # Cacheable reads (baselines that lie wholly in the past), by their declaration; a handful at most.
        self._cache: dict[Read, pa.Table] = {}

    def keys(self, only: Iterable[str] | None = None) -> list[str]:
        """Detectors to run, in registry order: the named ones (validated), or every enabled one."""
        if only:
            named = {get(k).key for k in only}
            return [k for k in REGISTRY if k in named]
        return [k for k in REGISTRY if self._configs[k].enabled]

    def history_keys(self, only: Iterable[str] | None = None) -> list[str]:
        """Of `keys(only)`, those a window of the past can be evaluated for: not those reading the alerts firing
        now (clusters explain the present's alerts, and a caught-up window judges none)."""
        epoch = datetime(2000, 1, 1)
        return [
            k
            for k in self.keys(only)
            if not any(
                isinstance(r, FiringAlerts)
                for r in get(k).inputs(self._configs[k], self._configs[k].window(epoch)).values()
            )
        ]

    def evaluated(self, key: str, since: datetime) -> set[datetime]:
        """The evaluation times of `key` logged at or after `since`, whatever their outcome."""
        return self._store.evaluated(key, since)

    def data_from(self, since: datetime) -> datetime | None:
        """When the stored spans begin, looking no earlier than `since` (None: no span ends after it)."""
        return self._source.first_span_end(since)

    def config(self, key: str) -> DetectorConfig:
        """The configuration `key` runs with (validated: an unknown key is a KeyError naming the known ones)."""
        return self._configs[get(key).key]

    @property
    def tick_seconds(self) -> int:
        """How often the scheduler starts a pass: every enabled detector's interval is a multiple of it."""
        return math.gcd(*(self._configs[k].interval_seconds for k in self.keys())) or 300

    def due(self, at: datetime) -> list[str]:
        """The enabled detectors whose own interval grid has a point at `at`."""
        return [k for k in self.keys() if grid_time(at, self._configs[k].interval_seconds) == at]

    @property
    def waiting(self) -> int:
        """Passes waiting for the one under way to finish."""
        return self._waiting

    def run(self, at: datetime, only: Iterable[str] | None = None, *, judge: bool = True) -> list[RunResult]:
        """Evaluate detectors as of wall-clock `at` (naive UTC) and persist what they found. With `judge`
        false, a window of the past (detectors/catch_up.py): figures and the run log only, no alert, change or
        incident is touched or sent."""
        keys = self.keys(only) if judge else self.history_keys(only)
        with self._counting:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._counting:
                self._waiting -= 1
        try:
            plans: dict[str, dict[str, Read] | Exception] = {}
            uses: Counter[Read] = Counter()
            for key in keys:
                config = self._configs[key]
                try:
                    plans[key] = reads = get(key).inputs(config, config.window(at))
                except Exception as exc:  # noqa: BLE001 - reported as this detector's failed run below
                    plans[key] = exc
                    continue
                uses.update(reads.values())
            shared = SharedReads(uses)
            published: list[tuple[str, Evaluation, int]] = []
            results = [self._evaluate(key, at, plans[key], shared, published if judge else None) for key in keys]
            if not judge:
                return results
            self._find_changes(at)  # first: an incident names the changes shortly before it
            tied = self._tie_incidents(at)
            # Alerts are sent once the incidents they are in are known, so a receiver can group them by it.
            if self._sink is not None:
                of_alerts = tied.of_alerts() if tied is not None else {}
                for key, evaluation, interval in published:
                    self._sink.publish(key, evaluation, interval, of_alerts)
                for transition, incident in tied.transitions if tied is not None else []:
                    self._sink.publish_incident(transition, incident)
            return results
        finally:
            self._lock.release()

    def _find_changes(self, at: datetime) -> None:
        """The fleet's changes as of this pass; a failure is logged and never fails the pass."""
        if self._changes is None or not self._changes.config.enabled:
            return
        try:
            self._changes.run(at)
        except Exception:
            log.exception("could not find the changes as of %s", at.isoformat())

    def _tie_incidents(self, at: datetime) -> Tied | None:
        """The incidents after this pass's alerts and clusters; a failure is logged and never fails the pass."""
        if self._incidents is None or not self._incidents.config.enabled:
            return None
        try:
            return self._incidents.run(at)
        except Exception:
            log.exception("could not build the incidents as of %s", at.isoformat())
            return None

    def _evaluate(
        self, key: str, at: datetime, reads: dict[str, Read] | Exception, shared: SharedReads,
        published: list[tuple[str, Evaluation, int]] | None,
    ) -> RunResult:  # fmt: skip
        """One detector's evaluation; `published` collects what is to be sent (None: a window of the past,
        judged for no alert)."""
        spec = get(key)
        config = self._configs[key]
        window = config.window(at)
        judge = published is not None
        started = time.perf_counter()
        try:
            if isinstance(reads, Exception):
                raise reads
            budget = None
            if self._max_frame_bytes is not None:
                budget = FrameBudget(self._max_frame_bytes, used=shared.held_bytes())
            frames = {name: _frame(self._fetch(read, shared, budget)) for name, read in reads.items()}
            detection = spec.detect(frames, config, window)
            state = self._store.firing_state(key)
            # A window of the past leaves the present's alerts and their counters as they are.
            evaluation = (
                evaluate(
                    key,
                    detection.conditions,
                    state.firing,
                    state.breaches,
                    for_evaluations=config.for_evaluations,
                    default_severity=config.severity,
                    window=window,
                    at=at,
                )
                if judge
                else Evaluation(breaches=dict(state.breaches))
            )
            run = RunRecord(
                key, at, window, "ok", time.perf_counter() - started,
                rows=detection.figures.height, conditions=len(detection.conditions),
            )  # fmt: skip
            self._store.persist(
                EvaluationRecord(
                    run,
                    # Re-evaluating a window (a replay, a backfill) replaces its figures instead of adding to them.
                    figures={key: detection.figures, **detection.extra_tables},
                    fired=evaluation.fired,
                    changed=evaluation.updated + evaluation.resolved,
                    breaches=evaluation.breaches,
                    explanations=detection.explanations if judge else {},
                )
            )
        except FrameTooLarge as exc:
            # Not a fault of the detector: its window holds more requests than the bound lets in. One line
            # (no traceback) a skipped evaluation, naming the two ways out.
            seconds = time.perf_counter() - started
            message = f"{key} was not evaluated for {window.label()}: {exc}; shorten its window or raise the limit"
            log.warning("%s", message)
            self._record_failure(key, window, at, seconds, message, outcome="too_large")
            return RunResult(key, window, "too_large", seconds, error=message)
        except Exception as exc:  # one broken detector must not stop the others
            seconds = time.perf_counter() - started
            log.exception("detector %s failed for %s", key, window.label())
            message = f"{type(exc).__name__}: {exc}"
            self._record_failure(key, window, at, seconds, message, outcome="error")
            return RunResult(key, window, "error", seconds, error=message)
        seconds = time.perf_counter() - started
        if published is None:
            if self._metrics is not None:
                self._metrics.runs.labels(key, "ok").inc()
            return RunResult(
                key, window, "ok", seconds, rows=detection.figures.height, conditions=len(detection.conditions)
            )
        for alert in evaluation.fired:
            log.warning("alert firing [%s] %s: %s", alert.severity, key, alert.summary)
        for alert in evaluation.resolved:
            log.info("alert resolved %s %s", key, json.dumps(alert.labels, sort_keys=True))
        published.append((key, evaluation, config.interval_seconds))
        if self._metrics is not None:
            self._metrics.runs.labels(key, "ok").inc()
            self._metrics.seconds.labels(key).observe(seconds)
            self._metrics.firing.labels(key).set(len(evaluation.firing))
            self._metrics.show_figures(key, window, detection.figures, config.max_figure_series)
        return RunResult(
            key, window, "ok", seconds, rows=detection.figures.height, conditions=len(detection.conditions),
            firing=evaluation.firing,
        )  # fmt: skip

    def _fetch(self, read: Read, shared: SharedReads, budget: FrameBudget | None) -> pa.Table:
        if (table := shared.take(read)) is not None:
            return table
        table = self._cache[read] if read.cacheable and read in self._cache else read.fetch(self._source, budget)
        if read.cacheable:
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[read] = table
        shared.keep(read, table)
        return table

    def _record_failure(
        self, key: str, window: Window, at: datetime, seconds: float, message: str, *, outcome: str
    ) -> None:
        if self._metrics is not None:
            self._metrics.runs.labels(key, outcome).inc()
            self._metrics.show_figures(key, window, None, 0)
        try:
            self._store.log_run(RunRecord(key, at, window, outcome, seconds, error=message))
        except Exception:  # noqa: BLE001 - the run log is best effort; the failure is already logged
            log.warning("could not record the failed run of %s", key)


def _frame(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    if not isinstance(frame, pl.DataFrame):  # a table always gives a DataFrame; this tells the type checker
        raise TypeError(f"polars gave a {type(frame).__name__} for an Arrow table")
    return frame
