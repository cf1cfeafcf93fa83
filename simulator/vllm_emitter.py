"""The vllm emitter: vLLM's own spans, a gateway's, a judge's scores as log records and the engines'
metrics, as a fleet sends them with nothing custom."""

from __future__ import annotations

import random
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from simulator.engine_metrics import Engine
from simulator.model import DEPLOYMENT, INTERVAL_NS, MODEL, NS, Request, pod
from simulator.span_export import tracer_provider

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
        provider = tracer_provider(
            {**resource, "service.instance.id": self._instance_id()},
            self._ids + len(self._providers),
            self._endpoint,
            self._protocol,
        )
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
