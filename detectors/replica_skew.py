"""replica_skew: whether one replica answers worse, or slower, than the rest of the fleet on the same traffic.

Replicas behind one load balancer see the same mix of requests, so a replica whose scores or tail latency
part from its peers has something of its own wrong: a bad weight reload, a stale adapter, a different
engine build, a throttled GPU. Structured output (JSON, tool calls, schemas) is the first to drift, so
those scores are listed first and flagged in the alerts.

Definitions, per window (requests that ended in it; a NULL replica_id is a group of its own):

- n, latency_p99 / tpot_p99 (p99 of e2e_ms / tpot_ms), error_rate (share of status_code 'ERROR'): per
  replica.
- fleet_n, fleet_latency_p99, fleet_tpot_p99, fleet_error_rate: the same over the rest of the fleet, i.e.
  every request of the window outside the replica (untagged requests included).
- score_mean / score_n: the mean and count of each score name over the replica's requests;
  fleet_score_mean: the mean of that score over the rest of the fleet's.

Figures are long: one row per (replica, score name), the replica's request figures repeated; a replica
without scores has one row whose score columns are NULL.

A replica breaches when a score's mean is at least score_drop below the rest of the fleet's (signal: the
score name), or when its latency_p99 is at least latency_factor x the fleet's (signal latency_p99). The
replica and the rest of the fleet each need min_samples requests, and for a score as many scores of that
name. Error rates are figures only: an erroring replica is the load balancer's health check's job.

Alert labels (LABELS): replica_id (absent for requests without one), signal (the score name, or
latency_p99).
"""

from __future__ import annotations

from typing import Any

import polars as pl
from pydantic import Field

from detectors.base import Condition, Detection, DetectorConfig, Read, Window
from detectors.frames import breaches, format_duration, ids_as_strings, join_scores, percentile, requests, scores

KEY = "replica_skew"
SUMMARY = "Each replica's latency, errors and scores against the rest of the fleet."
LABELS = ("replica_id", "signal")
REQUEST_COLUMNS = ("status_code", "replica_id", "e2e_ms", "tpot_ms")
FIGURE_COLUMNS = [
    "window_start",
    "window_end",
    "replica_id",
    "n",
    "latency_p99",
    "tpot_p99",
    "error_rate",
    "fleet_n",
    "fleet_latency_p99",
    "fleet_tpot_p99",
    "fleet_error_rate",
    "score_name",
    "score_mean",
    "fleet_score_mean",
    "score_n",
]


class Config(DetectorConfig):
    score_drop: float = Field(
        0.05, gt=0, description="Alert when a replica's mean of a score is at least this below the rest of the fleet's."
    )
    structured_scores: tuple[str, ...] = Field(
        ("json_adherence", "tool_call_correctness", "schema_validity"),
        description="Scores of structured output, listed first and flagged in alerts: a replica's drift shows there "
        "first.",
    )
    latency_factor: float = Field(
        1.5, gt=1, description="Alert when a replica's e2e p99 is at least this multiple of the rest of the fleet's."
    )
    min_samples: int = Field(
        30,
        ge=1,
        description="Requests (and scores of a name) both the replica and the rest of the fleet need for a verdict.",
    )


def inputs(config: Config, window: Window) -> dict[str, Read]:
    return {"requests": requests(window, REQUEST_COLUMNS), "scores": scores(window)}


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    # Hand-built or empty frames may carry Null dtypes; the figures table needs the real ones.
    reqs = frames["requests"].with_columns(
        *ids_as_strings(frames["requests"]),
        pl.col("status_code", "replica_id").cast(pl.String),
        pl.col("e2e_ms", "tpot_ms").cast(pl.Float64),
    )
    score_frame = frames["scores"].with_columns(
        *ids_as_strings(frames["scores"]), pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64)
    )

    replicas = _replicas(reqs)
    long = (
        replicas.join(_scores(reqs, score_frame), on="replica_id", how="left", nulls_equal=True)
        .with_columns(
            window_start=pl.lit(window.start, pl.Datetime("us")), window_end=pl.lit(window.end, pl.Datetime("us"))
        )
        .sort(["replica_id", "score_name"], nulls_last=True)
    )
    conditions = _score_conditions(long, config, window) + _latency_conditions(replicas, config, window)
    conditions.sort(key=lambda c: _priority(c, config))
    return Detection(figures=long.select(FIGURE_COLUMNS), conditions=conditions)


def _request_figures(prefix: str = "") -> list[pl.Expr]:
    return [
        pl.len().cast(pl.Int64).alias(f"{prefix}n"),
        percentile("e2e_ms", 0.99, f"{prefix}latency_p99"),
        percentile("tpot_ms", 0.99, f"{prefix}tpot_p99"),
        (pl.col("status_code") == "ERROR").mean().cast(pl.Float64).alias(f"{prefix}error_rate"),
    ]


def _replicas(reqs: pl.DataFrame) -> pl.DataFrame:
    own = reqs.group_by("replica_id").agg(*_request_figures())
    # A percentile of the rest of the fleet does not follow from per-replica figures, so each replica's
    # complement is its own pass: ~0.2 s a replica over a day of 10M requests. Eager, over only the columns
    # it reads: the lazy engine took three times as long on the same frames (measured).
    slim = reqs.select("replica_id", "e2e_ms", "tpot_ms", "status_code")
    rest = [
        slim.filter(pl.col("replica_id").ne_missing(replica)).select(
            pl.lit(replica, pl.String).alias("replica_id"), *_request_figures("fleet_")
        )
        for replica in own["replica_id"]
    ]
    typed = slim.clear().group_by("replica_id").agg(*_request_figures("fleet_"))
    return own.join(pl.concat([typed, *rest]), on="replica_id", how="left", nulls_equal=True)


def _scores(reqs: pl.DataFrame, score_frame: pl.DataFrame) -> pl.DataFrame:
    joined = join_scores(score_frame, reqs, ["replica_id"])
    own = joined.group_by("replica_id", "name").agg(
        pl.col("score").sum().alias("score_sum"), pl.len().cast(pl.Int64).alias("score_n")
    )
    # Means, unlike percentiles, subtract: the rest of the fleet is the window's total less the replica.
    total = own.group_by("name").agg(
        pl.col("score_sum").sum().alias("total_sum"), pl.col("score_n").sum().alias("total_n")
    )
    fleet_n = pl.col("total_n") - pl.col("score_n")
    return own.join(total, on="name").select(
        "replica_id",
        pl.col("name").alias("score_name"),
        (pl.col("score_sum") / pl.col("score_n")).alias("score_mean"),
        pl.when(fleet_n > 0).then((pl.col("total_sum") - pl.col("score_sum")) / fleet_n).alias("fleet_score_mean"),
        "score_n",
        fleet_n.alias("fleet_score_n"),
    )


def _score_conditions(long: pl.DataFrame, config: Config, window: Window) -> list[Condition]:
    enough = pl.min_horizontal("n", "fleet_n", "score_n", "fleet_score_n") >= config.min_samples
    breached = long.with_columns(drop=pl.col("fleet_score_mean") - pl.col("score_mean")).filter(
        enough & breaches(pl.col("drop"), config.score_drop)
    )
    return [_score_condition(row, config, window) for row in breached.iter_rows(named=True)]


def _latency_conditions(replicas: pl.DataFrame, config: Config, window: Window) -> list[Condition]:
    ratio = pl.when(pl.col("fleet_latency_p99") > 0).then(pl.col("latency_p99") / pl.col("fleet_latency_p99"))
    breached = replicas.with_columns(ratio=ratio).filter(
        (pl.min_horizontal("n", "fleet_n") >= config.min_samples) & breaches(pl.col("ratio"), config.latency_factor)
    )
    return [_latency_condition(row, config, window) for row in breached.iter_rows(named=True)]


def _priority(condition: Condition, config: Config) -> tuple[int, str, bool, str]:
    # Structured scores first (in their configured order), then the other scores, then latency.
    signal = condition.labels["signal"]
    if signal in config.structured_scores:
        rank = config.structured_scores.index(signal)
    else:
        rank = len(config.structured_scores) + (signal == "latency_p99")
    replica = condition.labels.get("replica_id")
    return rank, signal, replica is None, replica or ""


def _replica(row: dict[str, Any]) -> tuple[dict[str, str], str]:
    # An untagged group still alerts, but with no replica_id label rather than an invented one.
    replica = row["replica_id"]
    if replica is None:
        return {}, "requests without a replica_id"
    return {"replica_id": str(replica)}, f"replica {replica}"


def _score_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    labels, who = _replica(row)
    name, drop = str(row["score_name"]), float(row["drop"])
    if name in config.structured_scores:
        advice = "structured output drifts first: drain and reload the replica"
    else:
        advice = (
            "it answers worse than its peers on the same traffic: compare its weights, adapters and engine "
            "version with the rest of the fleet's, then drain and reload it"
        )
    summary = (
        f"{who}: {name} mean {row['score_mean']:.2f} vs {row['fleet_score_mean']:.2f} on the rest of the fleet "
        f"(−{drop:.2f}) over {window.label()}, n={row['score_n']:,} vs {row['fleet_score_n']:,}; {advice}"
    )
    return Condition(labels={**labels, "signal": name}, value=drop, threshold=config.score_drop, summary=summary)


def _latency_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    labels, who = _replica(row)
    ratio = float(row["ratio"])
    tpot, fleet_tpot = row["tpot_p99"], row["fleet_tpot_p99"]
    if tpot is None or not fleet_tpot:
        cause = "no TPOT was recorded to tell decoding from waiting: compare its queue time with the fleet's"
    elif breaches(tpot / fleet_tpot, config.latency_factor):
        cause = (
            f"its TPOT p99 {format_duration(tpot)} is {tpot / fleet_tpot:.1f}x the fleet's "
            f"{format_duration(fleet_tpot)}, so it decodes slower on the same traffic: check its GPU (clocks, "
            "thermals, memory errors) and drain it"
        )
    else:
        cause = (
            f"its TPOT p99 {format_duration(tpot)} is in line with the fleet's {format_duration(fleet_tpot)}, so "
            "the time goes before decoding: check that the load balancer is not sending it more than its share"
        )
    summary = (
        f"{who}: e2e p99 {format_duration(row['latency_p99'])} is {ratio:.1f}x the rest of the fleet's "
        f"{format_duration(row['fleet_latency_p99'])} over {window.label()}, n={row['n']:,} vs {row['fleet_n']:,}; "
        f"{cause}"
    )
    return Condition(
        labels={**labels, "signal": "latency_p99"}, value=ratio, threshold=config.latency_factor, summary=summary
    )
