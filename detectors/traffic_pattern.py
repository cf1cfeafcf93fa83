"""traffic_pattern: whether requests that arrive in a burst get worse answers or slower ones than steady traffic.

A burst fills the batch and the queue faster than the scheduler drains them; if that costs quality or
latency it shows as a gap between the requests that arrived in bursty minutes and those that did not.

Every request is labelled from the neighbourhood_seconds of arrival time (start_time) centred on its
own arrival, per deployment (one deployment's burst is not another's load), from one of two measures
(the `signal` column of traffic_pattern_labels, not the alert label of that name):

- signal queue_depth, when the neighbourhood has queue_depth values: peak = their max, mean = the mean
  over the neighbourhood's seconds of each second's mean queue depth (time-weighted, seconds without a
  value left out), so a burst's many samples do not make up its own baseline.
- signal arrival_rate otherwise: per-second arrival counts over the neighbourhood, seconds without an
  arrival counted as zero; peak = the largest count, mean = the mean count.
- pattern: burst when peak > burst_factor x mean; else sustained when the request has a replica_count
  and mean > sustained_utilisation x replica_count x slots_per_replica; else steady.

The window is on end_time and the neighbourhood on arrival, so the requests are fetched from half a
neighbourhood before the window, and only those that ended in the window are labelled and counted.
At either edge the neighbourhood is cut to the fetched seconds rather than padded with zeros that
would read as a lull. Requests still in flight at the window's end are not fetched, so the last few
seconds undercount arrivals by the share of requests slower than their distance to the end.

Figures are long: one row per (pattern, score name) with n, latency_p50 / latency_p99 (of e2e_ms) and
tpot_p99 repeated; a pattern without scores has one row whose score columns are NULL. The labels
themselves go to traffic_pattern_labels, one row per (deployment, arrival second, replica_count) with
the window's requests of that key; the request_traffic_patterns view gives them per request.

The burst pattern breaches when a score's mean is at least score_drop below steady's (signal: the
score name), or when its latency_p99 is at least latency_factor x steady's (signal latency_p99). Both
sides need min_samples requests, and for a score as many scores of that name.

Alert labels (LABELS): pattern (always burst), signal (the score name, or latency_p99).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import polars as pl
from pydantic import Field

from detectors.base import Condition, Detection, DetectorConfig, Read, Window
from detectors.comparison import Comparison
from detectors.frames import curve, format_duration, requests, scores

KEY = "traffic_pattern"
SUMMARY = "Labels every request burst, sustained or steady; alerts when bursts cost quality or latency."
LABELS = ("pattern", "signal")
LABELS_TABLE = "traffic_pattern_labels"
PATTERN_ORDER = {"steady": 0, "sustained": 1, "burst": 2}
# Bursts are judged against steady traffic; sustained traffic is a figure only.
COMPARISON = Comparison("pattern", "steady", judged=("burst",))
# No ids: a day is ten million requests, and the labels are stored per arrival second, not per request.
REQUEST_COLUMNS = (
    "start_time", "end_time", "deployment", "e2e_ms", "tpot_ms", "queue_depth", "replica_count",
)  # fmt: skip
FIGURE_COLUMNS = [
    "window_start",
    "window_end",
    "pattern",
    "n",
    "latency_p50",
    "latency_p99",
    "tpot_p99",
    "score_name",
    "score_mean",
    "score_n",
]
LABEL_COLUMNS = [
    "window_start", "window_end", "deployment", "arrival_second", "replica_count", "requests", "pattern", "signal",
]  # fmt: skip
_EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)


class Config(DetectorConfig):
    neighbourhood_seconds: int = Field(
        60, ge=2, description="Seconds of arrival time, centred on a request's arrival, that label it."
    )
    burst_factor: float = Field(
        2.5, gt=1, description="Burst when the neighbourhood's peak exceeds this multiple of its mean."
    )
    sustained_utilisation: float = Field(
        0.7,
        gt=0,
        description="Sustained when the neighbourhood's mean exceeds this share of replica_count x slots_per_replica.",
    )
    slots_per_replica: int = Field(
        16, ge=1, description="Sequences one replica serves at once: the capacity unit of the sustained test."
    )
    score_drop: float = Field(
        0.10, gt=0, description="Alert when burst traffic's mean of a score is at least this below steady's."
    )
    latency_factor: float = Field(
        2.0, gt=1, description="Alert when burst traffic's e2e p99 is at least this multiple of steady's."
    )
    min_samples: int = Field(
        30, ge=1, description="Requests (and scores of a name) both burst and steady traffic need for a verdict."
    )


def inputs(config: Config, window: Window) -> dict[str, Read]:
    lookback = Window(window.start - timedelta(seconds=config.neighbourhood_seconds // 2), window.end)
    return {"requests": requests(lookback, REQUEST_COLUMNS), "scores": scores(window)}


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    # Hand-built or empty frames may carry Null dtypes; the tables need the real ones.
    reqs = frames["requests"].with_columns(
        pl.col("request_key").cast(pl.UInt64),
        pl.col("deployment").cast(pl.String),
        pl.col("start_time", "end_time").cast(pl.Datetime("us")),
        pl.col("e2e_ms", "tpot_ms").cast(pl.Float64),
        pl.col("queue_depth", "replica_count").cast(pl.Int64),
    )
    score_frame = frames["scores"].with_columns(
        pl.col("request_key").cast(pl.UInt64), pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64)
    )
    bounds = {
        "window_start": pl.lit(window.start, pl.Datetime("us")),
        "window_end": pl.lit(window.end, pl.Datetime("us")),
    }
    labelled, seconds = label(reqs, config, window)

    patterns, long = curve(labelled, score_frame, "pattern")
    figures = (
        long.with_columns(**bounds)
        .sort([pl.col("pattern").replace_strict(PATTERN_ORDER), pl.col("score_name")], nulls_last=True)
        .select(FIGURE_COLUMNS)
    )
    latency, score = COMPARISON.judge(patterns, figures, config)
    conditions = [_latency_condition(r, config, window) for r in latency]
    conditions += [_score_condition(r, config, window) for r in score]
    return Detection(
        figures=figures,
        conditions=conditions,
        extra_tables={LABELS_TABLE: seconds.with_columns(**bounds).select(LABEL_COLUMNS)},
    )


def label(reqs: pl.DataFrame, config: Config, window: Window) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The requests that ended in the window with their pattern, and the labels per arrival second.

    A request's pattern depends only on (deployment, arrival second, replica_count), so the stored labels
    are one row per such key; `request_traffic_patterns` joins them back to requests in SQL.
    """
    half = config.neighbourhood_seconds // 2
    width = 2 * half + 1
    arrivals = reqs.with_columns(second=pl.col("start_time").dt.epoch("s"))
    per_second = arrivals.group_by("deployment", "second").agg(
        pl.len().alias("arrivals"),
        pl.col("queue_depth").mean().alias("depth_mean"),
        pl.col("queue_depth").count().alias("depth_n"),
        pl.col("queue_depth").max().alias("depth_max"),
    )
    # Dense over the whole fetched span, so a lull before a burst counts as the zeros it was.
    first = (window.start - _EPOCH) // _SECOND - half
    last = (window.end - _EPOCH - timedelta(microseconds=1)) // _SECOND
    spans = per_second.group_by("deployment").agg(
        pl.min_horizontal(pl.col("second").min(), pl.lit(first)).alias("lo"),
        pl.max_horizontal(pl.col("second").max(), pl.lit(last)).alias("hi"),
    )
    dense = (
        spans.select("deployment", pl.int_ranges("lo", pl.col("hi") + 1).alias("second"))
        .explode("second")
        .join(per_second, on=["deployment", "second"], how="left", nulls_equal=True)
        .with_columns(pl.col("arrivals", "depth_n").fill_null(0))
        .sort("deployment", "second", nulls_last=True)
    )

    neighbourhood = dense.select(
        "deployment",
        "second",
        pl.col("arrivals").rolling_max(width, center=True, min_samples=1).over("deployment").alias("arrival_peak"),
        pl.col("arrivals").rolling_mean(width, center=True, min_samples=1).over("deployment").alias("arrival_mean"),
        pl.col("depth_max").rolling_max(width, center=True, min_samples=1).over("deployment").alias("depth_peak"),
        # Time-weighted: the mean of each second's queue depth, over the seconds that report one. Weighting
        # by requests instead would let a burst's own samples dominate its neighbourhood's mean, and a
        # minute-long spike could never be more than 2.5x "its" mean.
        pl.col("depth_mean")
        .fill_null(0)
        .rolling_sum(width, center=True, min_samples=1)
        .over("deployment")
        .alias("depth_sum"),
        (pl.col("depth_n") > 0)
        .cast(pl.Int64)
        .rolling_sum(width, center=True, min_samples=1)
        .over("deployment")
        .alias("depth_n"),
    )

    by_depth = pl.col("depth_n") > 0
    peak = pl.when(by_depth).then(pl.col("depth_peak")).otherwise(pl.col("arrival_peak"))
    mean = pl.when(by_depth).then(pl.col("depth_sum") / pl.col("depth_n")).otherwise(pl.col("arrival_mean"))
    # A NULL replica_count makes the comparison NULL, which `when` reads as false: the sustained test is skipped.
    capacity = config.sustained_utilisation * pl.col("replica_count") * config.slots_per_replica
    pattern = (
        pl.when(peak > config.burst_factor * mean)
        .then(pl.lit("burst"))
        .when(mean > capacity)
        .then(pl.lit("sustained"))
        .otherwise(pl.lit("steady"))
    )
    keys = ["deployment", "second", "replica_count"]
    in_window = (pl.col("end_time") >= window.start) & (pl.col("end_time") < window.end)
    # Only the columns the figures need go on: a day of requests is ten million rows.
    inside = arrivals.filter(in_window).select(*keys, "request_key", "e2e_ms", "tpot_ms")
    decided = (
        inside.group_by(keys)
        .agg(pl.len().alias("requests"))
        .join(neighbourhood, on=["deployment", "second"], how="left", nulls_equal=True)
        .select(
            *keys,
            "requests",
            pattern.alias("pattern"),
            pl.when(by_depth).then(pl.lit("queue_depth")).otherwise(pl.lit("arrival_rate")).alias("signal"),
        )
    )
    labelled = inside.join(decided.select(*keys, "pattern"), on=keys, how="left", nulls_equal=True)
    seconds = decided.sort(keys, nulls_last=True).select(
        "deployment",
        pl.from_epoch("second", time_unit="s").cast(pl.Datetime("us")).alias("arrival_second"),
        "replica_count",
        pl.col("requests").cast(pl.Int64),
        "pattern",
        "signal",
    )
    return labelled, seconds


def _describe(config: Config) -> str:
    return f"burst traffic (a {config.neighbourhood_seconds} s peak above {config.burst_factor:g}x its mean)"


def _score_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    name, drop = str(row["score_name"]), float(row["drop"])
    summary = (
        f"{_describe(config)}: {name} mean {row['score_mean']:.2f} vs {row['ref_score_mean']:.2f} in steady "
        f"traffic (−{drop:.2f}) over {window.label()}, n={row['score_n']} vs {row['ref_score_n']}; bursts are "
        "costing quality: add headroom ahead of them or smooth admission at the gateway"
    )
    return Condition(
        labels={"pattern": "burst", "signal": name}, value=drop, threshold=config.score_drop, summary=summary
    )


def _latency_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    ratio = float(row["ratio"])
    summary = (
        f"{_describe(config)}: e2e p99 {format_duration(row['latency_p99'])} is {ratio:.1f}x steady traffic's "
        f"{format_duration(row['ref_latency_p99'])} over {window.label()}, n={row['n']} vs {row['ref_n']}; "
        "burst arrivals wait for capacity: add headroom ahead of them or smooth admission at the gateway"
    )
    return Condition(
        labels={"pattern": "burst", "signal": "latency_p99"},
        value=ratio,
        threshold=config.latency_factor,
        summary=summary,
    )
