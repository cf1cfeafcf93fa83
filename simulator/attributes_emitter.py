"""The attributes emitter: one `llm_request` span per request carrying everything as attributes, as an
instrumented fleet can be made to send it."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from simulator.model import DEPLOYMENT, MODEL, Request, pod
from simulator.span_export import tracer_provider


class AttributesSender:
    """One TracerProvider per replica, as each vLLM replica process has its own resource, and everything
    about a request as attributes of its one span."""

    def __init__(self, endpoint: str, protocol: str, seed: int) -> None:
        self._providers: dict[str, TracerProvider] = {}
        self._endpoint, self._protocol, self._seed = endpoint, protocol, seed

    def _tracer(self, replica: str, version: str) -> Any:
        # A replica of another version is another process: another resource.
        key = f"{replica}/{version}"
        if key not in self._providers:
            self._providers[key] = tracer_provider(
                {
                    "service.name": DEPLOYMENT,
                    "service.instance.id": replica,
                    "k8s.pod.name": pod(replica),
                    "service.version": version,
                },
                self._seed + len(self._providers),
                self._endpoint,
                self._protocol,
            )
        return self._providers[key].get_tracer("vllm.tracing.otel")

    def send(self, r: Request) -> None:
        start_ns, end_ns = r.span_ns()
        span = self._tracer(r.replica, r.version).start_span(
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
