"""Realistic LLM serving spans for benchmarks: vLLM-style server spans with ~20 attributes each."""

from __future__ import annotations

import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3")
TENANTS = ("acme", "globex", "initech", "umbrella", "smallco")


def any_value(value: object) -> AnyValue:
    """The AnyValue an SDK encodes for a Python attribute value."""
    v = AnyValue()
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    elif isinstance(value, list | tuple):
        v.array_value.values.extend(any_value(x) for x in value)
    else:
        v.string_value = str(value)
    return v


def _kv(key: str, value: object) -> KeyValue:
    return KeyValue(key=key, value=any_value(value))


def base_request(rng: random.Random, spans: int, t0_ns: int) -> ExportTraceServiceRequest:
    """One export request as an OTel SDK or Collector would batch it: one resource, one scope."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    replica = rng.randrange(8)
    for k, v in {
        "service.name": "vllm-llama8b",
        "service.instance.id": f"replica-{replica}",
        "k8s.pod.name": f"vllm-{replica}-7f9c",
        "tenant.id": rng.choice(TENANTS),
        "telemetry.sdk.name": "opentelemetry",
    }.items():
        rs.resource.attributes.append(_kv(k, v))
    ss = rs.scope_spans.add()
    ss.scope.name = "vllm.tracing.otel"
    for i in range(spans):
        prompt = rng.randint(50, 16000)
        output = rng.randint(1, 2000)
        # As vLLM takes them: the engine's latencies are differences of its monotonic clock's readings
        # (seconds since boot), time to first token and e2e are wall clock from arrival.
        queued = 86_400.0 + rng.random() * 3_600.0
        scheduled = queued + rng.random() * 0.05
        first = scheduled + 0.04 + prompt / 40000 + rng.random() * 0.05
        last = first + output * (0.012 + rng.random() * 0.01)
        queue, prefill, decode, inference = scheduled - queued, first - scheduled, last - first, last - scheduled
        ttft = 0.01 + queue + prefill
        e2e = ttft + decode
        s = ss.spans.add()
        s.trace_id = rng.randbytes(16)
        s.span_id = rng.randbytes(8)
        s.name = "llm_request"
        s.kind = 2  # SERVER
        s.start_time_unix_nano = t0_ns + i * 1_000_000
        s.end_time_unix_nano = s.start_time_unix_nano + int(e2e * 1e9)
        for k, v in {
            "gen_ai.request.id": f"chatcmpl-{rng.getrandbits(64):016x}",
            "gen_ai.request.model": rng.choice(MODELS),
            "gen_ai.usage.prompt_tokens": prompt,
            "gen_ai.usage.completion_tokens": output,
            "gen_ai.usage.cached_tokens": rng.randint(0, prompt),
            "gen_ai.latency.time_to_first_token": ttft,
            "gen_ai.latency.e2e": e2e,
            "gen_ai.latency.time_in_queue": queue,
            "gen_ai.latency.time_in_model_prefill": prefill,
            "gen_ai.latency.time_in_model_decode": decode,
            "gen_ai.latency.time_in_model_inference": inference,
            "gen_ai.request.max_tokens": 2048,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.top_p": 0.95,
            "gen_ai.request.n": 1,
            "gen_ai.response.finish_reasons": '["stop"]',
            "cluster.queue_depth": rng.randint(0, 40),
            "cluster.replica_count": 8,
            "llm.vllm.batch_size": rng.randint(1, 64),
            "llm.vllm.prefill_in_batch": rng.randint(0, 8000),
        }.items():
            s.attributes.append(_kv(k, v))
        s.status.code = 1
    return req


def unique_requests(n: int, spans: int, seed: int, t0_ns: int) -> list[bytes]:
    """`n` serialized requests, every span id distinct, built from a few bases with fresh ids."""
    rng = random.Random(seed)
    bases = [base_request(rng, spans, t0_ns) for _ in range(min(n, 20))]
    out = []
    for i in range(n):
        req = bases[i % len(bases)]
        for s in req.resource_spans[0].scope_spans[0].spans:
            s.trace_id = rng.randbytes(16)
            s.span_id = rng.randbytes(8)
        out.append(req.SerializeToString())
    return out
