"""What both emitters take from the OpenTelemetry SDK: a tracer provider per resource, as each process of a
real fleet has its own, batching its spans to the endpoint with ids drawn from the run's seed."""

from __future__ import annotations

import random
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator


class SeededIds(IdGenerator):
    """Span and trace ids from the scenario's seed, so a run repeats exactly."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed ^ 0x5EED)

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


def _span_exporter(endpoint: str, protocol: str) -> Any:
    if protocol == "grpc":
        return GrpcExporter(endpoint=endpoint, insecure=True)
    return HttpExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")


def tracer_provider(resource: dict[str, str], ids: int, endpoint: str, protocol: str) -> TracerProvider:
    """One process's provider: its span and trace ids drawn from `ids`, its spans batched to the endpoint."""
    provider = TracerProvider(resource=Resource.create(resource), id_generator=SeededIds(ids))
    exporter = _span_exporter(endpoint, protocol)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=1024))
    return provider
