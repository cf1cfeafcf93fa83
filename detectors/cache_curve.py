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
from detectors.frames import breaches, curve, format_duration, ids_as_strings, requests, scores

KEY = "cache_curve"
SUMMARY = "Latency and quality per KV-cache-hit-ratio bucket; alerts on a cliff below the high bucket."
LABELS = ("bucket", "signal")
REFERENCE = "high"
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
        0.85, ge=0, le=1, description="A cache hit ratio above this puts a request in the high (reference) bucket."
    )
    low_threshold: float = Field(
        0.55,
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
        .with_columns(_bucket(config).alias("bucket"))
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
    conditions = _latency_conditions(buckets, config, window) + _score_conditions(figures, config, window)
    conditions.sort(key=lambda c: (BUCKET_ORDER[c.labels["bucket"]], c.labels["signal"]))
    return Detection(figures=figures, conditions=conditions)


def _bucket(config: Config) -> pl.Expr:
    ratio = pl.col("cache_hit_ratio")
    return (
        pl.when(ratio > config.high_threshold)
        .then(pl.lit("high"))
        .when(ratio < config.low_threshold)
        .then(pl.lit("low"))
        .otherwise(pl.lit("medium"))
    )


def _reference(frame: pl.DataFrame, *columns: str) -> pl.DataFrame:
    return frame.filter(pl.col("bucket") == REFERENCE).select(pl.col(c).alias(f"ref_{c}") for c in columns)


def _latency_conditions(buckets: pl.DataFrame, config: Config, window: Window) -> list[Condition]:
    others = buckets.filter(pl.col("bucket") != REFERENCE)
    paired = others.join(_reference(buckets, "n", "latency_p99"), how="cross").with_columns(
        ratio=pl.when(pl.col("ref_latency_p99") > 0).then(pl.col("latency_p99") / pl.col("ref_latency_p99"))
    )
    breached = paired.filter(
        (pl.min_horizontal("n", "ref_n") >= config.min_samples) & breaches(pl.col("ratio"), config.latency_factor)
    )
    return [_latency_condition(row, config, window) for row in breached.iter_rows(named=True)]


def _score_conditions(figures: pl.DataFrame, config: Config, window: Window) -> list[Condition]:
    others = figures.filter(pl.col("bucket") != REFERENCE)
    reference = _reference(figures, "score_name", "n", "score_mean", "score_n")
    paired = others.join(reference, left_on="score_name", right_on="ref_score_name").with_columns(
        drop=pl.col("ref_score_mean") - pl.col("score_mean")
    )
    enough = pl.min_horizontal("n", "ref_n", "score_n", "ref_score_n") >= config.min_samples
    breached = paired.filter(enough & breaches(pl.col("drop"), config.score_drop))
    return [_score_condition(row, config, window) for row in breached.iter_rows(named=True)]


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
