"""saturation: whether requests served while the autoscaler catches up get worse answers or slower ones.

An autoscaler reacts to load it has already seen: until new replicas are up, every replica's queue grows
and the engine batches harder, preempts and truncates. If that costs quality or latency it shows as a
gap between the requests that arrived at a deep queue per replica and those that arrived at an idle one.

Definitions, per window (requests that ended in it):

- saturation = queue_depth / replica_count as the request saw them; a request missing either, or with a
  replica_count of 0, is left out.
- bucket: idle below idle_below, warm from there below warm_below, saturating from there below
  saturating_below, scaling at or above it (each lower edge inclusive). Idle is the reference.
- n, latency_p50 / latency_p99 (of e2e_ms), tpot_p99: per bucket.
- score_mean / score_n: the mean and count of each score name over the bucket's requests.

Figures are long: one row per (bucket, score name), the bucket's latency figures repeated; a bucket
without scores has one row whose score columns are NULL.

Only the scaling bucket breaches, when a score's mean is at least score_drop below the idle bucket's
(signal: the score name), or when its latency_p99 is at least latency_factor x idle's (signal
latency_p99); warm and saturating are figures, the shape of the curve on the way there. Both sides need
min_samples requests, and for a score as many scores of that name.

Alert labels (LABELS): bucket (always scaling), signal (the score name, or latency_p99).
"""

from __future__ import annotations

from typing import Any, Self

import polars as pl
from pydantic import Field, model_validator

from detectors.base import Condition, Detection, DetectorConfig, Read, Window
from detectors.buckets import SATURATION_EDGES, Buckets, per_replica_load, queue_per_replica
from detectors.comparison import Comparison
from detectors.frames import curve, format_duration, ids_as_strings, requests, scores

KEY = "saturation"
SUMMARY = "Autoscaling lag: latency and quality by queue depth per replica, idle to scaling."
LABELS = ("bucket", "signal")
REFERENCE = "idle"
BREACHING = "scaling"
# Only scaling is judged against idle: warm and saturating are the shape of the curve on the way there.
COMPARISON = Comparison("bucket", REFERENCE, judged=(BREACHING,))
BUCKET_ORDER = {"idle": 0, "warm": 1, "saturating": 2, "scaling": 3}
REQUEST_COLUMNS = ("e2e_ms", "tpot_ms", "queue_depth", "replica_count")
FIGURE_COLUMNS = [
    "window_start",
    "window_end",
    "bucket",
    "n",
    "latency_p50",
    "latency_p99",
    "tpot_p99",
    "score_name",
    "score_mean",
    "score_n",
]
_ADVICE = "the autoscaler lags the load: lower target_ongoing_requests or pre-warm replicas before the burst"


class Config(DetectorConfig):
    idle_below: float = Field(
        SATURATION_EDGES[0],
        gt=0,
        description="Queued requests per replica below this put a request in the idle (reference) bucket.",
    )
    warm_below: float = Field(
        SATURATION_EDGES[1],
        gt=0,
        description="From idle_below up to (not including) this many queued per replica is warm.",
    )
    saturating_below: float = Field(
        SATURATION_EDGES[2],
        gt=0,
        description="From warm_below up to (not including) this many queued per replica is saturating; at or above "
        "it, scaling.",
    )
    score_drop: float = Field(
        0.10, gt=0, description="Alert when the scaling bucket's mean of a score is at least this below idle's."
    )
    latency_factor: float = Field(
        3.0, gt=1, description="Alert when the scaling bucket's e2e p99 is at least this multiple of idle's."
    )
    min_samples: int = Field(
        30,
        ge=1,
        description="Requests (and scores of a name) both the scaling and the idle bucket need for a verdict.",
    )

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> Self:
        if not self.idle_below < self.warm_below < self.saturating_below:
            raise ValueError("idle_below, warm_below and saturating_below must increase")
        return self

    def buckets(self) -> Buckets:
        return queue_per_replica((self.idle_below, self.warm_below, self.saturating_below))


def inputs(config: Config, window: Window) -> dict[str, Read]:
    return {"requests": requests(window, REQUEST_COLUMNS), "scores": scores(window)}


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    # Hand-built or empty frames may carry Null dtypes; the figures table needs the real ones.
    reqs = (
        frames["requests"]
        .with_columns(
            *ids_as_strings(frames["requests"]),
            pl.col("e2e_ms", "tpot_ms").cast(pl.Float64),
            pl.col("queue_depth", "replica_count").cast(pl.Int64),
        )
        # A request without a load (a missing queue_depth or replica_count, or none counted) has no bucket.
        .with_columns(config.buckets().expr(per_replica_load()).alias("bucket"))
        .filter(pl.col("bucket").is_not_null())
    )
    score_frame = frames["scores"].with_columns(
        *ids_as_strings(frames["scores"]), pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64)
    )

    buckets, long = curve(reqs, score_frame, "bucket")
    figures = (
        long.with_columns(
            window_start=pl.lit(window.start, pl.Datetime("us")), window_end=pl.lit(window.end, pl.Datetime("us"))
        )
        .sort([pl.col("bucket").replace_strict(BUCKET_ORDER), pl.col("score_name")], nulls_last=True)
        .select(FIGURE_COLUMNS)
    )
    latency, score = COMPARISON.judge(buckets, figures, config)
    conditions = [_latency_condition(r, config, window) for r in latency]
    conditions += [_score_condition(r, config, window) for r in score]
    conditions.sort(key=lambda c: c.labels["signal"])
    return Detection(figures=figures, conditions=conditions)


def _describe(config: Config) -> str:
    return f"{BREACHING} bucket (queue ≥ {config.saturating_below:g} per replica)"


def _score_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    name, drop = str(row["score_name"]), float(row["drop"])
    summary = (
        f"{_describe(config)}: {name} mean {row['score_mean']:.2f} vs {row['ref_score_mean']:.2f} when idle "
        f"(−{drop:.2f}) over {window.label()}, n={row['score_n']:,} vs {row['ref_score_n']:,}; {_ADVICE}"
    )
    return Condition(
        labels={"bucket": BREACHING, "signal": name}, value=drop, threshold=config.score_drop, summary=summary
    )


def _latency_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    ratio = float(row["ratio"])
    summary = (
        f"{_describe(config)}: e2e p99 {format_duration(row['latency_p99'])} is {ratio:.1f}x the idle bucket's "
        f"{format_duration(row['ref_latency_p99'])} over {window.label()}, n={row['n']:,} vs {row['ref_n']:,}; "
        f"{_ADVICE}"
    )
    return Condition(
        labels={"bucket": BREACHING, "signal": "latency_p99"},
        value=ratio,
        threshold=config.latency_factor,
        summary=summary,
    )
