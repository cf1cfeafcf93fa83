"""clusters: which attribute combinations explain a window's bad requests, symptom by symptom, with a fix.

Each symptom is its own outcome over its own requests: `error` (every request), `tpot_tail` (tpot_ms above
the window's p99, among requests with a tpot), `latency_tail` (e2e_ms or ttft_ms above its p99), and one
`score:<name>` per score name (the request's lowest score of that name below its floor, among the
requests scored with it; a binary pass/fail score fails at 0). A request unscored for a name is no
evidence either way for that name, and an error is not a low score: the symptoms never dilute each other.

Every value of every candidate dimension, and every pair of values frequent on a symptom, is a
candidate for that symptom, scored as MacroBase/DIFF and Honeycomb BubbleUp do by its risk ratio. A
candidate is kept when the evidence holds up (detectors/evidence.py): the lower confidence bound of
its risk ratio is above 1 at `evidence_level`, corrected for every candidate tried in the window; with
`min_support` (its share of the symptom's bad requests), `min_size` and `max_share` as guards. A pair
is kept only when more specific than both its halves (a risk ratio 1.25x either's); a single value is
dropped when a kept pair over it, on the same symptom, holds 90 % of its bad requests. Clusters are
ranked by the bad requests they explain beyond chance. Deterministic: no sampling, no model, ties by
symptom and signature.

Every firing alert of replica_skew, tenant_fairness, quantization_delta, cache_curve, saturation or
context_length that names a group is explained: by a cluster on the alert's symptom whose signature
contains the group, or by a sentence saying that none passed the evidence test, with the numbers. The
sentence is stored on the alert (`alerts.explanation`). The cache, saturation and prompt-length bucket
dimensions are those detectors' buckets with the edges they are configured with (detectors/buckets.py,
`following`), so an alert's bucket label names the requests its detector put in that bucket.

Alert labels (LABELS): none. It raises no alerts; its findings are the rows of its table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Self, TypeVar

import polars as pl
from pydantic import Field, PrivateAttr, field_validator

from detectors import cache_curve, context_length, saturation
from detectors.base import Detection, DetectorConfig, Read, Window
from detectors.buckets import Buckets, per_replica_load
from detectors.evidence import Evidence, bar
from detectors.frames import ids_as_strings, request_key, scores
from storage.ports import FiringAlerts, Requests

KEY = "clusters"
SUMMARY = "Groups of requests riskier for a symptom than the rest, with the evidence, a summary and a fix."
LABELS: tuple[str, ...] = ()
REQUEST_COLUMNS = (
    "trace_id", "status_code", "tenant_id", "replica_id", "deployment", "model", "input_tokens",
    "tpot_ms", "e2e_ms", "ttft_ms", "cache_hit_ratio", "queue_depth", "replica_count", "quantization", "finish_reason",
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
# The dimensions that are another detector's buckets, by the value each buckets.
BUCKETED = {
    "cache_bucket": pl.col("cache_hit_ratio"), "saturation_bucket": per_replica_load(),
    "prompt_bucket": pl.col("input_tokens"),
}  # fmt: skip
# The detectors whose firing alerts on a group every pass explains or says why it cannot.
EXPLAINED = ("replica_skew", "tenant_fairness", "quantization_delta", "cache_curve", "saturation", "context_length")

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
    score_floor: float = Field(
        0.8, ge=0, le=1, description="A score below this is a failure of its name (a pass/fail score fails at 0)."
    )
    score_floors: dict[str, float] = Field(
        {}, description="Floors by score name, overriding score_floor, e.g. {groundedness: 0.6}."
    )
    evidence_level: float = Field(
        0.01,
        gt=0,
        lt=0.5,
        description="The chance a window without any cause reports a cluster: each candidate's exact-test p-value "
        "is held to this divided by the number of candidates tried.",
    )
    min_support: float = Field(
        0.05, gt=0, le=1, description="A cluster must hold at least this share of its symptom's bad requests."
    )
    max_share: float = Field(
        0.6, gt=0, le=1, description="A group holding more of the window's requests than this is not an explanation."
    )
    min_size: int = Field(20, ge=1, description="Requests a cluster needs.")
    max_clusters: int = Field(10, ge=1, description="Clusters kept per window, best first.")
    examples: int = Field(5, ge=1, le=50, description="Example trace ids stored per cluster.")
    extra_dimensions: tuple[str, ...] = Field(
        (), description="More llm_requests columns to split by (e.g. provider, operation)."
    )
    # Not a setting: the buckets of cache_curve, saturation and context_length as they are configured, which
    # the detection pass hands over (`following`), so an alert's `bucket=low` is matched against the requests
    # its detector put in its low bucket. Until then, those detectors' default edges.
    _buckets: dict[str, Buckets] = PrivateAttr(default_factory=lambda: detector_buckets({}))

    @field_validator("score_floors")
    @classmethod
    def _floors_in_range(cls, floors: dict[str, float]) -> dict[str, float]:
        for name, floor in floors.items():
            if not 0 <= floor <= 1:
                raise ValueError(f"the floor of score {name!r} is {floor}; a floor is between 0 and 1")
        return floors

    def floor(self, score: str) -> float:
        return self.score_floors.get(score, self.score_floor)

    def buckets(self) -> dict[str, Buckets]:
        """The bucket dimensions' rules, by dimension (see BUCKETED)."""
        return dict(self._buckets)

    def with_buckets(self, buckets: Mapping[str, Buckets]) -> Self:
        copy = self.model_copy()
        copy._buckets = {**self._buckets, **buckets}
        return copy


def detector_buckets(configs: Mapping[str, DetectorConfig]) -> dict[str, Buckets]:
    """The bucket dimensions' rules as `configs` set them; a detector missing from it has its defaults."""
    return {
        "cache_bucket": _configured(configs, cache_curve.KEY, cache_curve.Config).buckets(),
        "saturation_bucket": _configured(configs, saturation.KEY, saturation.Config).buckets(),
        "prompt_bucket": _configured(configs, context_length.KEY, context_length.Config).prompt_length(),
    }


def following(configs: Mapping[str, DetectorConfig]) -> dict[str, DetectorConfig]:
    """`configs`, with clusters' own splitting requests by the buckets the other detectors are configured with."""
    out = dict(configs)
    own = out.get(KEY)
    if isinstance(own, Config):
        out[KEY] = own.with_buckets(detector_buckets(configs))
    return out


_C = TypeVar("_C", bound=DetectorConfig)


def _configured(configs: Mapping[str, DetectorConfig], key: str, config: type[_C]) -> _C:
    found = configs.get(key)
    return found if isinstance(found, config) else config()


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


@dataclass(frozen=True)
class Symptom:
    """An outcome: `key` as the clusters table and alerts name it, `text` as a summary says it."""

    key: str
    text: str


@dataclass(frozen=True)
class Candidate:
    signature: tuple[tuple[str, str], ...]
    symptom: int  # index into the window's symptoms
    evidence: Evidence

    def signature_json(self) -> str:
        return json.dumps(dict(self.signature), sort_keys=True)


@dataclass(frozen=True)
class Found:
    """What find_clusters kept, best first, and the test every candidate was held to."""

    clusters: list[Candidate]
    tried: int
    bar: float  # the chance each candidate's evidence had to be under
    # Groups that passed but are not reported: the cluster holding the same bad requests.
    held: dict[Candidate, Candidate] = field(default_factory=dict)


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    table, symptoms = with_symptoms(frames, config)
    dims = [*DIMENSIONS, *config.extra_dimensions]
    found = find_clusters(table, dims, [s.key for s in symptoms], config)
    alerts = [
        (str(r["alert_id"]), str(r["detector"]), json.loads(r["labels"]))
        for r in frames["alerts"].iter_rows(named=True)
    ]
    rows = [
        _row(c, rank, table=table, window=window, config=config, symptoms=symptoms, found=found, alerts=alerts)
        for rank, c in enumerate(found.clusters, 1)
    ]
    explanations = _explanations(alerts, rows, table=table, symptoms=symptoms, found=found, config=config)
    figures = pl.DataFrame(rows, schema=_SCHEMA) if rows else _empty(window)
    return Detection(figures=figures, explanations=explanations)


def with_symptoms(frames: dict[str, pl.DataFrame], config: Config) -> tuple[pl.DataFrame, list[Symptom]]:
    """Every request with its dimensions and, for each symptom i, `_in{i}` (the request is one the symptom
    is measured on) and `_bad{i}` (it shows it)."""
    # trace_id is the one id fetched, for the examples a cluster quotes; requests and their scores
    # meet on the 64-bit request key.
    key = request_key(frames["requests"], frames["scores"])
    reqs = frames["requests"].with_columns(
        *ids_as_strings(frames["requests"]), pl.col("tpot_ms", "e2e_ms", "ttft_ms").cast(pl.Float64)
    )
    reqs = _with_dimensions(reqs, config.buckets()).with_columns(key)
    symptoms = [
        Symptom("error", "errored"),
        Symptom("tpot_tail", "had a tpot above the window p99"),
        Symptom("latency_tail", "had an e2e or TTFT above the window p99"),
    ]
    tpot, e2e, ttft = pl.col("tpot_ms"), pl.col("e2e_ms"), pl.col("ttft_ms")
    measures: list[tuple[pl.Expr, pl.Expr]] = [
        (pl.lit(True), pl.col("status_code") == "ERROR"),
        (tpot.is_not_null(), _above_p99(tpot)),
        (e2e.is_not_null() | ttft.is_not_null(), _above_p99(e2e) | _above_p99(ttft)),
    ]
    # Which requests were scored with each name, and which scored below its floor (their lowest score):
    # membership tests, not a join of the window to its scores, which copied a day of requests.
    # A request unscored for a name is outside that symptom, not a pass.
    lows = (
        frames["scores"]
        .select(key, pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64))
        .group_by("_request", "name")
        .agg(pl.col("score").min())
    )
    for name in sorted(lows["name"].unique().drop_nulls().to_list()):
        floor = config.floor(name)
        of_name = lows.filter(pl.col("name") == name)
        symptoms.append(Symptom(f"score:{name}", f"scored {name} below {floor:g}"))
        measures.append(
            (
                pl.col("_request").is_in(of_name["_request"].implode()),
                pl.col("_request").is_in(of_name.filter(pl.col("score") < floor)["_request"].implode()),
            )
        )
    reqs = reqs.with_columns(
        *(population.alias(f"_in{i}") for i, (population, _) in enumerate(measures)),
        *((population & bad).fill_null(False).alias(f"_bad{i}") for i, (population, bad) in enumerate(measures)),
    )
    return reqs, symptoms


def _above_p99(column: pl.Expr) -> pl.Expr:
    return (column > column.quantile(0.99, "linear")).fill_null(False)


def _with_dimensions(reqs: pl.DataFrame, buckets: Mapping[str, Buckets]) -> pl.DataFrame:
    # Buckets as enums, a byte a request: over a day of requests, string columns for these were most of
    # the clustering step's memory.
    return reqs.with_columns(
        *(rule.expr(BUCKETED[dim], rule.enum()).alias(dim) for dim, rule in buckets.items()),
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


def _member(table: pl.DataFrame, group: Mapping[str, str]) -> pl.Expr:
    return pl.all_horizontal(_equals(table, dim, value) for dim, value in group.items()).fill_null(False)


# A dimension that defines a symptom explains nothing about it: errors are the requests with status ERROR.
DEFINED_BY = {"error": "status_code"}


def find_clusters(table: pl.DataFrame, dims: list[str], symptom_keys: list[str], config: Config) -> Found:
    """Minimal groups whose risk of a symptom holds up against the rest of the window, best first.

    `table` needs `_in{i}` and `_bad{i}` for the i-th of `symptom_keys`, and `dims`."""
    symptoms = len(symptom_keys)
    totals = table.select(
        *(pl.col(f"_in{i}").sum().alias(f"in{i}") for i in range(symptoms)),
        *(pl.col(f"_bad{i}").sum().alias(f"bad{i}") for i in range(symptoms)),
    ).row(0, named=True)
    measured = [(int(totals[f"in{i}"] or 0), int(totals[f"bad{i}"] or 0)) for i in range(symptoms)]
    live = [i for i, (_, bad) in enumerate(measured) if bad > 0]
    tried: list[Candidate] = []
    every: dict[tuple[str, Any, int], Evidence] = {}  # every single value's evidence: a pair's halves
    frequent: dict[tuple[int, str], list[Any]] = {}
    for dim in dims:
        for row in _counts(table.lazy().filter(pl.col(dim).is_not_null()), live, dim).iter_rows(named=True):
            for i in live:
                if DEFINED_BY.get(symptom_keys[i]) == dim:
                    continue
                evidence = _evidence(row, i, measured[i])
                every[(dim, row[dim], i)] = evidence
                if evidence.size >= config.min_size:
                    tried.append(Candidate(((dim, str(row[dim])),), i, evidence))
                    if evidence.bad >= config.min_support * measured[i][1]:
                        frequent.setdefault((i, dim), []).append(row[dim])
    halves: dict[Candidate, tuple[Evidence, Evidence]] = {}
    pairs_tried = 0  # every pair of frequent values, scored or not
    for d1, d2 in combinations(dims, 2):
        # Apriori: only pairs of values frequent on a symptom can hold min_support of its bad requests.
        on = [i for i in live if (i, d1) in frequent and (i, d2) in frequent]
        if not on:
            continue
        rows = table.lazy().filter(pl.col(d1).is_not_null() & pl.col(d2).is_not_null())
        counts = _counts(rows, on, d1, d2)
        for i in on:
            pool = counts.filter(
                pl.col(d1).is_in(frequent[(i, d1)])
                & pl.col(d2).is_in(frequent[(i, d2)])
                & (pl.col(f"in{i}") >= config.min_size)
            )
            # Every pair of frequent values counts as tried, though only those holding min_support of the
            # bad requests are scored: choosing them by their bad requests is a look at the outcome.
            pairs_tried += pool.height
            for row in pool.filter(pl.col(f"bad{i}") >= config.min_support * measured[i][1]).iter_rows(named=True):
                pair = Candidate(((d1, str(row[d1])), (d2, str(row[d2]))), i, _evidence(row, i, measured[i]))
                tried.append(pair)
                halves[pair] = (every[(d1, row[d1], i)], every[(d2, row[d2], i)])
    candidates = sum(len(c.signature) == 1 for c in tried) + pairs_tried
    each = bar(config.evidence_level, candidates)
    kept = [c for c in tried if not guard_failures(c.evidence, measured[c.symptom], each, config)]
    # Minimality: a pair must be more specific than both halves, or it says nothing new.
    kept = [c for c in kept if c not in halves or all(c.evidence.risk_ratio > 1.25 * h.risk_ratio for h in halves[c])]
    pairs = [c for c in kept if len(c.signature) == 2]
    # A single value is dropped when a kept pair over it explains the same bad requests more precisely.
    kept = [
        c
        for c in kept
        if len(c.signature) == 2
        or not any(
            p.symptom == c.symptom and c.signature[0] in p.signature and p.evidence.bad >= 0.9 * c.evidence.bad
            for p in pairs
        )
    ]
    kept.sort(key=lambda c: (-c.evidence.excess, c.symptom, c.signature_json()))
    kept, held = _not_explained_by_another(kept[: 3 * config.max_clusters], table, measured, each, config)
    return Found(kept[: config.max_clusters], candidates, each, held)


def _not_explained_by_another(
    kept: list[Candidate], table: pl.DataFrame, measured: list[tuple[int, int]], each: float, config: Config
) -> tuple[list[Candidate], dict[Candidate, Candidate]]:
    """One cluster for one set of bad requests. A group holding smaller kept clusters of its symptom (90% of
    their requests inside it):
    - is the same requests as them when they cover 90% of it (the int4 variant and the two replicas that
      run it; a burst and the saturated requests it made): it stays, they go, as one cause;
    - else stays only if it still passes with their members taken out of the window (out of the group and
      out of the rest it is compared with): a deployment is not reported beside the one bad replica it runs.
    Returns what stays, in order, and for each group that went, the cluster that holds its requests."""
    masks = {c: table.select(_member(table, dict(c.signature))).to_series() for c in kept}
    sizes = {c: int(masks[c].sum()) for c in kept}

    def inside(small: Candidate, big: Candidate) -> bool:
        if small is big or small.symptom != big.symptom:
            return False
        if (sizes[small], small.signature_json()) >= (sizes[big], big.signature_json()):
            return False
        return int((masks[small] & masks[big]).sum()) >= 0.9 * sizes[small]

    gone: dict[Candidate, Candidate] = {}
    for c in kept:
        smaller = [other for other in kept if inside(other, c)]
        if not smaller:
            continue
        union = masks[smaller[0]]
        for other in smaller[1:]:
            union = union | masks[other]
        if int((union & masks[c]).sum()) >= 0.9 * sizes[c]:
            gone.update((other, c) for other in smaller if other not in gone)
            continue
        i = c.symptom
        population = table[f"_in{i}"] & ~union
        bad = table[f"_bad{i}"] & population
        n, total_bad = int(population.sum()), int(bad.sum())
        size, group_bad = int((masks[c] & population).sum()), int((masks[c] & bad).sum())
        alone = Evidence(size=size, bad=group_bad, outside=n - size, bad_outside=total_bad - group_bad)
        if guard_failures(alone, (n, total_bad), each, config):
            gone.setdefault(c, max(smaller, key=lambda o: (o.evidence.excess, o.signature_json())))
    return [c for c in kept if c not in gone], _holders(gone)


def _holders(gone: dict[Candidate, Candidate]) -> dict[Candidate, Candidate]:
    """Each group that went, with the one that stays and holds it (following a chain of holders)."""
    held = {}
    for c, first in gone.items():
        holder, seen = first, {c}
        while holder in gone and holder not in seen:
            seen.add(holder)
            holder = gone[holder]
        if holder not in gone:
            held[c] = holder
    return held


def _counts(rows: pl.LazyFrame, symptoms: list[int], *by: str) -> pl.DataFrame:
    """Requests measured and bad on each of `symptoms`, per group. Streamed: an eager group-by over a day
    of requests held a second copy of the grouped columns (1.4 GB for an enum by a category)."""
    return (
        rows.group_by(*by)
        .agg(
            *(pl.col(f"_in{i}").sum().alias(f"in{i}") for i in symptoms),
            *(pl.col(f"_bad{i}").sum().alias(f"bad{i}") for i in symptoms),
        )
        .collect(engine="streaming")
    )


def _evidence(row: Mapping[str, Any], i: int, measured: tuple[int, int]) -> Evidence:
    size, bad = int(row[f"in{i}"]), int(row[f"bad{i}"])
    return Evidence(size=size, bad=bad, outside=measured[0] - size, bad_outside=measured[1] - bad)


def guard_failures(evidence: Evidence, measured: tuple[int, int], each: float, config: Config) -> list[str]:
    """Why a group is not a cluster on a symptom measured on `measured` = (requests, bad); empty when it is."""
    n, total_bad = measured
    failures = []
    if evidence.bad < config.min_support * total_bad:
        failures.append(
            f"it holds {evidence.bad / total_bad:.0%} of the bad requests (min_support {config.min_support:g})"
        )
    if evidence.size < config.min_size:
        failures.append(f"{evidence.size} requests (min_size {config.min_size})")
    if evidence.size > config.max_share * n:
        failures.append(f"{evidence.size / n:.0%} of the requests (max_share {config.max_share:g})")
    if evidence.p_value > each:
        failures.append(f"chance alone would do it with p = {evidence.p_value:.2g}, above the bar of {each:.2g}")
    return failures


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
    "example_trace_ids": pl.List(pl.String), "rank": pl.Int32, "bad_reason": pl.String, "symptom": pl.String,
    "p_value": pl.Float64, "excess": pl.Float64, "candidates": pl.Int64,
}  # fmt: skip


def _empty(window: Window) -> pl.DataFrame:
    return pl.DataFrame(schema=_SCHEMA)


Alerts = list[tuple[str, str, dict[str, str]]]  # (alert_id, detector, labels) of the firing alerts


def _row(
    cluster: Candidate, rank: int, *, table: pl.DataFrame, window: Window, config: Config, symptoms: list[Symptom],
    found: Found, alerts: Alerts,
) -> dict[str, Any]:  # fmt: skip
    signature = dict(cluster.signature)
    symptom, evidence, i = symptoms[cluster.symptom], cluster.evidence, cluster.symptom
    # Only the bad members' ids are taken out of the window's table, not a copy of the group.
    bad = table.filter(_member(table, signature) & pl.col(f"_bad{i}")).select("trace_id")
    examples = bad.sort("trace_id")["trace_id"].unique(maintain_order=True).head(config.examples).to_list()
    total_bad = evidence.bad + evidence.bad_outside
    group = ", ".join(f"{k}={v}" for k, v in signature.items())
    summary = (
        f"{group}: {evidence.bad:,} of its {evidence.size:,} requests {symptom.text} ({evidence.rate_in:.1%}, "
        f"against {evidence.rate_out:.1%} for the rest), {evidence.risk_ratio:.1f}x as likely (p = "
        f"{evidence.p_value:.1g}, bar {found.bar:.1g} over {found.tried} candidates); {evidence.excess:,.0f} of the "
        f"window's {total_bad:,} beyond chance, over {window.label()}"
    )
    signature_json = cluster.signature_json()
    return {
        "cluster_id": hashlib.sha256(f"{signature_json}/{symptom.key}@{window.start.isoformat()}".encode()).hexdigest()[
            :16
        ],
        "detector": _detector_for(signature, symptom.key, alerts),
        "window_start": window.start,
        "window_end": window.end,
        "signature": signature_json,
        "size": evidence.size,
        "support": evidence.bad / total_bad,
        "risk_ratio": evidence.risk_ratio,
        "score": evidence.excess / total_bad,
        "summary": summary,
        "suggested_fix": suggested_fix(signature),
        "example_trace_ids": examples,
        "rank": rank,
        "bad_reason": symptom.text,
        "symptom": symptom.key,
        "p_value": evidence.p_value,
        "excess": evidence.excess,
        "candidates": found.tried,
    }


def _share(table: pl.DataFrame, dim: str, value: str) -> float:
    return float(table.select(_equals(table, dim, value).fill_null(False).mean()).item() or 0.0)


def alert_group(detector: str, labels: Mapping[str, str]) -> dict[str, str]:
    """The request group a firing alert names, as cluster dimensions; empty when it names none."""
    group = {ALERT_LABELS[k]: v for k, v in labels.items() if k in ALERT_LABELS}
    if "bucket" in labels and detector in ALERT_BUCKETS:
        group[ALERT_BUCKETS[detector]] = labels["bucket"]
    return group


def alert_symptom(labels: Mapping[str, str]) -> str | None:
    """The symptom an alert compared: its `signal` label, a score name or latency_p99."""
    signal = labels.get("signal")
    if signal is None:
        return None
    return "latency_tail" if signal == "latency_p99" else f"score:{signal}"


def _detector_for(signature: Mapping[str, str], symptom: str, alerts: Alerts) -> str:
    """The firing detector whose alert names this group on this symptom, so a cluster links to the alert
    it explains."""
    for _, detector, labels in alerts:
        group = alert_group(detector, labels)
        if group and alert_symptom(labels) == symptom and all(signature.get(k) == v for k, v in group.items()):
            return detector
    return KEY


def _explanations(
    alerts: Alerts, rows: list[dict[str, Any]], *, table: pl.DataFrame, symptoms: list[Symptom], found: Found,
    config: Config,
) -> dict[str, str]:  # fmt: skip
    """For every firing alert that names a group: the cluster that explains it, or why none passed."""
    index = {s.key: i for i, s in enumerate(symptoms)}
    explanations = {}
    for alert_id, detector, labels in alerts:
        group, symptom = alert_group(detector, labels), alert_symptom(labels)
        if detector not in EXPLAINED or not group or symptom is None:
            continue
        named = ", ".join(f"{k}={v}" for k, v in group.items())
        # A label most of the window shares (the one model a quantization alert names) singles out nothing:
        # no cluster can hold it, so the group is matched on the labels that do.
        group = {k: v for k, v in group.items() if k not in table.columns or _share(table, k, v) <= config.max_share}
        if not group:
            explanations[alert_id] = (
                f"no cluster: {named} is most of the window's requests, nothing to contrast it with"
            )
            continue
        match = next(
            (
                r
                for r in rows
                if r["symptom"] == symptom and all(json.loads(r["signature"]).get(k) == v for k, v in group.items())
            ),
            None,
        )
        if match is not None:
            explanations[alert_id] = f"explained by cluster {match['cluster_id']} on {symptom}: {match['summary']}"
            continue
        if symptom not in index:
            explanations[alert_id] = f"no cluster: no request of the window measures {symptom}"
            continue
        i = index[symptom]
        held = next(
            (
                (c, holder)
                for c, holder in found.held.items()
                if c.symptom == i and all(dict(c.signature).get(k) == v for k, v in group.items())
            ),
            None,
        )
        row = held and next(
            (r for r in rows if r["signature"] == held[1].signature_json() and r["symptom"] == symptom), None
        )
        if held is not None and row is not None:
            explanations[alert_id] = (
                f"explained by cluster {row['cluster_id']} on {symptom}, which holds the same bad requests "
                f"({named} passed the evidence test too, p = {held[0].evidence.p_value:.2g}): {row['summary']}"
            )
            continue
        member = _member(table, group)
        counts = table.select(
            pl.col(f"_in{i}").sum().alias("n"),
            pl.col(f"_bad{i}").sum().alias("bad"),
            (pl.col(f"_in{i}") & member).sum().alias("size"),
            (pl.col(f"_bad{i}") & member).sum().alias("group_bad"),
        ).row(0, named=True)
        n, total_bad, size, bad = (int(counts[k] or 0) for k in ("n", "bad", "size", "group_bad"))
        evidence = Evidence(size=size, bad=bad, outside=n - size, bad_outside=total_bad - bad)
        failures = guard_failures(evidence, (n, total_bad), found.bar, config) if total_bad else ["no request was bad"]
        if not failures:
            failures = ["a more specific or stronger cluster ranked above it (max_clusters)"]
        explanations[alert_id] = (
            f"no cluster passed the evidence test on {symptom}: {named} has {bad:,} of {size:,} requests "
            f"{symptoms[i].text} ({evidence.rate_in:.1%}) against {evidence.rate_out:.1%} for the rest, risk "
            f"ratio {evidence.risk_ratio:.2f}, p = {evidence.p_value:.2g} (bar {found.bar:.2g} over {found.tried} "
            "candidates); " + "; ".join(failures)
        )
    return explanations
