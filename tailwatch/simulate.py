"""`tailwatch simulate`: realistic LLM-serving request spans, sent through the real OpenTelemetry SDK.

A scenario is a healthy cluster plus one planted cause, confined to the fault window (the last
`window_minutes` before `end`). The history before it gives detectors their baselines. Everything
but the wall clock comes from `--seed`, span ids included, so a run can be repeated exactly.

Two emitters send the same requests:
- `attributes`: one `llm_request` span per request carrying everything (tenant, queue depth, cache hits,
  quantization, scores) as attributes, as an instrumented fleet can be made to send it;
- `vllm`: what a fleet sends with nothing custom: vLLM 0.33's own span (timings and token counts
  only), the gateway's span for tenant and model, `gen_ai.evaluation.result` log records for scores,
  and the engines' Prometheus metrics as the OpenTelemetry Collector forwards a 5-second scrape.
  Queue depth, replica count and cache hits then reach the request model only through the join.
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import time
import urllib.error
import urllib.request
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import grpc
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEPLOYMENT = "vllm-llama8b"
REPLICAS = ("r0", "r1", "r2", "r3")
TENANTS = {"acme": 0.5, "globex": 0.3, "initech": 0.2}
NS = 1_000_000_000
EMITTERS = ("attributes", "vllm")
INTERVAL_NS = 5 * NS  # the Collector's scrape_interval for the engines' /metrics


def pod(replica: str) -> str:
    """The replica's pod name: what operators call it, and the key its spans and metrics share."""
    return f"{DEPLOYMENT}-{replica}"


@dataclass
class Request:
    """One LLM request as the serving engine saw it."""

    end: datetime
    tenant: str
    replica: str
    prompt_tokens: int
    output_tokens: int
    cache_hit_ratio: float
    queue_ms: float
    prefill_ms: float
    tpot_ms: float
    queue_depth: int
    replica_count: int
    prefill_in_batch: int
    quantization: str
    scores: dict[str, float] = field(default_factory=dict)
    # Engine state a scenario plants; only the vllm emitter sends it (in the replica's metrics).
    kv_cache_usage: float | None = None  # the replica's KV usage while this request ran
    preemptions: int = 0

    @property
    def e2e_ms(self) -> float:
        return self.queue_ms + self.prefill_ms + self.tpot_ms * (self.output_tokens - 1)

    def span_ns(self) -> tuple[int, int]:
        """Arrival and finish in Unix nanoseconds, as both emitters send them."""
        end_ns = int(self.end.replace(tzinfo=UTC).timestamp() * NS)
        return end_ns - int(self.e2e_ms * 1e6), end_ns


def healthy(rng: random.Random, end: datetime, tenants: dict[str, float] = TENANTS) -> Request:
    """A request from a cluster with headroom: warm cache, short queues, steady decode."""
    prompt = int(min(30_000, max(50, rng.lognormvariate(math.log(1200), 0.6))))
    output = rng.randint(60, 700)
    return Request(
        end=end,
        tenant=rng.choices(list(tenants), weights=list(tenants.values()))[0],
        replica=rng.choice(REPLICAS),
        prompt_tokens=prompt,
        output_tokens=output,
        cache_hit_ratio=min(0.99, max(0.86, rng.gauss(0.93, 0.03))),
        queue_ms=rng.uniform(2, 20),
        prefill_ms=40 + prompt / 25,
        tpot_ms=max(6.0, rng.gauss(12.0, 1.2)),
        queue_depth=rng.randint(1, 5),
        replica_count=len(REPLICAS),
        prefill_in_batch=rng.randint(200, 2500),
        quantization="fp16",
        scores={"json_adherence": _score(rng, 0.88), "groundedness": _score(rng, 0.90)},
    )


def _score(rng: random.Random, mean: float) -> float:
    return min(1.0, max(0.0, rng.gauss(mean, 0.03)))


# --- scenarios: each changes requests in the fault window ------------------------------------------

Fault = Callable[[random.Random, Request], Request]


def _decode_jitter(rng: random.Random, r: Request) -> Request:
    # Long prefills land in the decode batches: some requests decode 4x slower beside them.
    if rng.random() < 0.15:
        return replace(r, tpot_ms=r.tpot_ms * 4, prefill_in_batch=rng.randint(6000, 9000))
    return r


def _kv_eviction(rng: random.Random, r: Request) -> Request:
    # Memory pressure evicts prefixes: cache hits fall for half the traffic, and with them quality.
    roll = rng.random()
    if roll < 0.30:
        ratio, quality = rng.uniform(0.05, 0.50), 0.68
    elif roll < 0.50:
        ratio, quality = rng.uniform(0.56, 0.84), 0.81
    else:
        return r
    scores = {"json_adherence": _score(rng, quality), "groundedness": _score(rng, quality + 0.02)}
    return replace(r, cache_hit_ratio=ratio, prefill_ms=r.prefill_ms * (2 - ratio), scores=scores)


def _replica_drift(rng: random.Random, r: Request) -> Request:
    # One replica loses points on structured output (a bad weight reload, a stale LoRA).
    if r.replica == "r3":
        return replace(r, scores={**r.scores, "json_adherence": _score(rng, 0.82)})
    return r


def _quantization_regression(rng: random.Random, r: Request) -> Request:
    # Half the fleet serves an int4 build that calls tools less correctly.
    if r.replica in ("r2", "r3"):
        return replace(r, quantization="int4", scores={**r.scores, "tool_call_correctness": _score(rng, 0.80)})
    return replace(r, scores={**r.scores, "tool_call_correctness": _score(rng, 0.90)})


def _long_context(rng: random.Random, r: Request) -> Request:
    # Prompts beyond 64k tokens lose grounding.
    if rng.random() < 0.15:
        prompt = rng.randint(66_000, 120_000)
        return replace(
            r,
            prompt_tokens=prompt,
            prefill_ms=40 + prompt / 25,
            scores={**r.scores, "groundedness": _score(rng, 0.76)},
        )
    return r


def _ns(at: datetime) -> int:
    return int(at.replace(tzinfo=UTC).timestamp() * NS)


def scrape_offset_ns(replica: str) -> int:
    """Where in each interval the Collector scrapes a replica: its targets are spread over the interval."""
    return REPLICAS.index(replica) * INTERVAL_NS // len(REPLICAS) if replica in REPLICAS else 0


def scrape_floor(replica: str, at_ns: int, anchor_ns: int = 0) -> int:
    """The replica's last scrape time at or before `at_ns`. Scrapes fall on `anchor_ns` (the fault window's
    end) plus the replica's offset, every interval: placed by the run, not the wall clock, so a seed
    repeats which requests a scrape sees."""
    return at_ns - (at_ns - anchor_ns - scrape_offset_ns(replica)) % INTERVAL_NS


# A fault that must agree with the engines' metrics, built per run from the fault window (start, end).
EngineFault = Callable[[random.Random, datetime, datetime], Fault]


def _kv_eviction_episodes(rng: random.Random, start: datetime, end: datetime) -> Fault:
    # kv_eviction as the engine shows it (vllm emitter): memory pressure comes in episodes of whole scrape
    # intervals on one replica (20-50 s), and while one lasts every request the replica serves misses the
    # cache and answers worse. About the shares of attributes mode, in time rather than per request: 30%
    # evicting (hits 0.05-0.45, KV 0.95+, preemptions, scores 0.68), 20% under pressure (hits 0.60-0.80,
    # KV ~0.9, scores 0.81). The joined ratio is the replica's over the request's lifetime, so a request
    # inside an episode gets the episode's ratio, and one at its edge a mix of two.
    start_ns, end_ns = _ns(start), _ns(end)
    episodes: dict[str, list[tuple[int, int, str, float, float]]] = {}
    for replica in REPLICAS:
        at = scrape_floor(replica, start_ns, end_ns) + INTERVAL_NS
        rows = episodes.setdefault(replica, [])
        while at < end_ns:
            length = rng.randint(4, 10) * INTERVAL_NS
            roll = rng.random()
            if roll < 0.30:
                rows.append((at, at + length, "low", rng.uniform(0.05, 0.45), rng.uniform(0.95, 0.99)))
            elif roll < 0.50:
                rows.append((at, at + length, "medium", rng.uniform(0.60, 0.80), rng.uniform(0.86, 0.93)))
            at += length

    def fault(rng: random.Random, r: Request) -> Request:
        arrival = r.span_ns()[0]
        episode = next((e for e in episodes.get(r.replica, ()) if e[0] <= arrival < e[1]), None)
        if episode is None:
            return r
        _, _, bucket, mean, kv = episode
        ratio = min(0.99, max(0.01, rng.gauss(mean, 0.02)))
        quality = 0.68 if bucket == "low" else 0.81
        scores = {"json_adherence": _score(rng, quality), "groundedness": _score(rng, quality + 0.02)}
        return replace(
            r,
            cache_hit_ratio=ratio,
            prefill_ms=r.prefill_ms * (2 - ratio),
            scores=scores,
            kv_cache_usage=kv,
            preemptions=rng.randint(0, 2) if bucket == "low" else 0,
        )

    return fault


@dataclass(frozen=True)
class Scenario:
    name: str
    truth: str  # the planted cause and the alert that should catch it
    fault: Fault | None = None
    stream: Callable[[random.Random, datetime, datetime, float], Iterable[Request]] | None = None
    engine_fault: EngineFault | None = None  # replaces `fault` for the vllm emitter


def _poisson(rng: random.Random, start: datetime, end: datetime, rate: float) -> Iterable[datetime]:
    at = start
    while True:
        at += timedelta(seconds=rng.expovariate(rate))
        if at >= end:
            return
        yield at


def _noisy_neighbor(rng: random.Random, start: datetime, end: datetime, rate: float) -> Iterable[Request]:
    # bigco bursts at ~500 requests a minute with long prefills; smallco's 5 a minute wait behind it.
    for at in _poisson(rng, start, end, rate):
        yield healthy(rng, at)
    for at in _poisson(rng, start, end, 500 / 60):
        r = healthy(rng, at, {"bigco": 1.0})
        yield replace(r, prompt_tokens=r.prompt_tokens * 3, queue_depth=rng.randint(20, 40))
    for at in _poisson(rng, start, end, 5 / 60):
        r = healthy(rng, at, {"smallco": 1.0})
        yield replace(r, queue_ms=r.queue_ms + rng.uniform(8_000, 12_000), queue_depth=rng.randint(20, 40))


def _morning_burst(rng: random.Random, start: datetime, end: datetime, rate: float) -> Iterable[Request]:
    # Traffic jumps 10x for 15 seconds; the autoscaler has not added replicas, queues grow, quality drops.
    burst_start = start + (end - start) / 2
    burst_end = burst_start + timedelta(seconds=15)
    for at in _poisson(rng, start, end, rate):
        yield healthy(rng, at)
    for at in _poisson(rng, burst_start, burst_end, rate * 10):
        r = healthy(rng, at)
        yield replace(
            r,
            queue_depth=rng.randint(60, 90),
            queue_ms=r.queue_ms + rng.uniform(1_000, 4_000),
            scores={"json_adherence": _score(rng, 0.70), "groundedness": _score(rng, 0.74)},
        )


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("steady", "healthy traffic: no detector fires"),
        Scenario(
            "decode_jitter",
            "15% of requests decode 4x slower beside >6000-token prefills: token_latency fires (prefill_burst)",
            _decode_jitter,
        ),
        Scenario(
            "kv_eviction",
            "cache hits fall for half the traffic and quality with them (0.88 / 0.81 / 0.68 by bucket): "
            "cache_curve fires for the low bucket",
            _kv_eviction,
            engine_fault=_kv_eviction_episodes,
        ),
        Scenario(
            "noisy_neighbor",
            "smallco (5 rpm) queues ~10 s behind bigco's 500 rpm burst: tenant_fairness fires for smallco only",
            stream=_noisy_neighbor,
        ),
        Scenario(
            "morning_burst",
            "a 15-second 10x arrival burst, no new replicas; burst requests score 0.70 vs 0.88: traffic_pattern fires",
            stream=_morning_burst,
        ),
        Scenario(
            "replica_drift",
            f"replica {pod('r3')} scores 0.06 lower on json_adherence (replica_skew, part 5)",
            _replica_drift,
        ),
        Scenario(
            "quantization_regression",
            f"int4 replicas {pod('r2')}/{pod('r3')} score 0.10 lower on tool_call_correctness "
            "(quantization_delta, part 5)",
            _quantization_regression,
        ),
        Scenario(
            "long_context", "prompts over 64k tokens lose 0.14 groundedness (context_length, part 5)", _long_context
        ),
    )
}


def requests(
    names: list[str], *, seed: int, end: datetime, history_hours: float, history_rate: float, rate: float,
    window_minutes: float = 5.0, emitter: str = "attributes",
) -> list[Request]:  # fmt: skip
    """History (healthy) then the fault window with every named scenario applied, sorted by end time.
    For the vllm emitter a scenario's `engine_fault`, when it has one, replaces its per-request fault."""
    rng = random.Random(seed)
    window_start = end - timedelta(minutes=window_minutes)
    history = [
        healthy(rng, at)
        for at in _poisson(rng, window_start - timedelta(hours=history_hours), window_start, history_rate)
    ]
    scenarios = [SCENARIOS[n] for n in names]
    stream = next((s.stream for s in scenarios if s.stream), None)
    window = list(
        stream(rng, window_start, end, rate)
        if stream
        else (healthy(rng, at) for at in _poisson(rng, window_start, end, rate))
    )
    for scenario in scenarios:
        fault = scenario.fault
        if emitter == "vllm" and scenario.engine_fault is not None:
            fault = scenario.engine_fault(rng, window_start, end)
        if fault is not None:
            window = [fault(rng, r) for r in window]
    return sorted(history + window, key=lambda r: r.end)  # fmt: skip


def id_seed(seed: int, names: list[str], end: datetime, emitter: str = "attributes") -> int:
    """The ids' seed: the same run repeats its ids (a replay is deduplicated as a retry), while another
    scenario, end time or emitter with the same --seed gets ids of its own instead of being dropped as
    duplicates."""
    key = f"{seed}|{','.join(sorted(names))}|{end.isoformat()}".encode()
    if emitter != "attributes":
        key += f"|{emitter}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


class SeededIds(IdGenerator):
    """Span and trace ids from the scenario's seed, so a run repeats exactly."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed ^ 0x5EED)

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


class Emitter(Protocol):
    def send(self, r: Request) -> None: ...

    def tick(self, now_ns: int) -> None: ...

    def close(self) -> bool: ...


def _span_exporter(endpoint: str, protocol: str) -> Any:
    if protocol == "grpc":
        return GrpcExporter(endpoint=endpoint, insecure=True)
    return HttpExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")


class Sender:
    """The attributes emitter: one TracerProvider per replica, as each vLLM replica process has its own
    resource, and everything about a request as attributes of its one span."""

    def __init__(self, endpoint: str, protocol: str, seed: int) -> None:
        self._providers: dict[str, TracerProvider] = {}
        self._endpoint, self._protocol, self._seed = endpoint, protocol, seed

    def _tracer(self, replica: str) -> Any:
        if replica not in self._providers:
            provider = TracerProvider(
                resource=Resource.create(
                    {"service.name": DEPLOYMENT, "service.instance.id": replica, "k8s.pod.name": pod(replica)}
                ),
                id_generator=SeededIds(self._seed + len(self._providers)),
            )
            exporter = _span_exporter(self._endpoint, self._protocol)
            provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=1024))
            self._providers[replica] = provider
        return self._providers[replica].get_tracer("vllm.tracing.otel")

    def send(self, r: Request) -> None:
        start_ns, end_ns = r.span_ns()
        span = self._tracer(r.replica).start_span(
            "llm_request",
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes={
                "gen_ai.response.model": MODEL,
                "gen_ai.usage.prompt_tokens": r.prompt_tokens,
                "gen_ai.usage.completion_tokens": r.output_tokens,
                "gen_ai.usage.cached_tokens": int(r.prompt_tokens * r.cache_hit_ratio),
                "gen_ai.latency.time_in_queue": r.queue_ms / 1000,
                "gen_ai.latency.time_to_first_token": (r.queue_ms + r.prefill_ms) / 1000,
                "gen_ai.latency.time_in_model_prefill": r.prefill_ms / 1000,
                "gen_ai.latency.time_in_model_decode": r.tpot_ms * (r.output_tokens - 1) / 1000,
                "gen_ai.latency.e2e": r.e2e_ms / 1000,
                "tenant.id": r.tenant,
                "cluster.queue_depth": r.queue_depth,
                "cluster.replica_count": r.replica_count,
                "llm.vllm.prefill_in_batch": r.prefill_in_batch,
                "llm.vllm.quantization": r.quantization,
                **{f"eval.{name}": value for name, value in r.scores.items()},
            },
        )
        span.end(end_time=end_ns)

    def tick(self, now_ns: int) -> None:
        """Nothing but spans: every fact rides on them."""

    def close(self) -> bool:
        ok = all(p.force_flush(60_000) for p in self._providers.values())
        for p in self._providers.values():
            p.shutdown()
        return ok


# --- the vllm emitter's engine metrics -----------------------------------------------------------

# What the Collector's prometheus receiver calls itself in the scope of the metrics it forwards.
SCRAPE_SCOPE = ("github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver", "0.139.0")
STEP_NS = 12_000_000  # one engine step (a decode iteration) while the replica has anything running
# vLLM sets its gauges from the scheduler's lists after each engine step, and a request joins the waiting
# list only at the scheduling pass after the step in flight when it arrived: one that pass admits is never
# seen waiting. Healthy requests' 2-20 ms queue is that wait for the pass; a longer queue shows from here on.
FIRST_PASS_NS = 20_000_000
# vLLM's buckets for vllm:iteration_tokens_total (tokens scheduled per engine step).
ITERATION_BOUNDS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
UP_BEFORE_NS = 3600 * NS  # the engines had been up an hour before the first scrape sent
SCRAPES_PER_EXPORT = 1000  # scrapes in one export: about the Collector batch processor's 8192 points
KV_LOOKBACK_NS = 60 * NS
LIVE_LAG_NS = 30 * NS  # live scrapes wait until every request in flight at their time has finished
HELP = {
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prefix_cache_queries_total": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits_total": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:num_preemptions_total": "Cumulative number of preemption from the engine.",
    "vllm:iteration_tokens_total": "Histogram of number of tokens per engine_step.",
}


@dataclass(frozen=True)
class _Run:
    """One request on its replica, in Unix nanoseconds: queued, scheduled, first token, finished."""

    arrival: int
    scheduled: int
    first_token: int
    end: int
    prompt: int
    output: int
    hits: int
    kv: float | None
    preemptions: int
    quantization: str

    @classmethod
    def of(cls, r: Request) -> _Run:
        arrival, end = r.span_ns()
        scheduled = min(end, arrival + int(r.queue_ms * 1e6))
        first = min(end, scheduled + int(r.prefill_ms * 1e6))
        hits = round(r.prompt_tokens * r.cache_hit_ratio)
        return cls(arrival, scheduled, first, end, r.prompt_tokens, r.output_tokens, hits, r.kv_cache_usage,
                   r.preemptions, r.quantization)  # fmt: skip

    def decoded(self, lo: int, hi: int) -> int:
        """Tokens it generated in [lo, hi): the first at first_token, then evenly until the last at end."""
        if self.output <= 1 or self.end <= self.first_token:
            return self.output if lo <= self.first_token < hi else 0
        step = (self.end - self.first_token) / (self.output - 1)

        def before(t: int) -> int:
            return min(self.output, max(0, math.ceil((t - self.first_token) / step)))

        return before(hi) - before(lo)


@dataclass(frozen=True)
class _Scrape:
    """One replica's values at one scrape; counters and the histogram since `start` (its process start)."""

    time: int
    start: int
    waiting: int
    running: int
    kv: float
    queries: float
    hits: float
    preemptions: float
    step_tokens: float
    steps: int
    buckets: tuple[int, ...]


def _union(segments: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(segments):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


class Engine:
    """Each replica's /metrics, scraped every 5 s, computed from the requests the replica served: what
    vLLM would have counted while serving them. At a scrape time t, waiting = the replica's requests
    with arrival + 20 ms <= t < arrival + queue time (vLLM samples its waiting list after each step, so
    a request the first scheduling pass admits is never seen waiting: FIRST_PASS_NS), running = those
    past their queue and not finished. The prefix-cache counters grow at each arrival by its prompt tokens
    and the prompt x its hit ratio, preemptions by what a scenario planted; iteration tokens count each
    step's uncached prompt and generated tokens, steps of 12 ms while anything runs (one scrape
    interval's steps in the bucket of their mean). KV usage is a healthy 0.4-0.7 (a slow wave plus the
    running requests) unless a request in flight carries a scenario's `kv_cache_usage`. A change of
    quantization is a new engine process: its counters restart from zero at a scrape, with a new start
    time."""

    def __init__(self, seed: int, anchor_ns: int = 0) -> None:
        self._anchor = anchor_ns
        rng = random.Random(seed ^ 0xE61E)
        self._phase = {r: rng.uniform(0, 2 * math.pi) for r in REPLICAS}
        self._prior = {r: float(rng.randint(2_000_000, 9_000_000)) for r in REPLICAS}
        self._runs: dict[str, list[_Run]] = {}
        self._start: int | None = None
        self._first: dict[str, int] = {}
        self._sent: dict[str, int] = {}

    def add(self, r: Request) -> None:
        self._runs.setdefault(r.replica, []).append(_Run.of(r))

    def last_end(self) -> int:
        return max((run.end for runs in self._runs.values() for run in runs), default=0)

    def scrapes(self, until_ns: int) -> list[ExportMetricsServiceRequest]:
        """Every scrape at or before `until_ns` not returned yet, as the Collector would export them."""
        if not self._runs:
            return []
        if self._start is None:
            # Every replica reports from before the first request on, so all of them count from the start.
            self._start = min(r.arrival for runs in self._runs.values() for r in runs)
        scraped: list[tuple[int, int, metrics_pb2.ResourceMetrics]] = []
        for replica, runs in sorted(self._runs.items()):
            first = self._first.setdefault(replica, scrape_floor(replica, self._start, self._anchor) - INTERVAL_NS)
            sent = self._sent.get(replica, first - INTERVAL_NS)
            last = scrape_floor(replica, until_ns, self._anchor)
            if last <= sent:
                continue
            times = list(range(first, last + 1, INTERVAL_NS))
            for s in self._replica(replica, runs, times):
                if s.time > sent:
                    scraped.append(
                        (s.time, REPLICAS.index(replica) if replica in REPLICAS else -1, _message(replica, s))
                    )
            self._sent[replica] = last
        scraped.sort(key=lambda x: (x[0], x[1]))
        out = []
        for i in range(0, len(scraped), SCRAPES_PER_EXPORT):
            request = ExportMetricsServiceRequest()
            request.resource_metrics.extend(m for _, _, m in scraped[i : i + SCRAPES_PER_EXPORT])
            out.append(request)
        return out

    def _replica(self, replica: str, unsorted: list[_Run], times: list[int]) -> list[_Scrape]:
        n = len(times)
        runs = sorted(unsorted, key=lambda r: r.arrival)
        # Bin k holds what happened in [times[k-1], times[k]), reported by the scrape at times[k].
        queries, hits, preempted, tokens = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
        busy = [0] * n
        for r in runs:
            k = bisect_right(times, r.arrival)
            if k < n:
                queries[k] += r.prompt
                hits[k] += r.hits
                preempted[k] += r.preemptions
            k = bisect_right(times, r.scheduled)
            if k < n:
                tokens[k] += r.prompt - r.hits  # a cached prefix is not computed again
            for k in range(max(1, bisect_right(times, r.first_token)), min(n, bisect_right(times, r.end) + 1)):
                tokens[k] += r.decoded(times[k - 1], times[k])
        for lo, hi in _union((r.scheduled, r.end) for r in runs):
            for k in range(max(1, bisect_right(times, lo)), min(n, bisect_right(times, hi) + 1)):
                busy[k] += max(0, min(hi, times[k]) - max(lo, times[k - 1]))

        # One engine process per build, from its first request's scrape interval on: the replica restarted.
        processes = [(times[0] - UP_BEFORE_NS, runs[0].quantization)]
        for r in runs:
            if all(r.quantization != q for _, q in processes):
                restart = scrape_floor(replica, r.arrival, self._anchor)
                processes.append((max(processes[-1][0] + 1, restart), r.quantization))
        starts = [start for start, _ in processes]

        # Seen waiting only once a scheduling pass has left it waiting (FIRST_PASS_NS).
        left_waiting = [r for r in runs if r.scheduled > r.arrival + FIRST_PASS_NS]
        waits_from = sorted(r.arrival + FIRST_PASS_NS for r in left_waiting)
        waits_until = sorted(r.scheduled for r in left_waiting)
        scheduled = sorted(r.scheduled for r in runs)
        ends = sorted(r.end for r in runs)
        hinted = [r for r in runs if r.kv is not None]
        hinted_arrivals = [r.arrival for r in hinted]
        prior = self._prior.get(replica, 0.0)

        out: list[_Scrape] = []
        process = 0
        # What the engine had counted in the hour before: ~0.93 of its prompt tokens hit, ~12 tokens a step.
        q, h, p, step_tokens, steps = prior, float(round(prior * 0.93)), 0.0, prior * 0.3, int(prior // 40)
        buckets = [0] * (len(ITERATION_BOUNDS) + 1)
        buckets[bisect_left(ITERATION_BOUNDS, 12.0)] = steps
        for k, t in enumerate(times):
            now = bisect_right(starts, t) - 1
            if now != process:  # a new engine process: its counters start from nothing
                process, q, h, p, step_tokens, steps = now, 0.0, 0.0, 0.0, 0.0, 0
                buckets = [0] * (len(ITERATION_BOUNDS) + 1)
            elif k > 0:
                q, h, p = q + queries[k], h + hits[k], p + preempted[k]
                n_steps = round(busy[k] / STEP_NS)
                if tokens[k] > 0:
                    n_steps = max(1, n_steps)
                if n_steps:
                    buckets[bisect_left(ITERATION_BOUNDS, tokens[k] / n_steps)] += n_steps
                step_tokens, steps = step_tokens + tokens[k], steps + n_steps
            running = bisect_right(scheduled, t) - bisect_right(ends, t)
            waiting = bisect_right(waits_from, t) - bisect_right(waits_until, t)
            kv = 0.47 + 0.07 * math.sin(2 * math.pi * t / (1800 * NS) + self._phase.get(replica, 0.0))
            kv = min(0.97, kv + 0.015 * running)
            i = bisect_right(hinted_arrivals, t) - 1
            while i >= 0 and hinted_arrivals[i] > t - KV_LOOKBACK_NS:
                r = hinted[i]
                if r.kv is not None and (r.end > t or r.arrival > t - INTERVAL_NS):
                    kv = max(kv, r.kv)
                i -= 1
            out.append(
                _Scrape(t, starts[process], waiting, running, round(kv, 4), q, h, p, step_tokens, steps, tuple(buckets))
            )
        return out


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def scrape_resource(replica: str) -> dict[str, str]:
    """The resource the Collector gives a scrape of the replica: the job as service.name, the target as
    service.instance.id, and the pod name the k8sattributes processor adds (the spans carry it too)."""
    address = f"10.42.0.{11 + (REPLICAS.index(replica) if replica in REPLICAS else 0)}"
    return {
        "service.name": DEPLOYMENT,
        "service.instance.id": f"{address}:8000",
        "server.address": address,
        "server.port": "8000",
        "url.scheme": "http",
        "k8s.pod.name": pod(replica),
        "k8s.namespace.name": "serving",
    }


def _message(replica: str, s: _Scrape) -> metrics_pb2.ResourceMetrics:
    rm = metrics_pb2.ResourceMetrics()
    rm.resource.attributes.extend(_kv(k, v) for k, v in scrape_resource(replica).items())
    sm = rm.scope_metrics.add()
    sm.scope.CopyFrom(InstrumentationScope(name=SCRAPE_SCOPE[0], version=SCRAPE_SCOPE[1]))
    labels = [_kv("engine", "0"), _kv("model_name", MODEL)]

    def metric(name: str) -> Any:
        return sm.metrics.add(name=name, description=HELP[name])

    for name, value in (
        ("vllm:num_requests_waiting", float(s.waiting)),
        ("vllm:num_requests_running", float(s.running)),
        ("vllm:kv_cache_usage_perc", s.kv),
    ):
        metric(name).gauge.data_points.add(time_unix_nano=s.time, as_double=value).attributes.extend(labels)
    for name, value in (
        ("vllm:prefix_cache_queries_total", s.queries),
        ("vllm:prefix_cache_hits_total", s.hits),
        ("vllm:num_preemptions_total", s.preemptions),
    ):
        m = metric(name)
        m.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
        m.sum.is_monotonic = True
        m.sum.data_points.add(time_unix_nano=s.time, start_time_unix_nano=s.start, as_double=value).attributes.extend(
            labels
        )
    m = metric("vllm:iteration_tokens_total")
    m.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    dp = m.histogram.data_points.add(
        time_unix_nano=s.time, start_time_unix_nano=s.start, count=s.steps, sum=s.step_tokens
    )
    dp.bucket_counts.extend(s.buckets)
    dp.explicit_bounds.extend(ITERATION_BOUNDS)
    dp.attributes.extend(labels)
    return rm


class MetricsExporter:
    """Sends built ExportMetricsServiceRequest messages as the Collector's otlp / otlphttp exporters do
    (the SDK's MeterProvider cannot name an instrument `vllm:...`), retrying what OTLP calls retryable."""

    _RETRY_GRPC = frozenset((grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED))
    _RETRY_HTTP = frozenset((429, 502, 503, 504))
    ATTEMPTS = 8

    def __init__(self, endpoint: str, protocol: str) -> None:
        self.rejected_points = 0
        self._channel: grpc.Channel | None = None
        if protocol == "grpc":
            target = endpoint.split("://", 1)[-1].rstrip("/")
            self._channel = (
                grpc.secure_channel(target, grpc.ssl_channel_credentials())
                if endpoint.startswith("https://")
                else grpc.insecure_channel(target)
            )
            self._stub = metrics_service_pb2_grpc.MetricsServiceStub(self._channel)  # type: ignore[no-untyped-call]
        else:
            self._url = endpoint.rstrip("/") + "/v1/metrics"
            if not self._url.startswith(("http://", "https://")):
                raise ValueError(f"an OTLP/HTTP endpoint is an http:// or https:// URL, not {endpoint!r}")

    def export(self, request: ExportMetricsServiceRequest) -> bool:
        """True once the receiver took the request (points it rejected are counted in rejected_points)."""
        for attempt in range(self.ATTEMPTS):
            response = self._send(request)
            if response is not None:
                self.rejected_points += response.partial_success.rejected_data_points
                return True
            time.sleep(min(5.0, 0.1 * 2**attempt))
        return False

    def _send(self, request: ExportMetricsServiceRequest) -> ExportMetricsServiceResponse | None:
        """The response, or None to try again; raises on what a retry cannot fix."""
        if self._channel is not None:
            try:
                response: ExportMetricsServiceResponse = self._stub.Export(request, timeout=60)
            except grpc.RpcError as exc:
                if isinstance(exc, grpc.Call) and exc.code() in self._RETRY_GRPC:
                    return None
                raise
            return response
        http_request = urllib.request.Request(  # noqa: S310 - an http(s) URL, checked in __init__
            self._url,
            data=request.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(http_request, timeout=60) as answer:  # noqa: S310 - see above
                return ExportMetricsServiceResponse.FromString(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code in self._RETRY_HTTP:
                return None
            raise
        except urllib.error.URLError:
            return None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


# --- the vllm emitter ----------------------------------------------------------------------------

EVALUATION_EVENT = "gen_ai.evaluation.result"


def vllm_attributes(r: Request, request_id: str) -> dict[str, Any]:
    """vLLM 0.33's `llm_request` attributes: timings in seconds, token counts and the request id; the
    sampling parameters only when truthy. No model, tenant, replica, queue or cache attribute."""
    decode_s = r.tpot_ms * (r.output_tokens - 1) / 1000
    return {
        "gen_ai.latency.time_to_first_token": (r.queue_ms + r.prefill_ms) / 1000,
        "gen_ai.latency.e2e": r.e2e_ms / 1000,
        "gen_ai.latency.time_in_queue": r.queue_ms / 1000,
        "gen_ai.latency.time_in_model_prefill": r.prefill_ms / 1000,
        "gen_ai.latency.time_in_model_decode": decode_s,
        "gen_ai.latency.time_in_model_inference": r.prefill_ms / 1000 + decode_s,
        "gen_ai.usage.prompt_tokens": r.prompt_tokens,
        "gen_ai.usage.completion_tokens": r.output_tokens,
        "gen_ai.request.id": request_id,
        "gen_ai.request.max_tokens": 1024,
        "gen_ai.request.temperature": 0.7,
    }


class VllmSender:
    """The vllm emitter: what a fleet sends with nothing custom. Per request, a LiteLLM-like gateway
    CLIENT span (model, operation, the caller's team as tenant) and, as its child in the same trace,
    vLLM's own `llm_request` SERVER span from the replica's engine process (resource: service name,
    pod name and quantization as an operator sets them through OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES, plus vLLM's and the SDK's own); the request's scores as
    `gen_ai.evaluation.result` log records from a judge, on the gateway span; and the replicas' engine
    metrics (`Engine`) every 5 s, as OTLP metrics the way the Collector forwards a scrape."""

    def __init__(self, endpoint: str, protocol: str, ids: int, seed: int, anchor_ns: int) -> None:
        self._endpoint, self._protocol, self._ids = endpoint, protocol, ids
        self._rng = random.Random(ids ^ 0x7A11)
        self._providers: list[TracerProvider] = []
        self._engines: dict[tuple[str, str], Any] = {}
        self._gateway = self._tracer({"service.name": "litellm"}, "litellm")
        logs = (
            GrpcLogExporter(endpoint=endpoint, insecure=True)
            if protocol == "grpc"
            else HttpLogExporter(endpoint=endpoint.rstrip("/") + "/v1/logs")
        )
        self._judge = LoggerProvider(
            resource=Resource.create({"service.name": "llm-judge", "service.instance.id": self._instance_id()})
        )
        self._judge.add_log_record_processor(
            BatchLogRecordProcessor(logs, max_queue_size=262144, max_export_batch_size=1024)
        )
        self._evaluator = self._judge.get_logger("llm-judge")
        self._engine = Engine(seed, anchor_ns)
        self._metrics = MetricsExporter(endpoint, protocol)
        self._metrics_ok = True

    def _instance_id(self) -> str:
        # The SDK's random service.instance.id (a UUIDv4 per process), drawn from the seed.
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _tracer(self, resource: dict[str, str], scope: str) -> Any:
        provider = TracerProvider(
            resource=Resource.create({**resource, "service.instance.id": self._instance_id()}),
            id_generator=SeededIds(self._ids + len(self._providers)),
        )
        exporter = _span_exporter(self._endpoint, self._protocol)
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=1024))
        self._providers.append(provider)
        return provider.get_tracer(scope)

    def _engine_tracer(self, r: Request) -> Any:
        # One engine process per replica and build: a new quantization is a new process (and resource).
        key = (r.replica, r.quantization)
        if key not in self._engines:
            resource = {
                "service.name": DEPLOYMENT,  # OTEL_SERVICE_NAME
                "k8s.pod.name": pod(r.replica),  # OTEL_RESOURCE_ATTRIBUTES
                "quantization": r.quantization,
                "vllm.instrumenting_module_name": "vllm.llm_engine",
                "vllm.process_id": str(self._rng.randint(100, 4_000_000)),
            }
            self._engines[key] = self._tracer(resource, "vllm.tracing.otel")
        return self._engines[key]

    def send(self, r: Request) -> None:
        rng = self._rng
        arrival, end = r.span_ns()
        gateway = self._gateway.start_span(
            "litellm_request",
            kind=SpanKind.CLIENT,
            start_time=arrival - rng.randint(1_000_000, 4_000_000),
            attributes={
                "gen_ai.request.model": MODEL,
                "gen_ai.operation.name": "chat",
                "metadata.user_api_key_team_id": r.tenant,
            },
        )
        context = trace.set_span_in_context(gateway)
        request_id = f"chatcmpl-{rng.getrandbits(128):032x}"
        engine = self._engine_tracer(r).start_span(
            "llm_request", context=context, kind=SpanKind.SERVER, start_time=arrival,
            attributes=vllm_attributes(r, request_id),
        )  # fmt: skip
        engine.end(end_time=end)
        finished = end + rng.randint(1_000_000, 4_000_000)
        gateway.end(end_time=finished)
        judged = min(time.time_ns(), finished + rng.randint(500_000_000, 3 * NS))
        for name, value in r.scores.items():
            self._evaluator.emit(
                timestamp=judged,
                observed_timestamp=judged,
                context=context,
                severity_number=SeverityNumber.INFO,
                event_name=EVALUATION_EVENT,
                attributes={"gen_ai.evaluation.name": name, "gen_ai.evaluation.score.value": value},
            )
        self._engine.add(r)

    def tick(self, now_ns: int) -> None:
        """Send the scrapes up to `now_ns`."""
        for request in self._engine.scrapes(now_ns):
            self._metrics_ok = self._metrics.export(request) and self._metrics_ok

    def close(self) -> bool:
        # The last scrape after every request has finished, so each one's lifetime has an end; after live
        # traffic it is still to come, and a scrape does not happen before its time.
        final = self._engine.last_end() + INTERVAL_NS
        time.sleep(max(0, min(final - time.time_ns(), 2 * INTERVAL_NS)) / NS)
        self.tick(final)
        ok = all(p.force_flush(60_000) for p in self._providers) and self._judge.force_flush(60_000)
        for p in self._providers:
            p.shutdown()
        self._judge.shutdown()
        self._metrics.close()
        return ok and self._metrics_ok and self._metrics.rejected_points == 0


def progress(done: int, total: int, label: str) -> None:
    if sys.stderr.isatty() or done == total:
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="", file=sys.stderr)
        if done == total:
            print(file=sys.stderr)


def run(
    names: list[str], *, endpoint: str, protocol: str, seed: int, end: datetime, history_hours: float,
    history_rate: float, rate: float, live_seconds: float = 0.0, emitter: str = "attributes",
) -> int:  # fmt: skip
    """Backfill history and the fault window ending at `end`, then stream live traffic; returns the requests
    sent (one span each with the attributes emitter; two spans, their scores and the engines' metrics with
    the vllm emitter)."""
    if emitter not in EMITTERS:
        raise ValueError(f"unknown emitter {emitter!r}; known: {', '.join(EMITTERS)}")
    batch = requests(
        names, seed=seed, end=end, history_hours=history_hours, history_rate=history_rate, rate=rate, emitter=emitter
    )
    ids = id_seed(seed, names, end, emitter)
    sender: Emitter = (
        Sender(endpoint, protocol, ids)
        if emitter == "attributes"
        else VllmSender(endpoint, protocol, ids, seed, _ns(end))
    )
    for i, r in enumerate(batch, 1):
        sender.send(r)
        if i % 500 == 0 or i == len(batch):
            progress(i, len(batch), "backfill")
    sent = len(batch)
    if live_seconds > 0:
        sender.tick(_ns(end))
        rng = random.Random(seed + 1)
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < live_seconds:
            time.sleep(rng.expovariate(rate))
            sender.send(healthy(rng, datetime.now(UTC).replace(tzinfo=None)))
            sender.tick(time.time_ns() - LIVE_LAG_NS)
            sent += 1
            progress(int(elapsed), int(live_seconds), "live")
        progress(int(live_seconds), int(live_seconds), "live")
    if not sender.close():
        raise RuntimeError(
            "some spans, scores or metrics could not be exported; is Tailwatch listening at " + endpoint + "?"
        )
    return sent
