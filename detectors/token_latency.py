"""token_latency: per-output-token decode latency (tpot_ms) p99 per window against its trailing baseline.

Continuous batching makes decode jitter when long prefills land beside short decodes; that shows in
the tail of tpot, not its mean. Per model/deployment (and per tenant), the window's p99 is compared
with the p99 of the trailing baseline period before it, and a breach is tagged with its likely reason.
The baseline leaves out the windows in which a group breached: were they in it, one fault would raise the
bar (a band of 15–30 ms became 42–84 ms after one) and hide the next.
The ratio breaches, and turns critical, by the rule every detector judges a group against its reference
with (`frames.breaches`: at least the threshold); a cache hit ratio's fall below the baseline's is judged
by it too.

Alert labels (LABELS): model, deployment, tenant_id (tenant-level alerts only); a label whose value is
missing is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import polars as pl
from pydantic import Field

from detectors.base import Condition, Detection, DetectorConfig, Severity, Window
from detectors.frames import breaches, percentile
from storage.ports import Aggregate, Breached, Measure, Read, Requests, RequestSummary

KEY = "token_latency"
SUMMARY = "Per-output-token decode latency p99 per window against its trailing baseline."
LABELS = ("model", "deployment", "tenant_id")
MODEL_KEYS = ["model", "deployment"]
TENANT_KEYS = ["model", "deployment", "tenant_id"]
WINDOW_COLUMNS = (
    "model", "deployment", "tenant_id", "tpot_ms", "prefill_tokens_in_batch", "cache_hit_ratio", "queue_ms", "e2e_ms",
    # Engine facts of each request's replica (joined from engine metrics): the reasons a span cannot give.
    "kv_cache_usage", "preemptions", "step_tokens",
)  # fmt: skip
# The baseline's rows per grouping set: 0 per model/deployment, 1 per tenant within one.
MODEL_SET, TENANT_SET = 0, 1


class Config(DetectorConfig):
    baseline_hours: float = Field(
        24.0, gt=0, description="Length of the trailing baseline, ending at the last full hour before the window."
    )
    baseline_excludes_breaches: bool = Field(
        True,
        description="Leave out of the baseline the requests of each group in the windows where it breached, so a "
        "fault does not raise the bar the next one is judged against.",
    )
    ratio_threshold: float = Field(2.0, gt=1, description="Alert when window p99 / baseline p99 reaches this.")
    critical_ratio: float = Field(3.0, gt=1, description="At or above this ratio the alert is critical.")
    min_samples: int = Field(50, ge=1, description="Requests with a tpot_ms the window needs for a verdict.")
    min_baseline_samples: int = Field(200, ge=1, description="Requests the baseline needs for a verdict.")
    per_tenant: bool = Field(True, description="Also evaluate each tenant within a model/deployment.")
    prefill_tokens_threshold: int = Field(
        4000, ge=1, description="A slow request beside more prefill tokens than this counts toward prefill_burst."
    )
    prefill_share_threshold: float = Field(
        0.5, ge=0, le=1, description="prefill_burst when this share of the window's slow requests saw big prefills."
    )
    kv_drop_threshold: float = Field(
        0.15, ge=0, le=1, description="kv_eviction when the mean cache hit ratio fell this much below the baseline."
    )
    queue_share_threshold: float = Field(
        0.5, ge=0, le=1, description="scheduler_starve when the median request spent this share of e2e queued."
    )
    preempted_share_threshold: float = Field(
        0.5,
        ge=0,
        le=1,
        description="preemption when this share of the slow requests ran while their replica preempted.",
    )
    kv_usage_threshold: float = Field(
        0.95,
        ge=0,
        le=1,
        description="kv_pressure when the slow requests' median KV-cache usage at arrival reached this.",
    )
    step_tokens_threshold: float = Field(
        4096, gt=0, description="batch_tokens when the slow requests' median tokens per engine step reached this."
    )


# A slow request: slower than its group's baseline p99.
_slow = pl.col("tpot_ms") > pl.col("baseline_p99")


def _hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def inputs(config: Config, window: Window) -> dict[str, Read]:
    # The baseline runs up to the last full hour before the window, so it stays the same read for an
    # hour of 5-minute evaluations and the pass reuses it: a day of spans is read once an hour.
    baseline_end = _hour(window.start)
    baseline_start = baseline_end - timedelta(hours=config.baseline_hours)
    return {
        "window": Requests(window, WINDOW_COLUMNS, require=("tpot_ms",)),
        # Summarised where the data is: a day of requests never leaves storage, only one row per group.
        "baseline": RequestSummary(
            Window(baseline_start, baseline_end),
            grouping_sets=(tuple(MODEL_KEYS), tuple(TENANT_KEYS)),
            measures=(
                Measure("baseline_n", Aggregate.COUNT),
                Measure("baseline_p99", Aggregate.QUANTILE, "tpot_ms", 0.99),
                Measure("baseline_cache_hit_mean", Aggregate.MEAN, "cache_hit_ratio"),
            ),
            require=("tpot_ms",),
            cacheable=True,
            # A model's breach leaves out every tenant's requests of it; a tenant's, that tenant's alone.
            leave_out=Breached(KEY, keys=tuple(MODEL_KEYS), optional=("tenant_id",))
            if config.baseline_excludes_breaches
            else None,
        ),
    }


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    current = frames["window"]
    baseline = frames["baseline"]
    groupings = [("model", MODEL_KEYS)] + ([("tenant", TENANT_KEYS)] if config.per_tenant else [])
    parts = [_figures(current, baseline, keys, name, config) for name, keys in groupings]
    figures = pl.concat(parts, how="diagonal_relaxed").with_columns(
        window_start=pl.lit(window.start), window_end=pl.lit(window.end)
    )
    conditions = [_condition(row, config, window) for row in figures.filter(pl.col("breached")).iter_rows(named=True)]
    return Detection(figures=figures, conditions=conditions)


def _figures(
    current: pl.DataFrame, baseline: pl.DataFrame, keys: list[str], grouping: str, config: Config
) -> pl.DataFrame:
    base = baseline.filter(pl.col("grouping_set") == (MODEL_SET if grouping == "model" else TENANT_SET)).select(
        [*keys, "baseline_n", "baseline_p99", "baseline_cache_hit_mean"]
    )
    with_base = current.join(base, on=keys, how="left", nulls_equal=True)
    figures = with_base.group_by(keys).agg(
        pl.len().alias("n"),
        percentile("tpot_ms", 0.50, "tpot_p50"),
        percentile("tpot_ms", 0.99, "tpot_p99"),
        pl.col("baseline_n").first(),
        pl.col("baseline_p99").first(),
        pl.col("cache_hit_ratio").mean().alias("cache_hit_mean"),
        pl.col("baseline_cache_hit_mean").first(),
        (pl.col("queue_ms") / pl.col("e2e_ms")).median().alias("queue_share"),
        # Among the requests slower than the baseline p99, the share that decoded beside a big prefill.
        (pl.col("prefill_tokens_in_batch") > config.prefill_tokens_threshold)
        .filter(_slow)
        .mean()
        .alias("prefill_share"),
        # What the engines of the slow requests' replicas were doing while they ran.
        (pl.col("preemptions") > 0).filter(_slow).mean().alias("preempted_share"),
        pl.col("kv_cache_usage").filter(_slow).median().alias("kv_usage_p50"),
        pl.col("step_tokens").filter(_slow).median().alias("step_tokens_p50"),
    )
    if "tenant_id" not in keys:
        figures = figures.with_columns(tenant_id=pl.lit(None, pl.String))
    ratio = pl.col("tpot_p99") / pl.col("baseline_p99")
    breached = (
        (pl.col("n") >= config.min_samples)
        & (pl.col("baseline_n").fill_null(0) >= config.min_baseline_samples)
        & breaches(ratio, config.ratio_threshold)
    )
    reason = (
        pl.when(pl.col("prefill_share").fill_null(0) >= config.prefill_share_threshold)
        .then(pl.lit("prefill_burst"))
        .when(breaches(pl.col("preempted_share"), config.preempted_share_threshold).fill_null(False))
        .then(pl.lit("preemption"))
        .when(breaches(pl.col("kv_usage_p50"), config.kv_usage_threshold).fill_null(False))
        .then(pl.lit("kv_pressure"))
        .when(breaches(pl.col("baseline_cache_hit_mean") - pl.col("cache_hit_mean"), config.kv_drop_threshold))
        .then(pl.lit("kv_eviction"))
        .when(breaches(pl.col("step_tokens_p50"), config.step_tokens_threshold).fill_null(False))
        .then(pl.lit("batch_tokens"))
        .when(pl.col("queue_share").fill_null(0) >= config.queue_share_threshold)
        .then(pl.lit("scheduler_starve"))
        .otherwise(pl.lit("unknown"))
    )
    return figures.with_columns(
        grouping=pl.lit(grouping),
        ratio=ratio,
        breached=breached,
        reason=pl.when(breached).then(reason).otherwise(pl.lit(None, pl.String)),
    )


_EVIDENCE: dict[str, Callable[[dict[str, Any], Config], str]] = {
    "prefill_burst": lambda r, c: (
        f"{r['prefill_share']:.0%} of the slow requests decoded beside > {c.prefill_tokens_threshold} prefill tokens"
    ),
    "kv_eviction": lambda r, c: (
        f"cache hit ratio fell to {r['cache_hit_mean']:.2f} from a baseline {r['baseline_cache_hit_mean']:.2f}"
    ),
    "preemption": lambda r, c: f"{r['preempted_share']:.0%} of the slow requests ran while their replica preempted",
    "kv_pressure": lambda r, c: f"the slow requests' replicas had {r['kv_usage_p50']:.0%} of the KV cache in use",
    "batch_tokens": lambda r, c: f"the slow requests' replicas ran {r['step_tokens_p50']:.0f} tokens per step",
    "scheduler_starve": lambda r, c: f"the median request spent {r['queue_share']:.0%} of its time queued",
    "unknown": lambda r, c: "no prefill burst, preemption, KV pressure, cache drop or queueing explains it",
}


def _engine_context(row: dict[str, Any]) -> str:
    """What the slow requests' engines were doing, when engine metrics say: "while the KV cache sat at 97%"."""
    facts = []
    if row.get("kv_usage_p50") is not None:
        facts.append(f"the KV cache sat at {row['kv_usage_p50']:.0%}")
    if row.get("preempted_share"):
        facts.append(f"{row['preempted_share']:.0%} of the slow requests saw preemptions")
    if row.get("step_tokens_p50") is not None:
        facts.append(f"steps ran {row['step_tokens_p50']:.0f} tokens")
    return f"while {', '.join(facts)}; " if facts else ""


def _condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    labels = {k: str(row[k]) for k in TENANT_KEYS if row.get(k) is not None}
    ratio = float(row["ratio"])
    group = ", ".join(f"{k}={v}" for k, v in labels.items()) or "all requests"
    reason = str(row["reason"])
    summary = (
        f"tpot p99 {row['tpot_p99']:.1f} ms is {ratio:.1f}x the {config.baseline_hours:g}h baseline "
        f"{row['baseline_p99']:.1f} ms for {group} over {window.label()} (n={row['n']}); "
        f"{_engine_context(row)}likely {reason}: {_EVIDENCE[reason](row, config)}"
    )
    return Condition(
        labels=labels,
        value=ratio,
        threshold=config.ratio_threshold,
        summary=summary,
        severity=Severity.CRITICAL if breaches(ratio, config.critical_ratio) else None,
    )
