"""Shared inputs and figures: the requests and scores of a window, percentiles, score means, the breach rule."""

from __future__ import annotations

from typing import overload

import polars as pl

from detectors.base import Window
from storage.ports import Requests, Scores

# Means of decimal scores are not exact (0.90 - 0.80 is 0.0999...): a drop shown as 0.10 must meet a
# 0.10 threshold, so the breach rule (`breaches`) allows this much.
TOLERANCE = 1e-9


def requests(window: Window, columns: tuple[str, ...]) -> Requests:
    """The LLM requests (client/server pairs counted once) that ended inside the window."""
    return Requests(window, columns)


def scores(window: Window) -> Scores:
    """Every score of those requests, long format: (request_key, name, score)."""
    return Scores(window)


IDS = ("trace_id", "span_id")


def ids_as_strings(frame: pl.DataFrame) -> list[pl.Expr]:
    """The id columns a frame has, as strings. Fetched frames identify a request by `request_key`
    alone; hand-built ones by their two ids, typed Null when empty."""
    return [pl.col(c).cast(pl.String) for c in IDS if c in frame.columns]


def request_key(*frames: pl.DataFrame) -> pl.Expr:
    """One 64-bit key per request, as `_request`, that joins these frames: storage's `request_key` when
    every one has it, else a hash of the two ids (hand-built frames). The two hashes never meet."""
    # A 64-bit key rather than the two strings: twice as fast to join over a day of requests, and no
    # id string of the day has to enter Python; a collision among one window's requests is
    # vanishingly unlikely.
    if all("request_key" in f.columns for f in frames):
        return pl.col("request_key").alias("_request")
    return pl.struct(pl.col(*IDS).cast(pl.String)).hash().alias("_request")


def percentile(column: str, q: float, alias: str) -> pl.Expr:
    # Linear interpolation, as DuckDB's quantile_cont: the two engines agree to 1e-13 (stack notes).
    return pl.col(column).quantile(q, interpolation="linear").alias(alias)


def join_scores(scores_frame: pl.DataFrame, requests_frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Each score with the `by` columns of its request."""
    key = request_key(scores_frame, requests_frame)
    left = scores_frame.select(key, "name", "score")
    right = requests_frame.select(key, *by)
    return left.join(right, on="_request").drop("_request")


def score_means(
    requests_frame: pl.DataFrame, scores_frame: pl.DataFrame, by: list[str], how: str = "mean"
) -> pl.DataFrame:
    """Per group in `by` and score name: the mean (or p10 with how='p_low') score and how many there were."""
    joined = join_scores(scores_frame, requests_frame, by)
    value = pl.col("score").mean() if how == "mean" else pl.col("score").quantile(0.10, interpolation="linear")
    return (
        joined.group_by([*by, "name"])
        .agg(value.alias("score_value"), pl.len().alias("score_n"))
        .rename({"name": "score_name"})
    )


def curve(requests_frame: pl.DataFrame, scores_frame: pl.DataFrame, by: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Latency and quality by one grouping column (a cache bucket, a traffic pattern).

    Returns the per-group latency figures (n, latency_p50/p99 of e2e_ms, tpot_p99) and the long
    figures: those joined with each score's mean, one row per (group, score), a group without scores
    keeping one row with NULL score columns.
    """
    groups = requests_frame.group_by(by).agg(
        pl.len().cast(pl.Int64).alias("n"),
        percentile("e2e_ms", 0.50, "latency_p50"),
        percentile("e2e_ms", 0.99, "latency_p99"),
        percentile("tpot_ms", 0.99, "tpot_p99"),
    )
    means = score_means(requests_frame, scores_frame, [by]).select(
        by, "score_name", pl.col("score_value").alias("score_mean"), pl.col("score_n").cast(pl.Int64)
    )
    return groups, groups.join(means, on=by, how="left")


@overload
def breaches(value: pl.Expr, threshold: float | pl.Expr) -> pl.Expr: ...
@overload
def breaches(value: float, threshold: float) -> bool: ...
def breaches(value: pl.Expr | float, threshold: float | pl.Expr) -> pl.Expr | bool:
    """Whether a group's figure against its reference breaches a threshold: the one rule of every detector.

    `value` is how far the group is from its reference (a score's drop below it, a latency p99's ratio
    to it) and breaches at least the threshold, allowing TOLERANCE for decimal means: a drop of 0.10
    meets a 0.10 threshold however its floating-point difference came out. As an expression, a NULL
    value (no reference to compare with) never breaches; plain floats give a bool.
    """
    at_least = value >= threshold - TOLERANCE
    return at_least.fill_null(False) if isinstance(at_least, pl.Expr) else at_least


def format_duration(ms: float | None) -> str:
    """Milliseconds as a person reads them in an alert: '850 ms', '3.4 s'."""
    if ms is None:
        return "n/a"
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"
