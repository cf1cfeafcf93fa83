"""A real OpenTelemetry Collector between a vLLM-like engine and Tailwatch: it scrapes the engine's
/metrics (vLLM's names) with its prometheus receiver and forwards them, with the engine's spans, over
OTLP; the request the span describes gets its queue depth, replica count, cache hits and KV usage from
the engine's metrics, joined by the pod name the resource processor stamps (as k8sattributes would).

Slow on first run: the Collector is built from Go modules (scripts/otelcol), then cached.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import RunningService, service_settings
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from otelcol import running_collector
from serverproc import free_port
from waiting import wait_until

# Slow: builds (first run) and runs a real Collector; CI and `scripts/test --all` run it.
pytestmark = pytest.mark.slow

POD = "vllm-llama8b-0"
DEPLOYMENT = "vllm-llama8b"
STARTED = time.time()


def vllm_page() -> bytes:
    """vLLM's /metrics: steady gauges, and prefix-cache counters growing 1000 queries / 700 hits a second."""
    elapsed = time.time() - STARTED
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    return "\n".join(
        [
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} 3.0",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} 5.0",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.91",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{{{labels}}} {1000.0 * elapsed}",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{{{labels}}} {700.0 * elapsed}",
            "",
        ]
    ).encode()


class Engine(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = vllm_page()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def collector_config(otlp_port: int, engine: str, tailwatch: str) -> str:
    return f"""
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_port}
  prometheus:
    config:
      scrape_configs:
        - job_name: {DEPLOYMENT}
          scrape_interval: 1s
          static_configs:
            - targets: ["{engine}"]
processors:
  batch:
    timeout: 200ms
  resource:
    attributes:
      - key: k8s.pod.name
        value: {POD}
        action: upsert
exporters:
  otlp:
    endpoint: {tailwatch}
    tls:
      insecure: true
service:
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [otlp]
    metrics:
      receivers: [prometheus]
      processors: [resource, batch]
      exporters: [otlp]
"""


def test_a_collector_forwards_vllm_spans_and_metrics_and_the_request_gets_the_engine_state(
    db_path: Path, tmp_path: Path, engine: str
) -> None:
    settings = service_settings(db_path, metrics={"interval_seconds": 1})
    with RunningService(settings) as svc:
        otlp_port = free_port()
        with running_collector(collector_config(otlp_port, engine, svc.grpc_target), tmp_path):
            scrapes = "SELECT count(DISTINCT time) FROM engine_metrics WHERE metric = 'requests_waiting'"
            wait_until(lambda: svc.rows(scrapes)[0][0] >= 2, "two scrapes of the engine to arrive")
            # vLLM's span: timings only, and the pod name from OTEL_RESOURCE_ATTRIBUTES (downward API).
            provider = TracerProvider(resource=Resource.create({"service.name": DEPLOYMENT, "k8s.pod.name": POD}))
            provider.add_span_processor(
                SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{otlp_port}", insecure=True))
            )
            # The request arrives just after a scrape and runs 1.5 s, as vLLM times it.
            latest = "SELECT max(epoch_ns(time)) FROM engine_metrics WHERE metric = 'requests_waiting'"
            start_ns = svc.rows(latest)[0][0] + 100_000_000
            end_ns = start_ns + 1_500_000_000
            span = provider.get_tracer("vllm.tracing.otel").start_span(
                "llm_request",
                kind=SpanKind.SERVER,
                start_time=start_ns,
                attributes={
                    "gen_ai.latency.e2e": 1.5,
                    "gen_ai.latency.time_to_first_token": 0.2,
                    "gen_ai.usage.prompt_tokens": 900,
                    "gen_ai.usage.completion_tokens": 120,
                },
            )
            span.end(end_time=end_ns)
            provider.shutdown()
            # The lifetime ends at the first point at or after the end of the second the request ended in.
            end_second_ns = (end_ns // 1_000_000_000 + 1) * 1_000_000_000
            later = (
                f"SELECT count(*) FROM engine_metrics WHERE epoch_ns(time) >= {end_second_ns} AND metric IS NOT NULL"
            )
            wait_until(lambda: svc.rows(later)[0][0] > 0, "a scrape after the request's end to arrive")
            wait_until(lambda: svc.rows("SELECT count(*) FROM llm_requests")[0][0] == 1, "the span to arrive")
        (row,) = svc.rows(
            "SELECT replica_id, queue_depth, queue_depth_source, replica_count, replica_count_source, "
            "cache_hit_ratio, cache_hit_ratio_source, kv_cache_usage, running_requests FROM llm_requests"
        )
        assert row[:5] == (POD, 3, "engine", 1, "engine")
        assert row[5] == pytest.approx(0.7, abs=0.01) and row[6] == "engine"
        assert row[7:] == (pytest.approx(0.91), 5)
        # Names arrive as vLLM exposes them; the receiver's own series are kept but not joined.
        names = dict(svc.rows("SELECT DISTINCT name, metric FROM engine_metrics"))
        assert names["vllm:prefix_cache_hits_total"] == "prefix_cache_hits"
        assert names["up"] is None
        stored = svc.rows("SELECT DISTINCT replica_id, deployment, source FROM engine_metrics")
        assert stored == [(POD, DEPLOYMENT, "otlp")]
