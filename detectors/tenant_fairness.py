"""tenant_fairness: whether one tenant's requests pay for another tenant's load.

A shared deployment serves every tenant from one queue, so a small tenant arriving during a big
tenant's burst waits behind it. The aggregate p99 barely moves (the small tenant is under 1% of the
requests), which is why this is measured per tenant and not only overall.

Definitions, per window (requests that ended in it; a NULL tenant_id is a group of its own):

- n: the tenant's requests. latency_p99 / ttft_p99: the tenant's p99 of e2e_ms / ttft_ms.
- aggregate_p99 / aggregate_ttft_p99: the same p99 over ALL requests of the window, every tenant together.
- ratio = latency_p99 / aggregate_p99 (NULL when the aggregate is missing or zero).
- Score p-low: the `score_quantile` (default 0.10, i.e. p10) of each score name, per tenant (score_p_low)
  and over every scored request of the window (aggregate_score_p_low). A low tail, not a mean, because
  a tenant harmed on a minority of its requests hides in the mean.
- jain_index: Jain's fairness index J = (Σx)² / (k·Σx²) over the k tenants with at least `min_samples`
  requests, on x_i = aggregate_p99 / latency_p99_i (each tenant's speed relative to the whole window).
  1.0 is perfectly fair, 1/k is one tenant taking everything. NULL with fewer than 2 such tenants.
  Every row of a window carries the same value.

Figures are long: one row per (tenant, score name), the tenant's latency figures repeated; a tenant
without scores has one row whose score columns are NULL.

A tenant with n >= min_samples breaches when latency_p99 is at least latency_factor x aggregate_p99
(signal latency_p99), or when a score's p-low, over at least min_samples scores, sits at least score_drop
below the aggregate p-low (signal: the score name). The latency summary uses TTFT to say where the time
went: a TTFT tail as unfair as the e2e tail (by the same factor) means the requests waited before their
first token.

Alert labels (LABELS): tenant_id (absent for requests without one), signal (the score name, or
latency_p99).
"""

from __future__ import annotations

from typing import Any

import polars as pl
from pydantic import Field

from detectors.base import Condition, Detection, DetectorConfig, Read, Window
from detectors.frames import breaches, format_duration, join_scores, percentile, requests, scores

KEY = "tenant_fairness"
SUMMARY = "Per-tenant p99 and score tails against the aggregate, with Jain's fairness index."
LABELS = ("tenant_id", "signal")
REQUEST_COLUMNS = ("tenant_id", "e2e_ms", "ttft_ms")
FIGURE_COLUMNS = [
    "window_start",
    "window_end",
    "tenant_id",
    "n",
    "latency_p99",
    "ttft_p99",
    "aggregate_p99",
    "aggregate_ttft_p99",
    "ratio",
    "jain_index",
    "score_name",
    "score_p_low",
    "aggregate_score_p_low",
]


class Config(DetectorConfig):
    latency_factor: float = Field(
        1.5, gt=1, description="Alert when a tenant's e2e p99 is at least this multiple of the window's aggregate p99."
    )
    score_drop: float = Field(
        0.05, gt=0, description="Alert when a tenant's score p-low sits at least this below the aggregate p-low."
    )
    min_samples: int = Field(
        20,
        ge=1,
        description="Requests (and scores of a name) a tenant needs for a verdict and a place in Jain's index.",
    )
    score_quantile: float = Field(
        0.10, gt=0, lt=1, description="The quantile taken as a score's p-low, per tenant and in aggregate."
    )


def inputs(config: Config, window: Window) -> dict[str, Read]:
    return {"requests": requests(window, REQUEST_COLUMNS), "scores": scores(window)}


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    # Hand-built or empty frames may carry Null dtypes; the figures table needs the real ones.
    reqs = frames["requests"].with_columns(
        pl.col("tenant_id").cast(pl.String), pl.col("e2e_ms").cast(pl.Float64), pl.col("ttft_ms").cast(pl.Float64)
    )
    score_frame = frames["scores"].with_columns(pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64))

    tenants = _tenants(reqs, config)
    per_score = _scores(reqs, score_frame, config)
    figures = (
        tenants.join(per_score, on="tenant_id", how="left", nulls_equal=True)
        .with_columns(
            window_start=pl.lit(window.start, pl.Datetime("us")), window_end=pl.lit(window.end, pl.Datetime("us"))
        )
        .sort(["tenant_id", "score_name"], nulls_last=True)
    )

    qualified = pl.col("n") >= config.min_samples
    latency_rows = tenants.filter(qualified & breaches(pl.col("ratio"), config.latency_factor))
    score_rows = figures.filter(
        qualified
        & (pl.col("score_n").fill_null(0) >= config.min_samples)
        & breaches(pl.col("aggregate_score_p_low") - pl.col("score_p_low"), config.score_drop)
    )
    total = reqs.height
    conditions = [_latency_condition(r, config, window, total) for r in latency_rows.iter_rows(named=True)]
    conditions += [_score_condition(r, config, window) for r in score_rows.iter_rows(named=True)]
    return Detection(figures=figures.select(FIGURE_COLUMNS), conditions=conditions)


def _tenants(reqs: pl.DataFrame, config: Config) -> pl.DataFrame:
    aggregate = reqs.select(
        percentile("e2e_ms", 0.99, "aggregate_p99"), percentile("ttft_ms", 0.99, "aggregate_ttft_p99")
    )
    per_tenant = (
        reqs.group_by("tenant_id")
        .agg(
            pl.len().cast(pl.Int64).alias("n"),
            percentile("e2e_ms", 0.99, "latency_p99"),
            percentile("ttft_ms", 0.99, "ttft_p99"),
        )
        .join(aggregate, how="cross")
    )
    ratio = pl.when(pl.col("aggregate_p99") > 0).then(pl.col("latency_p99") / pl.col("aggregate_p99"))
    per_tenant = per_tenant.with_columns(ratio.alias("ratio"))

    # A tenant with a zero p99 has no finite relative speed; it is left out rather than made infinite.
    speed = (pl.col("aggregate_p99") / pl.col("latency_p99")).filter(
        (pl.col("n") >= config.min_samples) & (pl.col("latency_p99") > 0) & (pl.col("aggregate_p99") > 0)
    )
    jain = per_tenant.select(
        pl.when(speed.len() >= 2).then(speed.sum() ** 2 / (speed.len() * (speed**2).sum())).alias("jain_index")
    )
    return per_tenant.join(jain, how="cross")


def _scores(reqs: pl.DataFrame, score_frame: pl.DataFrame, config: Config) -> pl.DataFrame:
    joined = join_scores(score_frame, reqs, ["tenant_id"])
    aggregate = joined.group_by("name").agg(percentile("score", config.score_quantile, "aggregate_score_p_low"))
    return (
        joined.group_by("tenant_id", "name")
        .agg(percentile("score", config.score_quantile, "score_p_low"), pl.len().alias("score_n"))
        .join(aggregate, on="name")
        .rename({"name": "score_name"})
    )


def _tenant(row: dict[str, Any]) -> tuple[dict[str, str], str]:
    # An untagged group still alerts, but with no tenant_id label rather than an invented one.
    tenant = row["tenant_id"]
    if tenant is None:
        return {}, "requests without a tenant_id"
    return {"tenant_id": str(tenant)}, f"tenant {tenant}"


def _latency_condition(row: dict[str, Any], config: Config, window: Window, total: int) -> Condition:
    labels, who = _tenant(row)
    ratio = float(row["ratio"])
    ttft, aggregate_ttft = row["ttft_p99"], row["aggregate_ttft_p99"]
    if ttft is None or not aggregate_ttft:
        cause = "no TTFT was recorded to tell queueing from decoding: check its queue time against other tenants'"
    elif breaches(ttft / aggregate_ttft, config.latency_factor):
        cause = (
            f"its TTFT p99 {format_duration(ttft)} is {ttft / aggregate_ttft:.1f}x the aggregate "
            f"{format_duration(aggregate_ttft)}, so it is queued behind other tenants' load: "
            "isolate it or give it a priority lane"
        )
    else:
        cause = (
            f"its TTFT p99 {format_duration(ttft)} is in line with the aggregate {format_duration(aggregate_ttft)}, "
            "so the time goes to decoding, not waiting: check whether its requests ask for longer outputs"
        )
    summary = (
        f"{who}: p99 latency {format_duration(row['latency_p99'])} is {ratio:.1f}x the aggregate "
        f"{format_duration(row['aggregate_p99'])} over {window.label()} (n={row['n']} of {total} requests); {cause}"
    )
    return Condition(
        labels={**labels, "signal": "latency_p99"}, value=ratio, threshold=config.latency_factor, summary=summary
    )


def _score_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    labels, who = _tenant(row)
    name = str(row["score_name"])
    drop = float(row["aggregate_score_p_low"] - row["score_p_low"])
    quantile = f"p{config.score_quantile * 100:g}"
    summary = (
        f"{who}: {name} {quantile} {row['score_p_low']:.2f} is {drop:.2f} below the aggregate {quantile} "
        f"{row['aggregate_score_p_low']:.2f} over {window.label()} (n={row['score_n']} scores); its worst answers "
        "are worse than other tenants': compare its prompts and the model/deployment it is routed to with theirs"
    )
    return Condition(labels={**labels, "signal": name}, value=drop, threshold=config.score_drop, summary=summary)
