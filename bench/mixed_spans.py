"""The realistic mix for the ingest-side benchmarks: what a Collector batching a fleet's traces sends.

Each export request of 1,000 spans holds ~254 traces. A trace is a gateway's CLIENT span and the server-side
spans under it in three conventions: vLLM's `llm_request`, the GenAI semantic conventions' `chat`, and
OpenInference's `ChatCompletion` (a few traces lack one of them: sampled out). The spans come from twelve
resources (three tenants' gateways in front of four replicas: the Collector groups each resource's spans), and
half of the server spans carry a quality score, as `eval.*` attributes or as a `gen_ai.evaluation.result` event.

Built with the OTLP protobuf messages the OTel SDK's encoder fills (opentelemetry-proto), field for field.
"""

from __future__ import annotations

import json
import random

from llm_spans import MODELS, any_value
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

TENANTS = ("acme", "globex", "initech")
REPLICAS = 4
SPANS_PER_TRACE = 4  # the gateway's and three conventions'
SHORT_TRACE_SHARE = 0.063  # traces missing one span: ~254 traces a request of 1,000 spans
EVALUATIONS = ("groundedness", "relevance", "toxicity")


def _attributes(target: object, values: dict[str, object]) -> None:
    target.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in values.items())  # type: ignore[attr-defined]


def _resources(request: ExportTraceServiceRequest) -> dict[tuple[str, str], ResourceSpans]:
    """The twelve resources: a tenant's gateway and the replica serving it, in the order first met."""
    out: dict[tuple[str, str], ResourceSpans] = {}
    for tenant in TENANTS:
        for replica in range(REPLICAS):
            rs = request.resource_spans.add()
            _attributes(
                rs.resource,
                {
                    "service.name": "vllm-llama8b",
                    "service.instance.id": f"vllm-llama8b-r{replica}",
                    "k8s.pod.name": f"vllm-llama8b-r{replica}-7f9c",
                    "tenant.id": tenant,
                    "service.version": "0.32.0",
                    "telemetry.sdk.name": "opentelemetry",
                    "telemetry.sdk.language": "python",
                },
            )
            out[tenant, str(replica)] = rs
    return out


def _span(rs: ResourceSpans, scope: str, trace_id: bytes, rng: random.Random) -> Span:
    # One scope a resource and library, as the SDK groups them.
    for ss in rs.scope_spans:
        if ss.scope.name == scope:
            break
    else:
        ss = rs.scope_spans.add()
        ss.scope.name = scope
        ss.scope.version = "1.0.0"
    s = ss.spans.add()
    s.trace_id = trace_id
    s.span_id = rng.randbytes(8)
    s.status.code = 1
    return s


def _score(s: Span, rng: random.Random, end_ns: int) -> None:
    """Half of the server spans are scored: as attributes or as an evaluation event."""
    if rng.random() >= 0.5:
        return
    name = rng.choice(EVALUATIONS)
    value = round(rng.random(), 3)
    if rng.random() < 0.5:
        _attributes(s, {f"eval.{name}": value, f"eval.{name}.label": "pass" if value >= 0.5 else "fail"})
        return
    event = s.events.add()
    event.name = "gen_ai.evaluation.result"
    event.time_unix_nano = end_ns
    _attributes(
        event,
        {
            "gen_ai.evaluation.name": name,
            "gen_ai.evaluation.score.value": value,
            "gen_ai.evaluation.score.label": "pass" if value >= 0.5 else "fail",
            "gen_ai.evaluation.explanation": "judged by the reference grader",
        },
    )


def _trace(resources: dict[tuple[str, str], ResourceSpans], rng: random.Random, start_ns: int, size: int) -> None:
    tenant, replica = rng.choice(TENANTS), str(rng.randrange(REPLICAS))
    rs = resources[tenant, replica]
    trace_id = rng.randbytes(16)
    model = rng.choice(MODELS)
    prompt, output = rng.randint(50, 16000), rng.randint(1, 2000)
    queue = rng.random() * 0.05
    ttft = 0.01 + queue + 0.04 + prompt / 40000 + rng.random() * 0.05
    decode = output * (0.012 + rng.random() * 0.01)
    e2e = ttft + decode
    end_ns = start_ns + int(e2e * 1e9) + 2_000_000
    text = f"q{rng.getrandbits(32):08x} " * rng.randint(4, 24)

    gateway = _span(rs, "llm-gateway", trace_id, rng)
    gateway.name, gateway.kind = "POST /v1/chat/completions", Span.SPAN_KIND_CLIENT
    gateway.start_time_unix_nano, gateway.end_time_unix_nano = start_ns, end_ns
    _attributes(
        gateway,
        {
            "http.request.method": "POST",
            "url.full": "http://vllm-llama8b:8000/v1/chat/completions",
            "server.address": "vllm-llama8b",
            "server.port": 8000,
            "http.response.status_code": 200,
            "tenant.id": tenant,
            "gen_ai.request.model": model,
        },
    )
    children = ["vllm", "genai", "openinference"]
    if size < SPANS_PER_TRACE:
        children.remove(rng.choice(children))
    for convention in children:
        s = _span(rs, {"vllm": "vllm.tracing.otel", "genai": "opentelemetry.instrumentation.openai_v2",
                       "openinference": "openinference.instrumentation.openai"}[convention], trace_id, rng)  # fmt: skip
        s.parent_span_id = gateway.span_id
        s.start_time_unix_nano, s.end_time_unix_nano = start_ns + 1_000_000, end_ns - 1_000_000
        if convention == "vllm":
            s.name, s.kind = "llm_request", Span.SPAN_KIND_SERVER
            _attributes(
                s,
                {
                    "gen_ai.request.id": f"chatcmpl-{rng.getrandbits(64):016x}",
                    "gen_ai.request.model": model,
                    "gen_ai.response.model": model,
                    "gen_ai.usage.prompt_tokens": prompt,
                    "gen_ai.usage.completion_tokens": output,
                    "gen_ai.usage.cached_tokens": rng.randint(0, prompt),
                    "gen_ai.latency.time_to_first_token": ttft,
                    "gen_ai.latency.e2e": e2e,
                    "gen_ai.latency.time_in_queue": queue,
                    "gen_ai.latency.time_in_model_prefill": ttft - queue - 0.01,
                    "gen_ai.latency.time_in_model_decode": decode,
                    "gen_ai.request.max_tokens": 2048,
                    "gen_ai.request.temperature": 0.7,
                    "gen_ai.request.top_p": 0.95,
                    "gen_ai.response.finish_reasons": ["stop"],
                },
            )
        elif convention == "genai":
            s.name, s.kind = f"chat {model}", Span.SPAN_KIND_CLIENT
            _attributes(
                s,
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": model,
                    "gen_ai.response.model": model,
                    "gen_ai.response.id": f"chatcmpl-{rng.getrandbits(64):016x}",
                    "gen_ai.usage.input_tokens": prompt,
                    "gen_ai.usage.output_tokens": output,
                    "gen_ai.request.max_tokens": 2048,
                    "gen_ai.request.temperature": 0.7,
                    "gen_ai.response.finish_reasons": ["stop"],
                    "server.address": "vllm-llama8b",
                    "server.port": 8000,
                },
            )
        else:
            s.name, s.kind = "ChatCompletion", Span.SPAN_KIND_INTERNAL
            _attributes(
                s,
                {
                    "openinference.span.kind": "LLM",
                    "llm.model_name": model,
                    "llm.provider": "openai",
                    "llm.token_count.prompt": prompt,
                    "llm.token_count.completion": output,
                    "llm.token_count.total": prompt + output,
                    "llm.invocation_parameters": json.dumps({"temperature": 0.7, "max_tokens": 2048}),
                    "input.value": text,
                    "input.mime_type": "text/plain",
                    "output.value": text[::-1],
                    "llm.input_messages.0.message.role": "user",
                    "llm.input_messages.0.message.content": text,
                    "llm.output_messages.0.message.role": "assistant",
                    "llm.output_messages.0.message.content": text[::-1],
                },
            )
        _score(s, rng, end_ns)


def mixed_request(rng: random.Random, spans: int, t0_ns: int) -> ExportTraceServiceRequest:
    """One export request of `spans` spans in the realistic mix."""
    request = ExportTraceServiceRequest()
    resources = _resources(request)
    made, i = 0, 0
    while made < spans:
        size = SPANS_PER_TRACE - 1 if rng.random() < SHORT_TRACE_SHARE else SPANS_PER_TRACE
        size = min(size, spans - made)
        if size < SPANS_PER_TRACE - 1:
            size = SPANS_PER_TRACE - 1  # the last trace may overshoot by a span or two: trimmed below
        _trace(resources, rng, t0_ns + i * 4_000_000, size)
        made += size
        i += 1
    _trim(request, made - spans)
    return request


def _trim(request: ExportTraceServiceRequest, extra: int) -> None:
    """Drops the last `extra` spans so a request holds exactly what was asked for."""
    for rs in reversed(request.resource_spans):
        for ss in reversed(rs.scope_spans):
            while extra > 0 and len(ss.spans) > 0:
                del ss.spans[-1]
                extra -= 1


def mixed_requests(n: int, spans: int, seed: int, t0_ns: int) -> list[bytes]:
    """`n` serialized requests of the mix, every trace and span id distinct (built from a few bases): each
    trace keeps one id across its scopes, and each child its gateway span as parent."""
    rng = random.Random(seed)
    bases = [mixed_request(rng, spans, t0_ns) for _ in range(min(n, 20))]
    out = []
    for i in range(n):
        req = bases[i % len(bases)]
        traces: dict[bytes, bytes] = {}
        ids: dict[bytes, bytes] = {}
        every = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        for s in every:
            s.trace_id = traces.setdefault(s.trace_id, rng.randbytes(16))
            fresh = rng.randbytes(8)
            ids[s.span_id], s.span_id = fresh, fresh
        for s in every:
            if s.parent_span_id:
                s.parent_span_id = ids[s.parent_span_id]
        out.append(req.SerializeToString())
    return out
