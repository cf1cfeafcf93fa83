"""clusters: which attribute combinations explain a window's bad requests, symptom by symptom, with a fix.

Each symptom is its own outcome over its own requests: `error` (every request), `tpot_tail` (tpot_ms above
the window's p99, among requests with a tpot), `latency_tail` (e2e_ms or ttft_ms above its p99), and one
`score:<name>` per score name (the request's lowest score of that name below its floor, among the
requests scored with it; a binary pass/fail score fails at 0). A request unscored for a name is no
evidence either way for that name, and an error is not a low score: the symptoms never dilute each other.

Two kinds of question, each held to a bar of its own (detectors/evidence.py) so that each keeps its
error rate:
- Exploratory. Every value of every candidate dimension, and every pair of values frequent on a symptom,
  is a candidate for that symptom, scored as MacroBase/DIFF and Honeycomb BubbleUp do by its risk ratio.
  A candidate passes when Fisher's exact test (one-sided) puts the chance of so many bad requests in a
  random group its size at most `evidence_level` / the candidates tried in the window (Bonferroni), with
  `min_support` (its share of the symptom's bad requests), `min_size` and `max_share` as guards. A pair
  is kept only when more specific than both its halves (a risk ratio 1.25x either's); a single value is
  dropped when a kept pair over it, on the same symptom, holds 90 % of its bad requests.
- Alert-directed. A firing alert of EXPLAINED that names a group is a hypothesis chosen before clustering
  looked at the requests: its group is tested on the alert's own symptom over the alert's episode (this
  window and the ones before it since the alert started firing, at most `episode_seconds`), held to
  Holm's bar over the pass's alert hypotheses only, with the same guards. A group that passes is a
  cluster like the others.

One cause, one row. Within a symptom, a group holding smaller clusters that make up 90 % of it is reported
for them, and a group that passes only through a smaller one inside it is not reported. Across dimensions
and symptoms, a cluster whose bad requests are mostly (SAME_REQUESTS) bad requests of a cluster ranked
above it is that cluster's requests seen another way: the first leads, the others are listed in its
`same_requests`, and its summary names every symptom it shows. Rows are ranked by the bad requests they
explain beyond chance in the window. Deterministic: no sampling, no model, ties by symptom and signature.

Every firing alert of EXPLAINED that names a group gets an `explanation` (`alerts.explanation`) that is
true: the cluster that explains it; or that its group passed (p, bar) and why it is not listed (below
`max_clusters`, or the same requests as another cluster); or that it did not pass, with the counts, p, bar
and the guards it failed. The cache, saturation and prompt-length bucket dimensions are those detectors'
buckets with the edges they are configured with (detectors/buckets.py, `following`), so an alert's bucket
label names the requests its detector put in that bucket.

Each summary leads with the plain fact (`replica vllm-r3 fails json_adherence 14 % of the time against
7.1 % on the rest since 12:05 UTC`), the statistics after; a chance too small for a double is written
`< 1e-300`.

Alert labels (LABELS): none. It raises no alerts; its findings are the rows of its table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import combinations
from typing import Any, Self, TypeVar

import polars as pl
from pydantic import Field, PrivateAttr, field_validator

from detectors import cache_curve, context_length, saturation
from detectors.base import Detection, DetectorConfig, Read, Window
from detectors.buckets import Buckets, per_replica_load
from detectors.evidence import MAX_RISK, Evidence, bar, holm, p_written, written
from detectors.frames import IDS, ids_as_strings, request_key, scores
from storage.ports import Episode, FiringAlerts, Requests, Scores

KEY = "clusters"
SUMMARY = "Groups of requests riskier for a symptom than the rest, with the evidence, a summary and a fix."
LABELS: tuple[str, ...] = ()
REQUEST_COLUMNS = (
    "trace_id", "status_code", "tenant_id", "replica_id", "deployment", "model", "input_tokens",
    "tpot_ms", "e2e_ms", "ttft_ms", "cache_hit_ratio", "queue_depth", "replica_count", "quantization", "finish_reason",
    "prefill_tokens_in_batch", "kv_cache_usage", "preemptions",
)  # fmt: skip
# What an alert's episode is read with: the groups alerts name (their bucket values included) and the symptoms
# they compare, with each request's end time to place it in the episode.
EPISODE_COLUMNS = (
    "end_time", "tenant_id", "replica_id", "deployment", "model", "quantization", "input_tokens", "cache_hit_ratio",
    "queue_depth", "replica_count", "e2e_ms", "ttft_ms",
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
# The detectors whose firing alerts on a group every pass tests and explains.
EXPLAINED = ("replica_skew", "tenant_fairness", "quantization_delta", "cache_curve", "saturation", "context_length")
# A cluster whose bad requests are at least this share bad requests of a cluster ranked above it is that
# cluster's cause seen through another dimension or symptom (KV eviction as preempted=yes on latency and
# cache_bucket=low on two scores). Causes apart share few: a drifting replica's failed answers are not a
# noisy neighbour's slow ones.
SAME_REQUESTS = 0.8
# How an explanation names the cluster that explains an alert: incidents read the cluster's id back from it.
EXPLAINED_BY = "explained by cluster"
# How the plain fact names a group by the dimensions people call things by; other dimensions are `key=value`.
NOUNS = {"replica_id": "replica", "tenant_id": "tenant", "model": "model", "deployment": "deployment",
         "quantization": "quantization"}  # fmt: skip

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
        "is held to this divided by the number of candidates tried. Firing alerts' groups are a family of their "
        "own, held to it by Holm's procedure over the pass's alert hypotheses.",
    )
    episode_seconds: int = Field(
        3600,
        ge=0,
        description="How far back a firing alert's group is tested: the windows since the alert started firing, "
        "at most this long before the evaluated window (0: the window alone).",
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
    # An alert's episode begins where the clusters window of the pass that fired it began.
    lead = timedelta(seconds=config.settle_seconds + config.window_seconds)
    longest = timedelta(seconds=config.episode_seconds)
    return {
        # With each request's traffic pattern: the same pass labelled the window's traffic before
        # clustering runs (registry order). Text as categories: a window can be a day of requests.
        "requests": Requests(
            window, (*REQUEST_COLUMNS, *config.extra_dimensions), traffic_pattern=True, categorical=True
        ),
        "scores": scores(window),
        "alerts": FiringAlerts(),
        # Read only while an alert of EXPLAINED fires: its group is tested over the windows since it began.
        "episode_requests": Episode(Requests(window, EPISODE_COLUMNS, categorical=True), EXPLAINED, lead, longest),
        "episode_scores": Episode(Scores(window), EXPLAINED, lead, longest),
    }


@dataclass(frozen=True)
class Symptom:
    """An outcome: `key` as the clusters table and alerts name it, `text` as `bad_reason` says it, and what a
    group showing it does (`does` for one group, `do` for requests)."""

    key: str
    text: str
    does: str
    do: str


@dataclass(frozen=True)
class Directed:
    """An alert's group tested on the alert's symptom before clustering: over its episode, against Holm's bar
    over the pass's `hypotheses`."""

    evidence: Evidence
    since: datetime
    bar: float
    hypotheses: int


@dataclass(frozen=True)
class Candidate:
    signature: tuple[tuple[str, str], ...]
    symptom: int  # index into the window's symptoms
    evidence: Evidence  # in the window: what clusters are ranked by, and what an exploratory one passed on
    directed: Directed | None = None  # the test an alert's group passed on, for a cluster only it found

    def signature_json(self) -> str:
        return json.dumps(dict(self.signature), sort_keys=True)

    def tested(self) -> Evidence:
        """The evidence it passed on."""
        return self.directed.evidence if self.directed is not None else self.evidence


@dataclass(frozen=True)
class Found:
    """What find_clusters kept, best first, and the test every exploratory candidate was held to."""

    clusters: list[Candidate]
    tried: int
    bar: float  # the chance each exploratory candidate's evidence had to be under
    # Groups that passed but are not reported: the cluster holding the same bad requests.
    held: dict[Candidate, Candidate] = field(default_factory=dict)
    # Every group that passed, reported or not (listed, held, or below max_clusters).
    passed: list[Candidate] = field(default_factory=list)
    # For each reported cluster, the passed clusters that are its bad requests seen another way, best first.
    same: dict[Candidate, list[Candidate]] = field(default_factory=dict)


@dataclass(frozen=True)
class FiringAlert:
    alert_id: str
    detector: str
    labels: dict[str, str]
    started_at: datetime | None  # None where the frame does not say (a hand-built one)


@dataclass(frozen=True)
class Hypothesis:
    """A firing alert's group on its symptom, and how it fared."""

    group: tuple[tuple[str, str], ...]  # as cluster dimensions, without the labels most requests share
    symptom: int
    test: Directed
    failures: list[str]  # the guards it failed; empty when it passed

    def candidate(self, window: Evidence) -> Candidate:
        return Candidate(self.group, self.symptom, window, self.test)


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    table, symptoms = with_symptoms(frames, config)
    dims = [*DIMENSIONS, *config.extra_dimensions]
    alerts = firing_alerts(frames["alerts"])
    tests = alert_hypotheses(alerts, frames, table, symptoms=symptoms, config=config, window=window)
    directed = [
        h.candidate(_window_evidence(table, dict(h.group), h.symptom))
        for h in tests.hypotheses.values()
        if not h.failures
    ]
    found = find_clusters(table, dims, [s.key for s in symptoms], config, directed=directed)
    rows = [
        _row(c, rank, table=table, window=window, config=config, symptoms=symptoms, found=found, alerts=alerts)
        for rank, c in enumerate(found.clusters, 1)
    ]
    explanations = _explanations(alerts, tests, rows, symptoms=symptoms, found=found, config=config)
    figures = pl.DataFrame(rows, schema=_SCHEMA) if rows else _empty(window)
    return Detection(figures=figures, explanations=explanations)


def firing_alerts(frame: pl.DataFrame) -> list[FiringAlert]:
    started = frame["started_at"] if "started_at" in frame.columns else pl.Series([None] * frame.height)
    return [
        FiringAlert(str(r["alert_id"]), str(r["detector"]), json.loads(r["labels"]), at)
        for r, at in zip(frame.iter_rows(named=True), started, strict=True)
    ]


def _measures(
    scores_frame: pl.DataFrame, key: pl.Expr, config: Config, names: Sequence[str] | None = None
) -> list[tuple[str, pl.Expr, pl.Expr, bool]]:
    """For each score name (those in `names`, else every one scored): its name, which requests were scored
    with it and which scored below its floor (their lowest score), and whether it is pass/fail (every score
    of it 0 or 1). Membership tests, not a join of the requests to their scores, which copied a day of them."""
    lows = (
        scores_frame.select(key, pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64))
        .group_by("_request", "name")
        .agg(pl.col("score").min())
    )
    present = sorted(lows["name"].unique().drop_nulls().to_list())
    out = []
    for name in present if names is None else [n for n in names if n in present]:
        floor = config.floor(name)
        of_name = lows.filter(pl.col("name") == name)
        binary = bool(of_name["score"].is_in([0.0, 1.0]).all())
        out.append(
            (
                name,
                pl.col("_request").is_in(of_name["_request"].implode()),
                pl.col("_request").is_in(of_name.filter(pl.col("score") < floor)["_request"].implode()),
                binary,
            )
        )
    return out


def _score_symptom(name: str, floor: float, binary: bool) -> Symptom:
    if binary:
        return Symptom(f"score:{name}", f"scored {name} below {floor:g}", f"fails {name}", f"fail {name}")
    below = f"{name} below {floor:g}"
    return Symptom(f"score:{name}", f"scored {below}", f"scores {below}", f"score {below}")


TAIL = "above the window's p99"


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
        Symptom("error", "errored", "errors", "error"),
        Symptom("tpot_tail", "had a tpot above the window p99", f"has a tpot {TAIL}", f"have a tpot {TAIL}"),
        Symptom(
            "latency_tail",
            "had an e2e or TTFT above the window p99",
            f"has an e2e or TTFT {TAIL}",
            f"have an e2e or TTFT {TAIL}",
        ),
    ]
    tpot = pl.col("tpot_ms")
    measures: list[tuple[pl.Expr, pl.Expr]] = [
        (pl.lit(True), pl.col("status_code") == "ERROR"),
        (tpot.is_not_null(), _above_p99(tpot)),
        _latency(),
    ]
    # A request unscored for a name is outside that symptom, not a pass.
    for name, scored, low, binary in _measures(frames["scores"], key, config):
        symptoms.append(_score_symptom(name, config.floor(name), binary))
        measures.append((scored, low))
    reqs = reqs.with_columns(
        *(population.alias(f"_in{i}") for i, (population, _) in enumerate(measures)),
        *((population & bad).fill_null(False).alias(f"_bad{i}") for i, (population, bad) in enumerate(measures)),
    )
    return reqs, symptoms


def _latency(over: str | None = None) -> tuple[pl.Expr, pl.Expr]:
    """latency_tail's requests (an e2e or a TTFT) and its bad ones, against the p99 of each `over` group."""
    e2e, ttft = pl.col("e2e_ms"), pl.col("ttft_ms")
    return e2e.is_not_null() | ttft.is_not_null(), _above_p99(e2e, over) | _above_p99(ttft, over)


def _above_p99(column: pl.Expr, over: str | None = None) -> pl.Expr:
    p99 = column.quantile(0.99, "linear")
    return (column > (p99 if over is None else p99.over(over))).fill_null(False)


HypothesisKey = tuple[tuple[tuple[str, str], ...], int]  # (group, symptom index)


@dataclass(frozen=True)
class AlertTests:
    """Each firing alert that names a group: the hypothesis it is (by key), or why it is none (the sentence
    its explanation is); and every hypothesis of the pass, tested."""

    of_alert: dict[str, HypothesisKey | str]
    hypotheses: dict[HypothesisKey, Hypothesis]


def alert_hypotheses(
    alerts: list[FiringAlert], frames: Mapping[str, pl.DataFrame], table: pl.DataFrame, *, symptoms: list[Symptom],
    config: Config, window: Window,
) -> AlertTests:  # fmt: skip
    """Test the group each firing alert of EXPLAINED names, on its symptom, over its episode: Holm's bar
    over the pass's hypotheses (two alerts on one group and symptom are one hypothesis, over the longer
    episode)."""
    index = {s.key: i for i, s in enumerate(symptoms)}
    of_alert: dict[str, HypothesisKey | str] = {}
    since: dict[HypothesisKey, datetime] = {}
    for alert in alerts:
        group, symptom = alert_group(alert.detector, alert.labels), alert_symptom(alert.labels)
        if alert.detector not in EXPLAINED or not group or symptom is None:
            continue
        named = _named(group)
        # A label most of the window shares (the one model a quantization alert names) singles out nothing:
        # no cluster can hold it, so the group is tested on the labels that do.
        group = {k: v for k, v in group.items() if k not in table.columns or _share(table, k, v) <= config.max_share}
        if not group:
            of_alert[alert.alert_id] = f"no cluster: {named} is most of the window's requests, nothing to compare with"
        elif symptom not in index:
            of_alert[alert.alert_id] = f"no cluster: no request of the window measures {symptom}"
        else:
            key = (tuple(sorted(group.items())), index[symptom])
            of_alert[alert.alert_id] = key
            start = _episode_start(alert.started_at, config, window)
            since[key] = min(since.get(key, start), start)
    episode = _episode(frames, config, window, symptoms, {i for _, i in since})
    tested = {key: _directed_evidence(table, episode, dict(key[0]), key[1], since[key]) for key in since}
    bars = holm({key: evidence.p_value for key, (evidence, _) in tested.items()}, config.evidence_level)
    hypotheses = {}
    for key, (evidence, measured) in tested.items():
        covered = since[key] if episode is not None else window.start
        test = Directed(evidence, covered, bars[key], len(tested))
        failures = guard_failures(evidence, measured, bars[key], config) if measured[1] else ["no request was bad"]
        hypotheses[key] = Hypothesis(key[0], key[1], test, failures)
    return AlertTests(of_alert, hypotheses)


def _episode_start(started_at: datetime | None, config: Config, window: Window) -> datetime:
    """Where an alert's episode begins: the clusters window of the pass that fired it, at most
    `episode_seconds` before this window (storage.ports.Episode reads from the oldest of these)."""
    if started_at is None:
        return window.start
    lead = timedelta(seconds=config.settle_seconds + config.window_seconds)
    return min(window.start, max(started_at - lead, window.start - timedelta(seconds=config.episode_seconds)))


def _episode(
    frames: Mapping[str, pl.DataFrame], config: Config, window: Window, symptoms: list[Symptom], needed: set[int]
) -> pl.DataFrame | None:
    """The requests of the episodes before the window, with the alerts' groups and, for each symptom i in
    `needed`, `_in{i}` and `_bad{i}`: latency_tail against each earlier window's own p99; None when there are
    none (no alert has an episode yet, or it was too large to read)."""
    reqs = frames.get("episode_requests")
    if reqs is None or reqs.height == 0 or not needed:
        return None
    scored = frames.get("episode_scores")
    if scored is None:  # a hand-built episode without scores: keyed as its requests are
        ids = {"request_key": pl.UInt64} if "request_key" in reqs.columns else dict.fromkeys(IDS, pl.String)
        scored = pl.DataFrame(schema={**ids, "name": pl.String, "score": pl.Float64})
    key = request_key(reqs, scored)
    length_us = int((window.end - window.start).total_seconds() * 1_000_000)
    earlier = reqs.with_columns(
        key,
        pl.col("e2e_ms", "ttft_ms").cast(pl.Float64),
        _slot=(pl.lit(window.start) - pl.col("end_time")).dt.total_microseconds() // max(length_us, 1),
    )
    earlier = earlier.with_columns(
        *(rule.expr(BUCKETED[dim], rule.enum()).alias(dim) for dim, rule in config.buckets().items())
    )
    names = [symptoms[i].key.removeprefix("score:") for i in needed if symptoms[i].key.startswith("score:")]
    score_measures = {f"score:{n}": (scored_, low) for n, scored_, low, _ in _measures(scored, key, config, names)}
    columns = []
    for i in sorted(needed):
        if symptoms[i].key == "latency_tail":
            population, bad = _latency("_slot")
        else:
            population, bad = score_measures.get(symptoms[i].key, (pl.lit(False), pl.lit(False)))
        columns += [population.alias(f"_in{i}"), (population & bad).fill_null(False).alias(f"_bad{i}")]
    return earlier.with_columns(columns)


def _tally(frame: pl.DataFrame, group: Mapping[str, str], i: int) -> tuple[int, int, int, int]:
    """Requests measured on symptom i and bad, in all of `frame` and in the group."""
    member = _member(frame, group)
    row = frame.select(
        pl.col(f"_in{i}").sum(),
        pl.col(f"_bad{i}").sum(),
        (pl.col(f"_in{i}") & member).sum().alias("size"),
        (pl.col(f"_bad{i}") & member).sum().alias("group_bad"),
    ).row(0)
    n, bad, size, group_bad = (int(v or 0) for v in row)
    return n, bad, size, group_bad


def _window_evidence(table: pl.DataFrame, group: Mapping[str, str], i: int) -> Evidence:
    n, bad, size, group_bad = _tally(table, group, i)
    return Evidence(size=size, bad=group_bad, outside=n - size, bad_outside=bad - group_bad)


def _directed_evidence(
    table: pl.DataFrame, episode: pl.DataFrame | None, group: Mapping[str, str], i: int, since: datetime
) -> tuple[Evidence, tuple[int, int]]:
    """The group's evidence on symptom i over the window and its episode's requests from `since`, and the
    requests and bad ones measured there."""
    n, bad, size, group_bad = _tally(table, group, i)
    if episode is not None and all(dim in episode.columns for dim in group):
        more = _tally(episode.filter(pl.col("end_time") >= since), group, i)
        n, bad, size, group_bad = n + more[0], bad + more[1], size + more[2], group_bad + more[3]
    return Evidence(size=size, bad=group_bad, outside=n - size, bad_outside=bad - group_bad), (n, bad)


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


def _rank(c: Candidate) -> tuple[float, int, str]:
    return -c.evidence.excess, c.symptom, c.signature_json()


def find_clusters(
    table: pl.DataFrame, dims: list[str], symptom_keys: list[str], config: Config, *, directed: Sequence[Candidate] = ()
) -> Found:
    """Minimal groups whose risk of a symptom holds up against the rest of the window, one per cause, best
    first; with `directed`, the alerts' groups that passed their own test, reported like the others.

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
    kept.sort(key=_rank)
    # An alert's group that passed its own test takes the place of the same group found by the search (the
    # same requests in the window, so the same rank), with the evidence of the alert's episode; the others
    # join the ranking.
    twins = {(d.signature_json(), d.symptom): d for d in directed}
    kept = [twins.pop((c.signature_json(), c.symptom), c) for c in kept]
    extra = list(twins.values())
    reported, held = _not_explained_by_another(kept[: 3 * config.max_clusters], table, measured, each, config)
    leaders, same = _one_row_per_cause(sorted(reported + extra, key=_rank), table)
    held = _holders({**held, **{view: leader for leader, views in same.items() for view in views}})
    listed = leaders[: config.max_clusters]
    return Found(listed, candidates, each, held, kept + extra, {c: same[c] for c in listed})


def _not_explained_by_another(
    kept: list[Candidate], table: pl.DataFrame, measured: list[tuple[int, int]], each: float, config: Config
) -> tuple[list[Candidate], dict[Candidate, Candidate]]:
    """One cluster for one set of bad requests. A group holding smaller kept clusters of its symptom (90% of
    their requests inside it):
    - is one of them under another name when it is at most a tenth bigger: it stays, that one goes, and
      counts for neither rule below;
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
        inner = [other for other in kept if inside(other, c)]
        # A group inside c and 90% its size is c under another name (cache_bucket=high and preempted=no when
        # only the other pods evict): it goes with c, and makes no cover of c for the causes inside it.
        same = [other for other in inner if sizes[other] >= 0.9 * sizes[c]]
        gone.update((other, c) for other in same if other not in gone)
        smaller = [other for other in inner if other not in same]
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


def _one_row_per_cause(
    ranked: list[Candidate], table: pl.DataFrame
) -> tuple[list[Candidate], dict[Candidate, list[Candidate]]]:
    """Clusters in rank order, each either leading a row or the cause of one ranked above it seen through
    another dimension or symptom: SAME_REQUESTS of its bad requests (in the window) are that one's bad
    requests and, on the same symptom, within that one's group its own members are no riskier than the others
    (by the pair rule's 1.25x, so `replica_id=r1, tenant_id=t1` stays beside `replica_id=r1` when r1 is bad
    with every tenant and far worse with t1). Returns the leaders, in order, and the clusters each leads."""
    members = {c: table.select(_member(table, dict(c.signature))).to_series() for c in ranked}
    bad = {c: members[c] & table[f"_bad{c.symptom}"] for c in ranked}
    counts = {c: int(bad[c].sum()) for c in ranked}

    def same_cause(c: Candidate, leader: Candidate) -> bool:
        if not counts[c] or int((bad[c] & bad[leader]).sum()) < SAME_REQUESTS * counts[c]:
            return False
        if c.symptom != leader.symptom:
            return True  # the same requests showing another symptom: one cause, its symptoms named
        measured, low = table[f"_in{c.symptom}"] & members[leader], table[f"_bad{c.symptom}"] & members[leader]
        inside, rest = members[c], ~members[c]
        within = Evidence(
            size=int((measured & inside).sum()),
            bad=int((low & inside).sum()),
            outside=int((measured & rest).sum()),
            bad_outside=int((low & rest).sum()),
        )
        return within.risk_ratio <= 1.25

    same: dict[Candidate, list[Candidate]] = {}
    for c in ranked:
        leader = next((other for other in same if same_cause(c, other)), None)
        if leader is None:
            same[c] = []
        else:
            same[leader].append(c)
    return list(same), same


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
        failures.append(
            f"chance alone would do it with {p_written(evidence.p_value)}, above the bar of {written(each)}"
        )
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
    "p_value": pl.Float64, "excess": pl.Float64, "candidates": pl.Int64, "same_requests": pl.String,
    "bad": pl.Int64,
}  # fmt: skip


def _empty(window: Window) -> pl.DataFrame:
    return pl.DataFrame(schema=_SCHEMA)


def _row(
    cluster: Candidate, rank: int, *, table: pl.DataFrame, window: Window, config: Config, symptoms: list[Symptom],
    found: Found, alerts: list[FiringAlert],
) -> dict[str, Any]:  # fmt: skip
    signature = dict(cluster.signature)
    symptom, evidence, i = symptoms[cluster.symptom], cluster.tested(), cluster.symptom
    # Only the bad members' ids are taken out of the window's table, not a copy of the group.
    bad = table.filter(_member(table, signature) & pl.col(f"_bad{i}")).select("trace_id")
    examples = bad.sort("trace_id")["trace_id"].unique(maintain_order=True).head(config.examples).to_list()
    total_bad = evidence.bad + evidence.bad_outside
    views = found.same.get(cluster, [])
    signature_json = cluster.signature_json()
    return {
        "cluster_id": hashlib.sha256(f"{signature_json}/{symptom.key}@{window.start.isoformat()}".encode()).hexdigest()[
            :16
        ],
        "detector": _detector_for([cluster, *views], symptoms, alerts),
        "window_start": window.start,
        "window_end": window.end,
        "signature": signature_json,
        "size": evidence.size,
        "support": evidence.bad / total_bad,
        "risk_ratio": evidence.risk_ratio,
        "score": evidence.excess / total_bad,
        "summary": summary(cluster, symptoms, found, window) + _seen_also(cluster, views, symptoms),
        "suggested_fix": suggested_fix(signature),
        "example_trace_ids": examples,
        "rank": rank,
        "bad_reason": symptom.text,
        "symptom": symptom.key,
        "p_value": evidence.p_value,
        "excess": evidence.excess,
        "candidates": cluster.directed.hypotheses if cluster.directed is not None else found.tried,
        "same_requests": json.dumps(
            [{"signature": dict(c.signature), "symptom": symptoms[c.symptom].key} for c in views], sort_keys=True
        ),
        "bad": evidence.bad,
    }


def summary(cluster: Candidate, symptoms: list[Symptom], found: Found, window: Window) -> str:
    """The plain fact first (who shows what, how often against the rest, over which time), then the numbers."""
    evidence, symptom = cluster.tested(), symptoms[cluster.symptom]
    who, plural = subject(dict(cluster.signature))
    when = f"since {clock(cluster.directed.since)}" if cluster.directed is not None else f"in {window.label()}"
    total_bad = evidence.bad + evidence.bad_outside
    return (
        f"{who} {symptom.do if plural else symptom.does} {_percent(evidence.rate_in)} of the time against "
        f"{_percent(evidence.rate_out)} on the rest {when}: {evidence.bad:,} of its {evidence.size:,} requests, "
        f"{_times(evidence.risk_ratio)} as likely ({_tested(cluster, found)}); {evidence.excess:,.0f} of the "
        f"{total_bad:,} bad beyond chance"
    )


def subject(signature: Mapping[str, str]) -> tuple[str, bool]:
    """A group as people name it (`replica r3`, `tenant acme with replica r1`), or `requests with
    cache_bucket=low` where a dimension is no one's name; and whether that subject is plural."""
    nouns = [f"{NOUNS[d]} {v}" for d, v in signature.items() if d in NOUNS]
    others = [f"{d}={v}" for d, v in signature.items() if d not in NOUNS]
    if not others:
        return " with ".join(nouns), False
    of = f"of {' with '.join(nouns)} " if nouns else ""
    return f"requests {of}with {' and '.join(others)}", True


def clock(at: datetime) -> str:
    """A time of day as an on-call engineer reads it against the alert's: 12:05 UTC, 11:54:30 UTC."""
    return f"{at:%H:%M} UTC" if at.second == 0 else f"{at:%H:%M:%S} UTC"


def _times(risk_ratio: float) -> str:
    return f"{MAX_RISK:.0f}x or more" if risk_ratio >= MAX_RISK else f"{risk_ratio:.1f}x"


def _percent(share: float) -> str:
    percent = 100 * share
    return f"{percent:.0f} %" if percent >= 10 else f"{percent:.2g} %"


def _tested(cluster: Candidate, found: Found) -> str:
    """The test a cluster passed, as its summary and the explanations quote it."""
    if cluster.directed is not None:
        d = cluster.directed
        return f"{p_written(d.evidence.p_value)}, bar {written(d.bar)}: Holm over {_alert_hypotheses(d.hypotheses)}"
    return f"{p_written(cluster.evidence.p_value)}, bar {written(found.bar)} over {found.tried:,} candidates"


def _alert_hypotheses(m: int) -> str:
    return f"the pass's {m} alert hypothesis" if m == 1 else f"the pass's {m} alert hypotheses"


def _seen_also(leader: Candidate, views: list[Candidate], symptoms: list[Symptom]) -> str:
    if not views:
        return ""
    shown = dict.fromkeys(symptoms[c.symptom].key for c in [leader, *views])
    also = ", ".join(f"{_named(dict(c.signature))} on {symptoms[c.symptom].key}" for c in views)
    return f"; the same requests as {also}: it shows {', '.join(shown)}"


def _named(group: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in group.items())


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


def _detector_for(clusters: list[Candidate], symptoms: list[Symptom], alerts: list[FiringAlert]) -> str:
    """The firing detector whose alert names this group (or a group it holds the same bad requests as) on its
    symptom, so a cluster links to the alert it explains."""
    for c in clusters:
        signature = dict(c.signature)
        for alert in alerts:
            group = alert_group(alert.detector, alert.labels)
            if (
                group
                and alert_symptom(alert.labels) == symptoms[c.symptom].key
                and all(signature.get(k) == v for k, v in group.items())
            ):
                return alert.detector
    return KEY


def _holds(cluster: Candidate, group: Mapping[str, str]) -> bool:
    signature = dict(cluster.signature)
    return all(signature.get(k) == v for k, v in group.items())


def _explanations(
    alerts: list[FiringAlert], tests: AlertTests, rows: list[dict[str, Any]], *, symptoms: list[Symptom],
    found: Found, config: Config,
) -> dict[str, str]:  # fmt: skip
    """For every firing alert that names a group, what is true of it: the cluster that explains it; or that its
    group passed and why it is not listed; or that it did not pass, with the numbers."""
    listed = dict(zip(found.clusters, rows, strict=True))
    out = {}
    for alert in alerts:
        outcome = tests.of_alert.get(alert.alert_id)
        if isinstance(outcome, str):
            out[alert.alert_id] = outcome
        elif outcome is not None:
            named = _named(alert_group(alert.detector, alert.labels))
            out[alert.alert_id] = _explain(
                named, tests.hypotheses[outcome], listed, found=found, symptoms=symptoms, config=config
            )
    return out


def _explain(
    named: str, h: Hypothesis, listed: Mapping[Candidate, Mapping[str, Any]], *, found: Found,
    symptoms: list[Symptom], config: Config,
) -> str:  # fmt: skip
    group, key = dict(h.group), symptoms[h.symptom].key
    for c, row in listed.items():
        if c.symptom == h.symptom and _holds(c, group):
            return f"{EXPLAINED_BY} {row['cluster_id']} on {key}: {row['summary']}"
    # The group itself (or a pair holding it) passed, exploratory or as the alert's own test, but is no row.
    passed = sorted(
        (c for c in found.passed if c.symptom == h.symptom and _holds(c, group)),
        key=lambda c: (len(c.signature) != len(group), _rank(c)),
    )
    if passed:
        c = passed[0]
        own, tested = _named(dict(c.signature)), _tested(c, found)
        holder = found.held.get(c)
        if holder is not None and holder in listed:
            row = listed[holder]
            return (
                f"{EXPLAINED_BY} {row['cluster_id']} on {symptoms[holder.symptom].key}, which holds the same "
                f"bad requests ({own} passed the evidence test on {key} too: {tested}): {row['summary']}"
            )
        if holder is not None:
            return (
                f"no cluster listed: {own} passed the evidence test on {key} ({tested}), and its bad requests are "
                f"those of {_named(dict(holder.signature))} on {symptoms[holder.symptom].key}, which passed too but "
                f"ranks below the {config.max_clusters} listed (max_clusters)"
            )
        return (
            f"no cluster listed: {own} passed the evidence test on {key} ({tested}) but ranks below the "
            f"{config.max_clusters} listed (max_clusters), each of which explains more of the window's bad requests "
            "beyond chance"
        )
    e, test = h.test.evidence, h.test
    return (
        f"no cluster: {named} did not pass the evidence test on {key} since {clock(test.since)}: {e.bad:,} of its "
        f"{e.size:,} requests {symptoms[h.symptom].text} ({_percent(e.rate_in)}) against {_percent(e.rate_out)} "
        f"for the rest, risk ratio {e.risk_ratio:.2f}, {p_written(e.p_value)} (bar {written(test.bar)}: Holm over "
        f"{_alert_hypotheses(test.hypotheses)}); " + "; ".join(h.failures)
    )
