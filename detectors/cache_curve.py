"""cache_curve: whether requests that missed the KV cache get worse answers or slower ones.

Under memory pressure a serving engine evicts cached prefixes, so requests recompute their prefill and
can be truncated, preempted or rescheduled; if that costs quality it shows as a lower score among the
requests with a low cache hit ratio than among those served mostly from cache.

Definitions, per window (requests that ended in it; a NULL cache_hit_ratio is left out):

- bucket: high when cache_hit_ratio > high_threshold, low when < low_threshold, medium in between
  (both ends inclusive). The high bucket is the reference the others are compared with.
- n, latency_p50 / latency_p99 (of e2e_ms), tpot_p99: per bucket.
- score_mean / score_n: the mean and count of each score name over the bucket's requests.

Figures are long: one row per (bucket, score name), the bucket's latency figures repeated; a bucket
without scores has one row whose score columns are NULL.

A medium or low bucket breaches when a score's mean is at least score_drop below the high bucket's
mean of that score (signal: the score name), or when its latency_p99 is at least latency_factor x the
high bucket's (signal latency_p99). Both sides need
min_samples requests, and for a score as many scores of that name.

Alert labels (LABELS): bucket (medium or low), signal (the score name, or latency_p99).
"""

from __future__ import annotations

from typing import Any, Self

import polars as pl
from pydantic import Field, model_validator

from detectors.base import Condition, Detection, DetectorConfig, Read, Window
from detectors.buckets import CACHE_HIGH, CACHE_LOW, Buckets, cache_hit
from detectors.comparison import Comparison
from detectors.frames import curve, format_duration, ids_as_strings, requests, scores

KEY = "cache_curve"
SUMMARY = "Latency and quality per KV-cache-hit-ratio bucket; alerts on a cliff below the high bucket."
LABELS = ("bucket", "signal")
REFERENCE = "high"
# Every bucket below high is judged against it.
COMPARISON = Comparison("bucket", REFERENCE)
BUCKET_ORDER = {"high": 0, "medium": 1, "low": 2}
REQUEST_COLUMNS = ("cache_hit_ratio", "e2e_ms", "tpot_ms")
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


class Config(DetectorConfig):
    high_threshold: float = Field(
        CACHE_HIGH,
        ge=0,
        le=1,
        description="A cache hit ratio above this puts a request in the high (reference) bucket.",
    )
    low_threshold: float = Field(
        CACHE_LOW,
        ge=0,
        le=1,
        description="A cache hit ratio below this puts a request in the low bucket; from here to high_threshold "
        "(both inclusive) is medium.",
    )
    score_drop: float = Field(
        0.10, gt=0, description="Alert when a bucket's mean of a score is at least this below the high bucket's."
    )
    latency_factor: float = Field(
        2.0, gt=1, description="Alert when a bucket's e2e p99 is above this multiple of the high bucket's."
    )
    min_samples: int = Field(
        30,
        ge=1,
        description="Requests (and scores of a name) both the bucket and the high bucket need for a verdict.",
    )

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> Self:
        if self.low_threshold > self.high_threshold:
            raise ValueError("low_threshold must not be above high_threshold")
        return self

    def buckets(self) -> Buckets:
        return cache_hit(self.high_threshold, self.low_threshold)


def inputs(config: Config, window: Window) -> dict[str, Read]:
    return {"requests": requests(window, REQUEST_COLUMNS), "scores": scores(window)}


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    # Hand-built or empty frames may carry Null dtypes; the figures table needs the real ones.
    reqs = (
        frames["requests"]
        .with_columns(
            *ids_as_strings(frames["requests"]),
            pl.col("cache_hit_ratio", "e2e_ms", "tpot_ms").cast(pl.Float64),
        )
        .filter(pl.col("cache_hit_ratio").is_not_null())
        .with_columns(config.buckets().expr(pl.col("cache_hit_ratio")).alias("bucket"))
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
    conditions.sort(key=lambda c: (BUCKET_ORDER[c.labels["bucket"]], c.labels["signal"]))
    return Detection(figures=figures, conditions=conditions)


def _describe(bucket: str, config: Config) -> str:
    ranges = {
        "high": f">{config.high_threshold:g}",
        "medium": f"{config.low_threshold:g}–{config.high_threshold:g}",
        "low": f"<{config.low_threshold:g}",
    }
    return f"{bucket} cache-hit bucket ({ranges[bucket]})"


def _score_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    bucket, name, drop = str(row["bucket"]), str(row["score_name"]), float(row["drop"])
    summary = (
        f"{_describe(bucket, config)}: {name} mean {row['score_mean']:.2f} vs {row['ref_score_mean']:.2f} "
        f"in the high bucket (−{drop:.2f}) over {window.label()}, n={row['score_n']} vs {row['ref_score_n']}; "
        "KV-cache pressure is costing quality: give the cache more memory or route shared prefixes together"
    )
    return Condition(
        labels={"bucket": bucket, "signal": name}, value=drop, threshold=config.score_drop, summary=summary
    )


def _latency_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    bucket, ratio = str(row["bucket"]), float(row["ratio"])
    summary = (
        f"{_describe(bucket, config)}: e2e p99 {format_duration(row['latency_p99'])} is {ratio:.1f}x the high "
        f"bucket's {format_duration(row['ref_latency_p99'])} over {window.label()}, n={row['n']} vs {row['ref_n']}; "
        "cache misses are recomputing prefills: give the cache more memory or route shared prefixes together"
    )
    return Condition(
        labels={"bucket": bucket, "signal": "latency_p99"},
        value=ratio,
        threshold=config.latency_factor,
        summary=summary,
    )
