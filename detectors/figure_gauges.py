"""Each detector's latest figures as Prometheus gauges, for dashboards and Prometheus alert rules.

The figures a detector's evaluation persisted (its results table, docs/sql.md) become one gauge family
per figure column, `tailwatch_<detector>_<column>` (`tailwatch_token_latency_tpot_p99`), with booleans
as 1 or 0. The labels are the figures' group columns: their string columns, less the ones that hold a
finding rather than name a group (VALUE_COLUMNS); a NULL label value is "". An evaluation replaces its
detector's series, so a group that is gone from the window is gone from /metrics; a failed evaluation
clears them; an evaluation of an older window than the one shown (a replay, a backfill) leaves them.

At most `max_figure_series` groups per detector are shown (breached first, then most requests, then
figures order); the rest, and any row whose label set an earlier row already has, are counted in
`tailwatch_figure_series_dropped_total{detector}`. The detection pass updates them from its executor
threads while /metrics is scraped on the event loop: an update builds its series first, then swaps
them in under a lock, and a scrape reads whatever was swapped in last.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from detectors.base import Window

# clusters' figures are clusters, not a group's measures: one row per cluster id, a new id every window.
SKIPPED_DETECTORS = frozenset({"clusters"})
TIME_COLUMNS = frozenset({"window_start", "window_end", "evaluated_at"})
# String columns that are a finding, not a group: as labels they would start a new series whenever the
# finding changes (the same group would show under two label sets across evaluations) and split a group's
# figures from its history. token_latency's `reason` is the likely cause of a breach, NULL when none;
# quantization_delta's `baseline_quantization` is the variant a model's others are compared with, chosen
# each window (the highest-precision one seen) and named by the group's model.
VALUE_COLUMNS: dict[str, frozenset[str]] = {
    "token_latency": frozenset({"reason"}),
    "quantization_delta": frozenset({"baseline_quantization"}),
    # slo_burn's `severity` is the rule a group breaches now, NULL when none.
    "slo_burn": frozenset({"severity"}),
}
# Rows kept first when a detector has more groups than it may show: breaching ones, then the busiest.
_PRIORITY = ("breached", "n")

# What each figure column is, with its unit as docs/sql.md gives it; by (detector, column) where a
# column means something else in one detector, else by column.
_COLUMN_HELP: dict[str, tuple[str, str]] = {
    "n": ("Requests of the group in the window", "count (requests)"),
    "latency_p50": ("Median e2e latency of the group", "ms"),
    "latency_p99": ("p99 of the group's e2e latency", "ms"),
    "tpot_p50": ("Median time per output token of the group", "ms per output token"),
    "tpot_p99": ("p99 of the group's time per output token", "ms per output token"),
    "ttft_p99": ("p99 of the group's time to first token", "ms"),
    "score_mean": ("Mean of the score named by score_name over the group's requests", "0..1"),
    "score_n": ("Scores of that name over the group's requests", "count (scores)"),
    "baseline_n": ("Requests of the baseline", "count (requests)"),
    "baseline_p99": ("p99 of time per output token over the baseline hours", "ms per output token"),
    "ratio": ("Window tpot p99 over baseline tpot p99", "ratio"),
    "prefill_share": ("Share of the slow requests decoded beside a big prefill", "0..1"),
    "cache_hit_mean": ("Mean cache hit ratio of the group in the window", "0..1"),
    "baseline_cache_hit_mean": ("Mean cache hit ratio of the group over the baseline hours", "0..1"),
    "queue_share": ("Median share of a request's e2e spent queued", "0..1"),
    "breached": ("1 when the group's tpot p99 breached its baseline with enough samples, else 0", "—"),
    "preempted_share": ("Share of the slow requests that ran while their replica preempted", "0..1"),
    "kv_usage_p50": ("The slow requests' median KV-cache usage at arrival", "0..1"),
    "step_tokens_p50": ("The slow requests' median tokens per engine step", "tokens"),
    "aggregate_p99": ("p99 of e2e latency over every request of the window", "ms"),
    "aggregate_ttft_p99": ("p99 of time to first token over every request of the window", "ms"),
    "jain_index": ("Jain's fairness index over the tenants (1 is fair); the same for every tenant", "1/k..1"),
    "score_p_low": ("The tenant's low quantile (score_quantile, p10) of the score", "0..1"),
    "aggregate_score_p_low": ("The same low quantile of the score over every scored request", "0..1"),
    "error_rate": ("Share of the replica's requests that failed", "0..1"),
    "fleet_n": ("Requests of the rest of the fleet", "count (requests)"),
    "fleet_latency_p99": ("p99 of e2e latency over the rest of the fleet", "ms"),
    "fleet_tpot_p99": ("p99 of time per output token over the rest of the fleet", "ms per output token"),
    "fleet_error_rate": ("Share of the rest of the fleet's requests that failed", "0..1"),
    "fleet_score_mean": ("Mean of the score over the rest of the fleet", "0..1"),
    "baseline_latency_p99": ("p99 of e2e latency of the model's baseline variant", "ms"),
    "latency_delta": ("The variant's e2e p99 minus the baseline variant's", "ms"),
    "baseline_score_mean": ("Mean of the score over the baseline variant's requests", "0..1"),
    "window_seconds": ("Length of the trailing window named by burn_window", "s"),
    "good": ("Good requests (minutes, for a time-slice SLO) of the SLO's group in the trailing window", "count"),
    "total": ("Judged requests (minutes, for a time-slice SLO) of the SLO's group in the trailing window", "count"),
    "burn_rate": ("Bad share over the trailing window divided by the error budget (1 - objective)", "ratio"),
    "objective": ("The SLO's objective: the share that must be good", "0..1"),
    "budget_remaining": ("Share of the SLO window's error budget not yet spent (negative once overspent)", "ratio"),
    "score_delta": (
        "The variant's score mean minus the baseline variant's (negative is worse)", "score difference (−1..1)"
    ),
}  # fmt: skip
_DETECTOR_HELP: dict[tuple[str, str], tuple[str, str]] = {
    ("token_latency", "n"): ("Requests of the group with a tpot in the window", "count (requests)"),
    ("token_latency", "baseline_n"): ("Requests of the group with a tpot over the baseline hours", "count (requests)"),
    ("tenant_fairness", "ratio"): ("The tenant's e2e p99 over the window's aggregate p99", "ratio"),
    ("quantization_delta", "baseline_n"): ("Requests of the model's baseline variant", "count (requests)"),
    ("slo_burn", "breached"): ("1 when a burn-rate rule breaches for the SLO's group, else 0", "—"),
}  # fmt: skip


def figure_help(detector: str, column: str) -> str:
    """The HELP line of `tailwatch_<detector>_<column>`: what the figure is, and its unit."""
    meaning, unit = _DETECTOR_HELP.get((detector, column)) or _COLUMN_HELP.get(column) or (column, "—")
    shown = "" if unit == "—" else f" Unit: {unit}."
    return f"{meaning} ({detector}, latest evaluated window).{shown}"


@dataclass(frozen=True)
class _Family:
    name: str
    help: str
    labels: tuple[str, ...]
    samples: tuple[tuple[tuple[str, ...], float], ...]


@dataclass(frozen=True)
class _Shown:
    window: Window
    families: tuple[_Family, ...]


def label_columns(detector: str, figures: pl.DataFrame) -> list[str]:
    """The columns that name a figures row's group: every string column but the findings."""
    skip = TIME_COLUMNS | VALUE_COLUMNS.get(detector, frozenset())
    return [c for c, t in figures.schema.items() if t in (pl.String, pl.Categorical, pl.Enum) and c not in skip]


def value_columns(figures: pl.DataFrame) -> list[str]:
    """The columns shown as gauges: every number, and every boolean (as 1 or 0)."""
    return [c for c, t in figures.schema.items() if (t.is_numeric() or t == pl.Boolean) and c not in TIME_COLUMNS]


class FigureGauges:
    """A custom collector: the gauges of every detector's latest figures, replaced per evaluation."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.dropped = Counter(
            "tailwatch_figure_series_dropped",
            "Figure groups not shown as gauges: beyond the detector's max_figure_series, or repeating a label set.",
            ["detector"],
            registry=registry,
        )
        self._lock = threading.Lock()
        self._shown: dict[str, _Shown] = {}
        registry.register(self)

    def replace(self, detector: str, window: Window, figures: pl.DataFrame | None, limit: int) -> None:
        """Show `figures` (None: the evaluation failed, show nothing) as `detector`'s gauges, at most `limit` groups."""
        if detector in SKIPPED_DETECTORS:
            return
        families, dropped = _families(detector, figures, limit) if figures is not None else ((), 0)
        with self._lock:
            shown = self._shown.get(detector)
            if shown is not None and window.end < shown.window.end:
                return  # a replay or backfill of an older window: the newer figures stay
            self._shown[detector] = _Shown(window, families)
        self.dropped.labels(detector).inc(dropped)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            shown = list(self._shown.values())
        for entry in shown:
            for family in entry.families:
                gauge = GaugeMetricFamily(family.name, family.help, labels=family.labels)
                for labels, value in family.samples:
                    gauge.add_metric(labels, value)
                yield gauge


def _families(detector: str, figures: pl.DataFrame, limit: int) -> tuple[tuple[_Family, ...], int]:
    labels = label_columns(detector, figures)
    values = value_columns(figures)
    priority = [c for c in _PRIORITY if c in figures.columns]
    rows = figures.sort(priority, descending=True, nulls_last=True, maintain_order=True) if priority else figures
    rows = rows.select(
        *(pl.col(c).cast(pl.String).fill_null("") for c in labels), *(pl.col(c).cast(pl.Float64) for c in values)
    )
    # One series per label set: a NULL and an empty value both show as "", and a later row of a set is dropped.
    unique = rows.unique(subset=labels, keep="first", maintain_order=True) if labels else rows.head(1)
    kept = unique.head(limit)
    keys = list(kept.select(labels).iter_rows()) if labels else [()] * kept.height
    families = []
    for column in values:
        samples = tuple(
            (key, value) for key, value in zip(keys, kept[column].to_list(), strict=True) if value is not None
        )
        if samples:
            families.append(
                _Family(f"tailwatch_{detector}_{column}", figure_help(detector, column), tuple(labels), samples)
            )
    return tuple(families), figures.height - kept.height
