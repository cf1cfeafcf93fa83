"""clusters: which attribute combinations explain a window's bad requests, scored, with a fix.

A request is bad when it errored, its tpot_ms or e2e_ms is above the window's p99, one of its scores
is below `score_floor`, or (with `alert_groups_bad`) it belongs to the group of a firing alert.
Every value of every candidate dimension (and every pair of frequent values) is scored the way
MacroBase/DIFF and Honeycomb BubbleUp do: the risk ratio (how much more likely a request in the
group is to be bad than one outside it) and the support (the share of all bad requests the group
holds). A pair is kept only when it is more specific than both its halves (a higher risk ratio than
either); a single value is dropped when a kept pair over it explains the same bad requests.
`score` = support × (1 − 1/risk ratio): the share of the window's bad requests the group accounts
for beyond what chance would put there. Deterministic: no sampling, no model, ties by signature.

Alert labels (LABELS): none. It raises no alerts; its findings are the rows of its table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from itertools import combinations
from typing import Any

import polars as pl
from pydantic import Field

from detectors.base import Detection, DetectorConfig, Read, Window
from detectors.frames import ids_as_strings, request_key, scores
from storage.ports import FiringAlerts, Requests

KEY = "clusters"
SUMMARY = "Scored groups of bad requests (risk ratio x support), each with a summary and a suggested fix."
LABELS: tuple[str, ...] = ()
_MAX_RISK = 1000.0
_MIN_OUTSIDE = 20
REQUEST_COLUMNS = (
    "trace_id", "status_code", "tenant_id", "replica_id", "deployment", "model", "input_tokens",
    "tpot_ms", "e2e_ms", "cache_hit_ratio", "queue_depth", "replica_count", "quantization", "finish_reason",
    "prefill_tokens_in_batch", "kv_cache_usage", "preemptions",
)  # fmt: skip
DIMENSIONS = (
    "tenant_id", "replica_id", "model", "deployment", "quantization", "cache_bucket", "traffic_pattern",
    "saturation_bucket", "prompt_bucket", "batch_prefill", "kv_bucket", "preempted", "finish_reason", "status_code",
)  # fmt: skip
# Alert labels that name a request group, mapped to the dimension that holds it.
ALERT_LABELS = {
    "tenant_id": "tenant_id", "replica_id": "replica_id", "model": "model", "deployment": "deployment",
    "quantization": "quantization", "pattern": "traffic_pattern", "prompt_bucket": "prompt_bucket",
}  # fmt: skip
ALERT_BUCKETS = {"cache_curve": "cache_bucket", "saturation": "saturation_bucket"}

# The rule table behind `suggested_fix`, by dimension (and value where it matters). docs/detectors.md.
FIXES: dict[str, str] = {
    "replica_id": "drain and reload the replica; compare its weights, adapters and driver with the fleet's",
    "saturation_bucket": "the autoscaler lags: lower target_ongoing_requests or pre-warm replicas before bursts",
    "cache_bucket": "KV-cache pressure: raise gpu_memory_utilization or route long contexts to a dedicated deployment",
    "prompt_bucket": "route long contexts to a dedicated deployment with a larger KV cache",
    "batch_prefill": "long prefills stall decodes: enable chunked prefill or lower max_num_batched_tokens",
    "kv_bucket": "the KV cache runs full: raise gpu_memory_utilization, lower max_num_seqs, or add replicas",
    "preempted": "requests are preempted for KV space: lower max_num_seqs or max_num_batched_tokens, or add replicas",
    "tenant_id": "isolate the tenant or give it a priority lane",
    "quantization": "route structured outputs to the higher-precision variant",
    "traffic_pattern": "smooth bursts: rate-limit or queue at the gateway and pre-warm replicas",
    "model": "compare this model version with the previous one and roll back if it regressed",
    "deployment": "compare this deployment's engine flags and image with the others",
    "finish_reason": "responses stop early: check max_tokens and stop sequences",
    "status_code": "read these requests' status messages: they fail rather than degrade",
}
# For a pair, the fix of the more actionable dimension: the order operators act in.
FIX_ORDER = ("replica_id", "quantization", "saturation_bucket", "preempted", "kv_bucket", "cache_bucket",
             "prompt_bucket", "batch_prefill", "tenant_id", "traffic_pattern", "model", "deployment", "finish_reason",
             "status_code")  # fmt: skip


class Config(DetectorConfig):
    score_floor: float = Field(0.8, ge=0, le=1, description="A request with any score below this is bad.")
    min_support: float = Field(0.05, gt=0, le=1, description="A cluster must hold at least this share of bad requests.")
    max_share: float = Field(
        0.6, gt=0, le=1, description="A group holding more of the window's requests than this is not an explanation."
    )
    min_risk_ratio: float = Field(
        2.0, gt=1, description="A cluster's requests must be at least this much likelier bad."
    )
    min_size: int = Field(20, ge=1, description="Requests a cluster needs.")
    min_score: float = Field(0.10, ge=0, le=1, description="Clusters scoring below this are not reported.")
    max_clusters: int = Field(10, ge=1, description="Clusters kept per window, best first.")
    examples: int = Field(5, ge=1, le=50, description="Example trace ids stored per cluster.")
    alert_groups_bad: bool = Field(
        False,
        description="Requests in a firing alert's group count as bad (off by default: clusters then echo the alerts).",
    )
    extra_dimensions: tuple[str, ...] = Field(
        (), description="More llm_requests columns to split by (e.g. provider, operation)."
    )


def inputs(config: Config, window: Window) -> dict[str, Read]:
    return {
        # With each request's traffic pattern: the same pass labelled the window's traffic before
        # clustering runs (registry order). Text as categories: a window can be a day of requests.
        "requests": Requests(
            window, (*REQUEST_COLUMNS, *config.extra_dimensions), traffic_pattern=True, categorical=True
        ),
        "scores": scores(window),
        "alerts": FiringAlerts(),
    }


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    table, low = _with_dimensions(frames, config)
    dims = [*DIMENSIONS, *config.extra_dimensions]
    if table.height == 0 or table["bad"].sum() == 0:
        return Detection(figures=_empty(window))
    found = find_clusters(table, dims, config)
    alerts = [(str(r["detector"]), json.loads(r["labels"])) for r in frames["alerts"].iter_rows(named=True)]
    rows = [_row(c, table, rank, window, config, low=low, alerts=alerts) for rank, c in enumerate(found, 1)]
    return Detection(figures=pl.DataFrame(rows, schema=_SCHEMA) if rows else _empty(window))


def _with_dimensions(frames: dict[str, pl.DataFrame], config: Config) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every request with its dimensions, `bad` and `bad_reason` (a code); and each low-scored request's
    lowest-scoring name (`_request`, `low_score`)."""
    # trace_id is the one id fetched, for the examples a cluster quotes; requests and their scores
    # meet on the 64-bit request key.
    key = request_key(frames["requests"], frames["scores"])
    reqs = frames["requests"].with_columns(
        *ids_as_strings(frames["requests"]), pl.col("tpot_ms", "e2e_ms").cast(pl.Float64)
    )
    ratio = pl.col("cache_hit_ratio")
    saturation = pl.col("queue_depth") / pl.when(pl.col("replica_count") > 0).then(pl.col("replica_count"))
    prompt = pl.col("input_tokens")
    # Buckets as enums (a byte a request) and the reason a request is bad as a code: over a day of
    # requests, string columns for these were most of the clustering step's memory.
    reqs = reqs.with_columns(
        cache_bucket=pl.when(ratio > 0.85).then(_lit("high", CACHE)).when(ratio >= 0.55).then(_lit("medium", CACHE))
        .when(ratio.is_not_null()).then(_lit("low", CACHE)),
        saturation_bucket=pl.when(saturation < 2).then(_lit("idle", SATURATION))
        .when(saturation < 8).then(_lit("warm", SATURATION)).when(saturation < 16).then(_lit("saturating", SATURATION))
        .when(saturation.is_not_null()).then(_lit("scaling", SATURATION)),
        prompt_bucket=pl.when(prompt < 8192).then(_lit("0-8k", PROMPT))
        .when(prompt < 32768).then(_lit("8k-32k", PROMPT))
        .when(prompt < 65536).then(_lit("32k-64k", PROMPT))
        .when(prompt.is_not_null()).then(_lit("64k+", PROMPT)),
        # token_latency's prefill_burst line: a batch with more prefill than this stalls its decodes.
        batch_prefill=pl.when(pl.col("prefill_tokens_in_batch") > 4000).then(_lit("4k+", PREFILL))
        .when(pl.col("prefill_tokens_in_batch").is_not_null()).then(_lit("<=4k", PREFILL)),
        # Engine facts of the request's replica (joined engine metrics): token_latency's kv_pressure line.
        kv_bucket=pl.when(pl.col("kv_cache_usage") >= 0.95).then(_lit("95%+", KV))
        .when(pl.col("kv_cache_usage") >= 0.8).then(_lit("80-95%", KV))
        .when(pl.col("kv_cache_usage").is_not_null()).then(_lit("<80%", KV)),
        preempted=pl.when(pl.col("preemptions") > 0).then(_lit("yes", YES_NO))
        .when(pl.col("preemptions").is_not_null()).then(_lit("no", YES_NO)),
    )  # fmt: skip
    low = (
        frames["scores"]
        .filter(pl.col("score").cast(pl.Float64) < config.score_floor)
        .select(key, pl.col("name").cast(pl.String))
        .group_by("_request")
        .agg(pl.col("name").sort().first().alias("low_score"))
    )
    # Which requests scored low is a membership test; the score's name is looked up later, for the
    # bad requests of a reported cluster only: no column of ten million names.
    reqs = reqs.with_columns(key).with_columns(low_scored=pl.col("_request").is_in(low["_request"].implode()))
    errors = pl.col("status_code") == "ERROR"
    slow_decode = pl.col("tpot_ms") > pl.col("tpot_ms").quantile(0.99, "linear")
    slow = pl.col("e2e_ms") > pl.col("e2e_ms").quantile(0.99, "linear")
    in_alert = _alert_members(frames["alerts"], reqs, config.max_share) if config.alert_groups_bad else pl.lit(False)
    code = (
        pl.when(errors).then(_code(ERROR))
        .when(pl.col("low_scored")).then(_code(LOW_SCORE))
        .when(slow_decode.fill_null(False)).then(_code(SLOW_DECODE))
        .when(slow.fill_null(False)).then(_code(SLOW))
        .when(in_alert).then(_code(IN_ALERT))
    )  # fmt: skip
    return reqs.with_columns(bad_reason=code).with_columns(bad=pl.col("bad_reason").is_not_null()), low


# Why a request is bad, first match wins; `bad_reason` holds the index, the text is built for the
# few bad requests of a reported cluster only.
ERROR, LOW_SCORE, SLOW_DECODE, SLOW, IN_ALERT = range(5)
_REASONS = {
    ERROR: "error",
    SLOW_DECODE: "tpot above the window p99",
    SLOW: "latency above the window p99",
    IN_ALERT: "in a firing alert's group",
}
CACHE = pl.Enum(["high", "medium", "low"])
SATURATION = pl.Enum(["idle", "warm", "saturating", "scaling"])
PROMPT = pl.Enum(["0-8k", "8k-32k", "32k-64k", "64k+"])
PREFILL = pl.Enum(["<=4k", "4k+"])
KV = pl.Enum(["<80%", "80-95%", "95%+"])
YES_NO = pl.Enum(["no", "yes"])


def _equals(table: pl.DataFrame, dim: str, value: str) -> pl.Expr:
    # Text and categories compare with the value as they are; other dimensions (an extra numeric one)
    # as text, the way the signature spells them.
    dtype = table.schema[dim]
    if dtype == pl.String or isinstance(dtype, pl.Categorical | pl.Enum):
        return pl.col(dim) == value
    return pl.col(dim).cast(pl.String) == value


def _lit(value: str, dtype: pl.Enum) -> pl.Expr:
    return pl.lit(value, dtype=dtype)


def _code(reason: int) -> pl.Expr:
    return pl.lit(reason, dtype=pl.UInt8)


def _reason(bad: pl.DataFrame, config: Config) -> str:
    """The most common reason among bad requests (ties: the first in text order)."""
    texts = [
        f"{low} below {config.score_floor:g}" if code == LOW_SCORE else _REASONS[code]
        for code, low in bad.select("bad_reason", "low_score").iter_rows()
    ]
    return str(pl.Series(texts, dtype=pl.String).mode().sort().first())


def _alert_members(alerts: pl.DataFrame, reqs: pl.DataFrame, max_share: float) -> pl.Expr:
    """Requests in a firing alert's group. A group that is most of the window (a whole deployment) is
    left out: marking everything bad would leave nothing to contrast a cluster with."""
    member = pl.lit(False)
    for row in alerts.iter_rows(named=True):
        labels = json.loads(row["labels"])
        terms = [pl.col(ALERT_LABELS[k]) == v for k, v in labels.items() if k in ALERT_LABELS]
        if "bucket" in labels and row["detector"] in ALERT_BUCKETS:
            terms.append(pl.col(ALERT_BUCKETS[row["detector"]]) == labels["bucket"])
        if terms:
            group = terms[0]
            for t in terms[1:]:
                group = group & t
            group = group.fill_null(False)
            if reqs.height and reqs.select(group.mean()).item() <= max_share:
                member = member | group
    return member


def find_clusters(table: pl.DataFrame, dims: list[str], config: Config) -> list[dict[str, Any]]:
    """Minimal high-risk, high-support groups of bad requests, best first. `table` needs `bad` and `dims`."""
    n = table.height
    total_bad = int(table["bad"].sum())
    singles: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    every: dict[tuple[str, Any], dict[str, Any]] = {}  # every single value's stats: a pair's halves
    frequent: dict[str, list[Any]] = {}
    for dim in dims:
        groups = _counts(table.lazy().filter(pl.col(dim).is_not_null()), dim)
        for value, size, bad in groups.iter_rows():
            stats = _stats(int(size), int(bad), n, total_bad)
            every[(dim, value)] = stats
            if stats["support"] >= config.min_support:
                frequent.setdefault(dim, []).append(value)
                if _interesting(stats, config):
                    singles[((dim, str(value)),)] = stats
    pairs: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for d1, d2 in combinations([d for d in dims if d in frequent], 2):
        # Apriori: only pairs of frequent values can hold min_support of the bad requests.
        candidates = _counts(table.lazy(), d1, d2).filter(
            pl.col(d1).is_in(frequent[d1])
            & pl.col(d2).is_in(frequent[d2])
            & (pl.col("bad") >= config.min_support * total_bad)
        )
        for v1, v2, size, bad in candidates.iter_rows():
            stats = _stats(int(size), int(bad), n, total_bad)
            halves = (every[(d1, v1)], every[(d2, v2)])
            # Minimality: a pair must be more specific than both halves, or it says nothing new.
            if _interesting(stats, config) and all(stats["risk_ratio"] > 1.25 * h["risk_ratio"] for h in halves):
                pairs[((d1, str(v1)), (d2, str(v2)))] = stats
    for pair, stats in pairs.items():
        for half in pair:
            kept = singles.get((half,))
            if kept is not None and stats["bad"] >= 0.9 * kept["bad"]:
                del singles[(half,)]  # the pair explains the same bad requests more precisely
    found = [{"signature": dict(sig), **stats} for sig, stats in {**singles, **pairs}.items()]
    found = [c for c in found if c["score"] >= config.min_score]
    found.sort(key=lambda c: (-c["score"], json.dumps(c["signature"], sort_keys=True)))
    return found[: config.max_clusters]


def _counts(rows: pl.LazyFrame, *by: str) -> pl.DataFrame:
    """Requests and bad requests per group. Streamed: an eager group-by over a day of requests held
    a second copy of the grouped columns (1.4 GB for an enum by a category)."""
    return rows.group_by(*by).agg(pl.len().alias("size"), pl.col("bad").sum().alias("bad")).collect(engine="streaming")


def _stats(size: int, bad: int, n: int, total_bad: int) -> dict[str, Any]:
    outside, bad_outside = n - size, total_bad - bad
    rate_in = bad / size if size else 0.0
    rate_out = bad_outside / outside if outside else 0.0
    if outside < _MIN_OUTSIDE:
        # A value (nearly) every request has is no explanation: there is nothing to compare it with.
        risk = 0.0
    elif rate_out > 0:
        risk = min(rate_in / rate_out, _MAX_RISK)
    else:
        risk = _MAX_RISK if rate_in > 0 else 0.0  # never bad outside: capped so scores stay comparable
    support = bad / total_bad if total_bad else 0.0
    return {
        "size": size, "bad": bad, "n": n, "support": support, "risk_ratio": risk,
        "score": support * (1 - 1 / risk) if risk > 1 else 0.0,
    }  # fmt: skip


def _interesting(stats: dict[str, Any], config: Config) -> bool:
    return bool(
        stats["support"] >= config.min_support
        and stats["risk_ratio"] >= config.min_risk_ratio
        and config.min_size <= stats["size"] <= config.max_share * stats["n"]
    )


def suggested_fix(signature: Mapping[str, str]) -> str:
    """The rule-table fix for a cluster: the most actionable dimension in its signature decides."""
    for dim in FIX_ORDER:
        if dim in signature:
            return FIXES[dim]
    return "inspect the example traces: no rule covers this signature"


_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "cluster_id": pl.String, "detector": pl.String, "window_start": pl.Datetime("us"),
    "window_end": pl.Datetime("us"), "signature": pl.String, "size": pl.Int64, "support": pl.Float64,
    "risk_ratio": pl.Float64, "score": pl.Float64, "summary": pl.String, "suggested_fix": pl.String,
    "example_trace_ids": pl.List(pl.String), "rank": pl.Int32, "bad_reason": pl.String,
}  # fmt: skip


def _empty(window: Window) -> pl.DataFrame:
    return pl.DataFrame(schema=_SCHEMA)


def _row(
    cluster: dict[str, Any], table: pl.DataFrame, rank: int, window: Window, config: Config,
    *, low: pl.DataFrame, alerts: list[tuple[str, dict[str, str]]],
) -> dict[str, Any]:  # fmt: skip
    signature: dict[str, str] = cluster["signature"]
    member = pl.all_horizontal(_equals(table, dim, value) for dim, value in signature.items())
    # Only the bad members' few columns are taken out of the window's table, not a copy of the group.
    bad = (
        table.filter(member & pl.col("bad"))
        .select("trace_id", "_request", "bad_reason")
        .join(low, on="_request", how="left", maintain_order="left")
    )
    reason = _reason(bad, config) if bad.height else "no bad requests"
    examples = bad.sort("trace_id")["trace_id"].unique(maintain_order=True).head(config.examples).to_list()
    group = ", ".join(f"{k}={v}" for k, v in signature.items())
    summary = (
        f"{group}: {cluster['support']:.0%} of the window's bad requests, {cluster['risk_ratio']:.1f}x more likely "
        f"to be bad ({reason}), {cluster['size']:,} requests over {window.label()}"
    )
    signature_json = json.dumps(signature, sort_keys=True)
    return {
        "cluster_id": hashlib.sha256(f"{signature_json}@{window.start.isoformat()}".encode()).hexdigest()[:16],
        "detector": _detector_for(signature, alerts),
        "window_start": window.start,
        "window_end": window.end,
        "signature": signature_json,
        "size": cluster["size"],
        "support": cluster["support"],
        "risk_ratio": cluster["risk_ratio"],
        "score": cluster["score"],
        "summary": summary,
        "suggested_fix": suggested_fix(signature),
        "example_trace_ids": examples,
        "rank": rank,
        "bad_reason": reason,
    }


def _detector_for(signature: Mapping[str, str], alerts: list[tuple[str, dict[str, str]]]) -> str:
    """The firing detector whose alert names this group, so a cluster links to the alert it explains."""
    for detector, labels in alerts:
        named = {ALERT_LABELS[k]: v for k, v in labels.items() if k in ALERT_LABELS}
        if "bucket" in labels and detector in ALERT_BUCKETS:
            named[ALERT_BUCKETS[detector]] = labels["bucket"]
        if named and all(signature.get(k) == v for k, v in named.items()):
            return detector
    return KEY
