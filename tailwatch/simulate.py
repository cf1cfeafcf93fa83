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
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

# The simulator lives in a few modules; this one runs it and re-exports what its callers use.
from tailwatch.simulate_engine import (
    FIRST_PASS_NS,
    HELP,
    ITERATION_BOUNDS,
    KV_LOOKBACK_NS,
    LIVE_LAG_NS,
    SCRAPE_SCOPE,
    SCRAPES_PER_EXPORT,
    STEP_NS,
    UP_BEFORE_NS,
    Engine,
    scrape_resource,
)
from tailwatch.simulate_model import (
    DEPLOYMENT,
    INTERVAL_NS,
    MODEL,
    NS,
    REPLICAS,
    TENANTS,
    Request,
    SeededIds,
    _ns,
    _span_exporter,
    healthy,
    pod,
    scrape_floor,
    scrape_offset_ns,
)
from tailwatch.simulate_scenarios import SCENARIOS, EngineFault, Fault, Scenario, _poisson
from tailwatch.simulate_vllm import EVALUATION_EVENT, MetricsExporter, VllmSender, vllm_attributes

__all__ = [
    "DEPLOYMENT",
    "EMITTERS",
    "EVALUATION_EVENT",
    "FIRST_PASS_NS",
    "HELP",
    "INTERVAL_NS",
    "ITERATION_BOUNDS",
    "KV_LOOKBACK_NS",
    "LIVE_LAG_NS",
    "MODEL",
    "NS",
    "REPLICAS",
    "SCENARIOS",
    "SCRAPES_PER_EXPORT",
    "SCRAPE_SCOPE",
    "STEP_NS",
    "TENANTS",
    "UP_BEFORE_NS",
    "Emitter",
    "Engine",
    "EngineFault",
    "Fault",
    "MetricsExporter",
    "Request",
    "Scenario",
    "SeededIds",
    "Sender",
    "VllmSender",
    "healthy",
    "id_seed",
    "pod",
    "progress",
    "requests",
    "run",
    "scrape_floor",
    "scrape_offset_ns",
    "scrape_resource",
    "vllm_attributes",
]

EMITTERS = ("attributes", "vllm")


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


class Emitter(Protocol):
    def send(self, r: Request) -> None: ...

    def tick(self, now_ns: int) -> None: ...

    def close(self) -> bool: ...


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
