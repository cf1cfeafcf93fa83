"""`tailwatch simulate`: realistic LLM-serving request spans, sent through the real OpenTelemetry SDK.

A scenario is a healthy cluster plus one planted cause, confined to the fault window (the last
`window_minutes` before `end`). The history before it gives detectors their baselines. Everything
but the wall clock comes from `--seed`, span ids included, so a run can be repeated exactly.
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
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

    @property
    def e2e_ms(self) -> float:
        return self.queue_ms + self.prefill_ms + self.tpot_ms * (self.output_tokens - 1)


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


@dataclass(frozen=True)
class Scenario:
    name: str
    truth: str  # the planted cause and the alert that should catch it
    fault: Fault | None = None
    stream: Callable[[random.Random, datetime, datetime, float], Iterable[Request]] | None = None


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
            "replica_drift", "replica r3 scores 0.06 lower on json_adherence (replica_skew, part 5)", _replica_drift
        ),
        Scenario(
            "quantization_regression",
            "int4 replicas r2/r3 score 0.10 lower on tool_call_correctness (quantization_delta, part 5)",
            _quantization_regression,
        ),
        Scenario(
            "long_context", "prompts over 64k tokens lose 0.14 groundedness (context_length, part 5)", _long_context
        ),
    )
}


def requests(
    names: list[str], *, seed: int, end: datetime, history_hours: float, history_rate: float, rate: float,
    window_minutes: float = 5.0,
) -> list[Request]:  # fmt: skip
    """History (healthy) then the fault window with every named scenario applied, sorted by end time."""
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
        if scenario.fault is not None:
            window = [scenario.fault(rng, r) for r in window]
    return sorted(history + window, key=lambda r: r.end)  # fmt: skip


def id_seed(seed: int, names: list[str], end: datetime) -> int:
    """The ids' seed: the same run repeats its ids (a replay is deduplicated as a retry), while another
    scenario or end time with the same --seed gets ids of its own instead of being dropped as duplicates."""
    key = f"{seed}|{','.join(sorted(names))}|{end.isoformat()}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


class SeededIds(IdGenerator):
    """Span and trace ids from the scenario's seed, so a run repeats exactly."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed ^ 0x5EED)

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


class Sender:
    """One TracerProvider per replica, as each vLLM replica process has its own resource."""

    def __init__(self, endpoint: str, protocol: str, seed: int) -> None:
        self._providers: dict[str, TracerProvider] = {}
        self._endpoint, self._protocol, self._seed = endpoint, protocol, seed

    def _tracer(self, replica: str) -> Any:
        if replica not in self._providers:
            exporter = (
                GrpcExporter(endpoint=self._endpoint, insecure=True)
                if self._protocol == "grpc"
                else HttpExporter(endpoint=self._endpoint.rstrip("/") + "/v1/traces")
            )
            provider = TracerProvider(
                resource=Resource.create(
                    {
                        "service.name": DEPLOYMENT,
                        "service.instance.id": replica,
                        "k8s.pod.name": f"{DEPLOYMENT}-{replica}",
                    }
                ),
                id_generator=SeededIds(self._seed + len(self._providers)),
            )
            provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=1024))
            self._providers[replica] = provider
        return self._providers[replica].get_tracer("vllm.tracing.otel")

    def send(self, r: Request) -> None:
        end_ns = int(r.end.replace(tzinfo=UTC).timestamp() * NS)
        span = self._tracer(r.replica).start_span(
            "llm_request",
            kind=SpanKind.SERVER,
            start_time=end_ns - int(r.e2e_ms * 1e6),
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

    def close(self) -> bool:
        ok = all(p.force_flush(60_000) for p in self._providers.values())
        for p in self._providers.values():
            p.shutdown()
        return ok


def progress(done: int, total: int, label: str) -> None:
    if sys.stderr.isatty() or done == total:
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="", file=sys.stderr)
        if done == total:
            print(file=sys.stderr)


def run(
    names: list[str], *, endpoint: str, protocol: str, seed: int, end: datetime, history_hours: float,
    history_rate: float, rate: float, live_seconds: float = 0.0,
) -> int:  # fmt: skip
    """Backfill history and the fault window ending at `end`, then stream live traffic; returns spans sent."""
    batch = requests(names, seed=seed, end=end, history_hours=history_hours, history_rate=history_rate, rate=rate)
    sender = Sender(endpoint, protocol, id_seed(seed, names, end))
    for i, r in enumerate(batch, 1):
        sender.send(r)
        if i % 500 == 0 or i == len(batch):
            progress(i, len(batch), "backfill")
    sent = len(batch)
    if live_seconds > 0:
        rng = random.Random(seed + 1)
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < live_seconds:
            time.sleep(rng.expovariate(rate))
            sender.send(healthy(rng, datetime.now(UTC).replace(tzinfo=None)))
            sent += 1
            progress(int(elapsed), int(live_seconds), "live")
        progress(int(live_seconds), int(live_seconds), "live")
    if not sender.close():
        raise RuntimeError("some spans could not be exported; is Tailwatch listening at " + endpoint + "?")
    return sent
