"""Golden tests: one realistic span per emitter, every canonical LLM column checked against docs/columns.md.

Expected values are worked out by hand from the spec and the emitters' documented attribute sets, so a
wrong NULL, an invented value or a unit slip in any column fails.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from builders import T0, kvs, span
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector.decode import Decoded, Encoding, decode_traces
from collector.normalize import NormalizeConfig, Plan, build_plan

LLM_KEYS = (
    "operation",
    "is_llm",
    "llm_role",
    "provider",
    "model",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "ttft_ms",
    "tpot_ms",
    "queue_ms",
    "prefill_ms",
    "decode_ms",
    "e2e_ms",
    "finish_reason",
    "cache_hit_ratio",
    "queue_depth",
    "replica_count",
    "batch_size",
    "prefill_tokens_in_batch",
    "quantization",
    "tenant_id",
    "replica_id",
    "deployment",
)

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
OTHER_TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SPAN_A = bytes.fromhex("00f067aa0ba902b7")
SPAN_B = bytes.fromhex("b7ad6b7169203331")
SPAN_C = bytes.fromhex("53995c3f42cd8ad8")

INSTANCE_ID = "6f2a9c4e-1d3b-4f8a-9e7c-2b5d8a1f0c3e"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"

# The golden cases pin normalization through each decoder's walk.
pytestmark = pytest.mark.usefixtures("each_decoder")


def export(spans: list[Span], resource: dict[str, Any], scope: str = "tests") -> bytes:
    """An OTLP export request with exactly the given resource (no service.name is added)."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(kvs(resource))
    ss = rs.scope_spans.add()
    ss.scope.name = scope
    ss.spans.extend(spans)
    return req.SerializeToString()


def decode(payload: bytes, plan: Plan | None = None) -> Decoded:
    out = decode_traces(payload, Encoding.PROTOBUF, plan)
    assert out.rejections.total == 0
    return out


def llm_rows(out: Decoded) -> list[dict[str, Any]]:
    assert out.spans is not None
    return out.spans.select(list(LLM_KEYS)).to_pylist()


def llm_row(payload: bytes, plan: Plan | None = None) -> dict[str, Any]:
    rows = llm_rows(decode(payload, plan))
    assert len(rows) == 1
    return rows[0]


def exact(expected: dict[str, Any]) -> dict[str, Any]:
    """The expected row with floats compared approximately and everything else exactly."""
    assert set(expected) == set(LLM_KEYS), set(LLM_KEYS) ^ set(expected)
    return {k: pytest.approx(v, rel=1e-9, abs=1e-9) if type(v) is float else v for k, v in expected.items()}


def add_event(s: Span, name: str, time_ns: int, attributes: dict[str, Any] | None = None) -> Span:
    event = s.events.add()
    event.name = name
    event.time_unix_nano = time_ns
    event.attributes.extend(kvs(attributes or {}))
    return s


def add_link(s: Span, trace_id: bytes, span_id: bytes) -> Span:
    link = s.links.add()
    link.trace_id = trace_id
    link.span_id = span_id
    return s


# --------------------------------------------------------------------------------------------------
# Golden fixtures, one per emitter
# --------------------------------------------------------------------------------------------------


def test_vllm_033_llm_request_server_span() -> None:
    """vLLM 0.33: seconds become ms, deprecated token names, no model, unknown_service is no deployment."""
    s = span(
        "llm_request",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_SERVER,
        duration_ns=2_413_500_000,  # wall clock; the e2e attribute wins over the duration
        attributes={
            "gen_ai.request.id": "chatcmpl-9f3b2c1d8e7a4b6c",
            "gen_ai.usage.prompt_tokens": 812,
            "gen_ai.usage.completion_tokens": 256,
            "gen_ai.latency.time_to_first_token": 0.183,
            "gen_ai.latency.e2e": 2.412,
            "gen_ai.latency.time_in_queue": 0.004,
            "gen_ai.latency.time_in_model_prefill": 0.171,
            "gen_ai.latency.time_in_model_decode": 2.226,
            "gen_ai.latency.time_in_model_inference": 2.397,
            "gen_ai.request.max_tokens": 256,
            "gen_ai.request.top_p": 0.95,
            "gen_ai.request.n": 1,
        },
    )
    resource = {
        "service.name": "unknown_service:python",
        "service.instance.id": INSTANCE_ID,
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": "1.45.2",
        "vllm.instrumenting_module_name": "vllm.llm_engine",
        "vllm.process_id": "4121",
    }
    row = llm_row(export([s], resource, scope="vllm.tracing.otel"))
    assert row == exact(
        {
            "operation": None,
            "is_llm": True,
            "llm_role": "server",
            "provider": None,
            "model": None,
            "input_tokens": 812,
            "output_tokens": 256,
            "cached_input_tokens": None,
            "ttft_ms": 183.0,
            "tpot_ms": 2226.0 / 255,
            "queue_ms": 4.0,
            "prefill_ms": 171.0,
            "decode_ms": 2226.0,
            "e2e_ms": 2412.0,
            "finish_reason": None,
            "cache_hit_ratio": None,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": None,
            "replica_id": INSTANCE_ID,
            "deployment": None,
        }
    )


def test_sglang_root_span_in_unified_mode() -> None:
    """SGLang 0.5: leading-space root span name, JSON-string finish reasons, cached_tokens."""
    s = span(
        " Req 1a2b3c4d",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_INTERNAL,
        duration_ns=1_352_000_000,
        attributes={
            "rid": "1a2b3c4d5e6f47a8b9c0d1e2f3a4b5c6",
            "module": "sglang::request",
            "gen_ai.request.id": "1a2b3c4d5e6f47a8b9c0d1e2f3a4b5c6",
            "gen_ai.usage.prompt_tokens": 640,
            "gen_ai.usage.completion_tokens": 128,
            "gen_ai.usage.cached_tokens": 512,
            "gen_ai.request.max_tokens": 512,
            "gen_ai.request.top_p": 0.9,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.response.model": "Qwen/Qwen2.5-7B-Instruct",
            "gen_ai.response.finish_reasons": '["stop"]',
            "gen_ai.latency.time_to_first_token": 0.095,
            "gen_ai.latency.e2e": 1.35,
            "gen_ai.latency.time_in_model_prefill": 0.08,
            "gen_ai.latency.time_in_model_decode": 1.2065,
            "gen_ai.latency.time_in_model_inference": 1.29,
        },
    )
    resource = {
        "service.name": "sglang",
        "service.instance.id": INSTANCE_ID,
        "host.name": "gpu-node-3",
        "telemetry.sdk.language": "python",
    }
    row = llm_row(export([s], resource, scope="sglang server"))
    assert row == exact(
        {
            "operation": None,
            "is_llm": True,
            "llm_role": "server",
            "provider": None,
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "input_tokens": 640,
            "output_tokens": 128,
            "cached_input_tokens": 512,
            "ttft_ms": 95.0,
            "tpot_ms": 1206.5 / 127,
            "queue_ms": None,
            "prefill_ms": 80.0,
            "decode_ms": 1206.5,
            "e2e_ms": 1350.0,
            "finish_reason": "stop",
            "cache_hit_ratio": 512 / 640,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": None,
            "replica_id": INSTANCE_ID,
            "deployment": "sglang",
        }
    )


def test_openinference_llm_span_with_first_token_event() -> None:
    """OpenInference: llm.* names, metadata JSON tenant, TTFT from the First Token Stream Event."""
    s = span(
        "ChatCompletion",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_INTERNAL,
        duration_ns=2_650_000_000,
        attributes={
            "openinference.span.kind": "LLM",
            "llm.system": "openai",
            "llm.model_name": LLAMA,
            "llm.invocation_parameters": f'{{"model":"{LLAMA}","temperature":0.2,"max_tokens":256,"stream":true}}',
            "llm.token_count.prompt": 812,
            "llm.token_count.completion": 256,
            "llm.token_count.total": 1068,
            "llm.token_count.prompt_details.cache_read": 768,
            "llm.finish_reason": "stop",
            "input.value": '{"messages":[{"role":"user","content":"Summarise the incident."}]}',
            "input.mime_type": "application/json",
            "output.value": "The incident was caused by ...",
            "output.mime_type": "text/plain",
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": "Summarise the incident.",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": "The incident was caused by ...",
            "session.id": "s-42",
            "user.id": "u-7",
            "metadata": '{"tenant":"acme"}',
            "tag.tags": ["prod"],
        },
    )
    add_event(s, "First Token Stream Event", T0 + 210_000_000)
    resource = {
        "service.name": "rag-api",
        "openinference.project.name": "default",
        "k8s.pod.name": "rag-api-7d9f5c6b8-x2k4q",
    }
    row = llm_row(export([s], resource, scope="openinference.instrumentation.openai"))
    assert row == exact(
        {
            "operation": "llm",
            "is_llm": True,
            "llm_role": "client",
            "provider": "openai",
            "model": LLAMA,
            "input_tokens": 812,
            "output_tokens": 256,
            "cached_input_tokens": 768,
            "ttft_ms": 210.0,
            "tpot_ms": (2650.0 - 210.0) / 255,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 2650.0,
            "finish_reason": "stop",
            "cache_hit_ratio": 768 / 812,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": "acme",
            "replica_id": "rag-api-7d9f5c6b8-x2k4q",
            "deployment": "rag-api",
        }
    )


TRACEAI_RESOURCE = {
    "project_name": "support-bot",
    "project_type": "observe",
    "project_version_name": "v3",
    "project_version_id": "0c4e2a1b-7f3d-4e5a-9b8c-1d2e3f4a5b6c",
    "eval_tags": "[]",
    "metadata": "{}",
}


def test_traceai_01_fi_span_kind_llm() -> None:
    """traceAI 0.1.x: fi.span.kind, llm.token_count.*, llm.provider; resource without service.name."""
    s = span(
        "ChatCompletion",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_INTERNAL,
        duration_ns=1_800_000_000,
        attributes={
            "fi.span.kind": "LLM",
            "llm.provider": "openai",
            "llm.system": "openai",
            "llm.model_name": "gpt-4o-mini-2024-07-18",
            "llm.invocation_parameters": '{"model":"gpt-4o-mini","temperature":0.0}',
            "llm.token_count.prompt": 420,
            "llm.token_count.completion": 96,
            "llm.token_count.total": 516,
            "input.value": "What is the refund policy?",
            "output.value": "Refunds are accepted within 30 days.",
            "eval.input": "What is the refund policy?",
            "raw.input": '{"messages":[{"role":"user","content":"What is the refund policy?"}]}',
            "raw.output": '{"choices":[{"message":{"content":"Refunds are accepted within 30 days."}}]}',
            "query": "What is the refund policy?",
            "response": "Refunds are accepted within 30 days.",
        },
    )
    out = decode(export([s], TRACEAI_RESOURCE, scope="fi_instrumentation"))
    [row] = llm_rows(out)
    assert row == exact(
        {
            "operation": "llm",
            "is_llm": True,
            "llm_role": "client",
            "provider": "openai",
            "model": "gpt-4o-mini-2024-07-18",
            "input_tokens": 420,
            "output_tokens": 96,
            "cached_input_tokens": None,
            "ttft_ms": None,
            "tpot_ms": None,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 1800.0,
            "finish_reason": None,
            "cache_hit_ratio": None,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": None,
            "replica_id": None,
            "deployment": None,
        }
    )
    assert out.scores.num_rows == 0  # `eval.input` is the evaluated text, not a score


def test_traceai_1x_gen_ai_span_kind_with_millisecond_server_timings() -> None:
    """traceAI 1.x: gen_ai.server.* in ms, explicit TPOT wins, tenant falls back to user.id."""
    s = span(
        "ChatCompletion",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_INTERNAL,
        duration_ns=2_900_000_000,
        attributes={
            "gen_ai.span.kind": "LLM",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
            "gen_ai.usage.input_tokens": 1500,
            "gen_ai.usage.output_tokens": 200,
            "gen_ai.usage.total_tokens": 1700,
            "gen_ai.usage.input_tokens.cache_read": 1024,
            "gen_ai.server.time_to_first_token": 320.0,
            "gen_ai.server.time_per_output_token": 12.5,
            "gen_ai.server.queue_time": 15.0,
            "input.value": "Draft a reply to ticket 8812.",
            "output.value": "Hi, thanks for reaching out ...",
            "session.id": "sess-77",
            "user.id": "u-314",
            "tag.tags": ["support"],
        },
    )
    resource = {**TRACEAI_RESOURCE, "semantic_convention": "fi"}
    row = llm_row(export([s], resource, scope="traceai.openai"))
    assert row == exact(
        {
            "operation": "llm",
            "is_llm": True,
            "llm_role": "client",
            "provider": "openai",
            "model": "gpt-4o-mini-2024-07-18",
            "input_tokens": 1500,
            "output_tokens": 200,
            "cached_input_tokens": 1024,
            "ttft_ms": 320.0,
            "tpot_ms": 12.5,  # explicit; derived would be (2900 - 320) / 199
            "queue_ms": 15.0,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 2900.0,
            "finish_reason": None,
            "cache_hit_ratio": 1024 / 1500,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": "u-314",
            "replica_id": None,
            "deployment": None,
        }
    )


def test_openllmetry_04_anthropic_span() -> None:
    """OpenLLMetry ≤ 0.4: capitalised gen_ai.system, llm.request.type, underscore cache name, association tenant."""
    s = span(
        "anthropic.chat",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_CLIENT,
        duration_ns=3_200_000_000,
        attributes={
            "gen_ai.system": "Anthropic",
            "llm.request.type": "chat",
            "gen_ai.request.model": "claude-3-5-sonnet-latest",
            "gen_ai.response.model": "claude-3-5-sonnet-20241022",
            "gen_ai.request.max_tokens": 1024,
            "gen_ai.usage.prompt_tokens": 2048,
            "gen_ai.usage.completion_tokens": 180,
            "llm.usage.total_tokens": 2228,
            "gen_ai.usage.cache_read_input_tokens": 1536,
            "gen_ai.usage.cache_creation_input_tokens": 0,
            "llm.is_streaming": False,
            "llm.response.finish_reason": "end_turn",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "Classify this ticket.",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "billing",
            "gen_ai.completion.0.finish_reason": "end_turn",
            "traceloop.workflow.name": "triage",
            "traceloop.entity.path": "triage.classify",
            "traceloop.association.properties.tenant_id": "globex",
        },
    )
    resource = {"service.name": "support-agent", "host.name": "ip-10-0-3-17"}
    row = llm_row(export([s], resource, scope="opentelemetry.instrumentation.anthropic"))
    assert row == exact(
        {
            "operation": "chat",
            "is_llm": True,
            "llm_role": "client",
            "provider": "anthropic",
            "model": "claude-3-5-sonnet-20241022",
            "input_tokens": 2048,
            "output_tokens": 180,
            "cached_input_tokens": 1536,
            "ttft_ms": None,
            "tpot_ms": None,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 3200.0,
            "finish_reason": "end_turn",
            "cache_hit_ratio": 0.75,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": "globex",
            "replica_id": "ip-10-0-3-17",
            "deployment": "support-agent",
        }
    )


def test_traceloop_openai_062_span() -> None:
    """Traceloop openai 0.62 (semconv_ai 0.5): upstream names, served model preferred, singular finish reason."""
    s = span(
        "openai.chat",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_CLIENT,
        duration_ns=2_500_000_000,
        attributes={
            "gen_ai.provider.name": "openai",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "llama-8b",
            "gen_ai.response.model": LLAMA,
            "gen_ai.response.id": "chatcmpl-4d1f8e2a",
            "gen_ai.usage.input_tokens": 812,
            "gen_ai.usage.output_tokens": 256,
            "gen_ai.usage.total_tokens": 1068,
            "gen_ai.usage.cache_read.input_tokens": 768,
            "gen_ai.usage.reasoning_tokens": 0,
            "gen_ai.response.finish_reason": "stop",
            "gen_ai.is_streaming": False,
            "gen_ai.user": "u-7",
            "server.address": "vllm.svc",
        },
    )
    resource = {
        "service.name": "chat-frontend",
        "service.instance.id": INSTANCE_ID,
        "k8s.pod.name": "chat-frontend-5b7d9-qx8zt",
    }
    row = llm_row(export([s], resource, scope="opentelemetry.instrumentation.openai.v1"))
    assert row == exact(
        {
            "operation": "chat",
            "is_llm": True,
            "llm_role": "client",
            "provider": "openai",
            "model": LLAMA,
            "input_tokens": 812,
            "output_tokens": 256,
            "cached_input_tokens": 768,
            "ttft_ms": None,
            "tpot_ms": None,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 2500.0,
            "finish_reason": "stop",
            "cache_hit_ratio": 768 / 812,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": None,  # gen_ai.user is not a tenant source
            "replica_id": "chat-frontend-5b7d9-qx8zt",  # the pod, not the process id
            "deployment": "chat-frontend",
        }
    )


def openllmetry_stream_span(ttft_attribute: dict[str, Any]) -> Span:
    """OpenLLMetry 0.62 streamed chat: no TTFT attribute of its own, one event per chunk (three here)."""
    s = span(
        "openai.chat",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_CLIENT,
        duration_ns=1_300_000_000,
        attributes={
            "gen_ai.provider.name": "openai",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "llama-8b",
            "gen_ai.response.model": LLAMA,
            "gen_ai.usage.input_tokens": 64,
            "gen_ai.usage.output_tokens": 3,
            "gen_ai.usage.cache_read.input_tokens": 0,
            "gen_ai.is_streaming": True,
            "gen_ai.response.finish_reasons": ["length"],
            **ttft_attribute,
        },
    )
    for offset_ns in (183_250_000, 741_000_000, 1_299_500_000):
        add_event(s, "gen_ai.content.completion.chunk", T0 + offset_ns)
    return s


def test_openllmetry_stream_span_ttft_is_its_first_completion_chunk_event() -> None:
    """OpenLLMetry streams: TTFT is when the first chunk reached the client, its event's time minus the start."""
    row = llm_row(export([openllmetry_stream_span({})], {"service.name": "chat-frontend"}))
    assert row == exact(
        {
            "operation": "chat",
            "is_llm": True,
            "llm_role": "client",
            "provider": "openai",
            "model": LLAMA,
            "input_tokens": 64,
            "output_tokens": 3,
            "cached_input_tokens": 0,
            "ttft_ms": 183.25,
            "tpot_ms": (1300.0 - 183.25) / 2,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 1300.0,
            "finish_reason": "length",
            "cache_hit_ratio": 0.0,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": None,
            "replica_id": None,
            "deployment": "chat-frontend",
        }
    )


def test_a_ttft_attribute_wins_over_the_first_completion_chunk_event() -> None:
    stream = openllmetry_stream_span({"gen_ai.response.time_to_first_chunk": 0.2125})
    row = llm_row(export([stream], {"service.name": "chat-frontend"}))
    assert (row["ttft_ms"], row["tpot_ms"]) == (212.5, pytest.approx((1300.0 - 212.5) / 2, rel=1e-12))


def test_openinference_embedding_span_takes_its_model_from_embedding_model_name() -> None:
    """OpenInference embeddings name no llm.model_name: the model is in embedding.model_name."""
    s = span(
        "CreateEmbeddingResponse",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_INTERNAL,
        duration_ns=42_000_000,
        attributes={
            "openinference.span.kind": "EMBEDDING",
            "llm.system": "openai",
            "embedding.model_name": "BAAI/bge-small-en-v1.5",
            "llm.invocation_parameters": '{"model": "BAAI/bge-small-en-v1.5", "encoding_format": "base64"}',
            "llm.token_count.prompt": 9,
            "llm.token_count.total": 9,
            "embedding.embeddings.0.embedding.text": "Refunds are accepted within 30 days.",
            "input.value": '{"input": "Refunds are accepted within 30 days."}',
            "input.mime_type": "application/json",
        },
    )
    row = llm_row(export([s], {"service.name": "rag-api"}, scope="openinference.instrumentation.openai"))
    assert row == exact(
        {
            "operation": "embedding",
            "is_llm": True,
            "llm_role": "client",
            "provider": "openai",
            "model": "BAAI/bge-small-en-v1.5",
            "input_tokens": 9,
            "output_tokens": None,
            "cached_input_tokens": None,
            "ttft_ms": None,
            "tpot_ms": None,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 42.0,
            "finish_reason": None,
            "cache_hit_ratio": None,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": None,
            "replica_id": None,
            "deployment": "rag-api",
        }
    )


def test_a_traceai_0_1_embedding_span_takes_its_model_from_embedding_model_name() -> None:
    attributes = {"gen_ai.span.kind": "EMBEDDING", "embedding.model_name": "text-embedding-3-small",
                  "gen_ai.usage.input_tokens": 7}  # fmt: skip
    row = llm_row(export([span("Embedding", kind=Span.SPAN_KIND_INTERNAL, attributes=attributes)], TRACEAI_RESOURCE))
    assert (row["operation"], row["is_llm"], row["model"]) == ("embedding", True, "text-embedding-3-small")


def test_genai_semconv_current_client_span() -> None:
    """GenAI semconv: TTFT from time_to_first_chunk (s), TPOT from (duration − TTFT) / (out − 1)."""
    s = span(
        f"chat {LLAMA}",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_CLIENT,
        duration_ns=2_760_000_000,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "server.address": "vllm.svc",
            "server.port": 8000,
            "gen_ai.request.model": LLAMA,
            "gen_ai.request.temperature": 0.2,
            "gen_ai.request.max_tokens": 256,
            "gen_ai.request.stream": True,
            "gen_ai.response.time_to_first_chunk": 0.21,
            "gen_ai.response.id": "chatcmpl-123",
            "gen_ai.response.model": LLAMA,
            "gen_ai.response.finish_reasons": ["stop"],
            "gen_ai.usage.input_tokens": 812,
            "gen_ai.usage.cache_read.input_tokens": 768,
            "gen_ai.usage.output_tokens": 256,
            "gen_ai.conversation.id": "conv_5j66UpCpwteGg4YSxUnt7lPY",
        },
    )
    resource = {"service.name": "rag-api", "service.namespace": "acme-prod", "service.instance.id": INSTANCE_ID}
    row = llm_row(export([s], resource, scope="opentelemetry.instrumentation.openai_v2"))
    assert row == exact(
        {
            "operation": "chat",
            "is_llm": True,
            "llm_role": "client",
            "provider": "openai",
            "model": LLAMA,
            "input_tokens": 812,
            "output_tokens": 256,
            "cached_input_tokens": 768,
            "ttft_ms": 210.0,
            "tpot_ms": (2760.0 - 210.0) / 255,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 2760.0,
            "finish_reason": "stop",
            "cache_hit_ratio": 768 / 812,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": "acme-prod",
            "replica_id": INSTANCE_ID,
            "deployment": "rag-api",
        }
    )


def test_genai_semconv_deprecated_names() -> None:
    """Pre-1.27 semconv: gen_ai.system, prompt/completion tokens; LLM by token usage (no operation)."""
    s = span(
        "chat gpt-4o",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_CLIENT,
        duration_ns=4_000_000_000,
        attributes={
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.response.model": "gpt-4o-2024-08-06",
            "gen_ai.request.max_tokens": 300,
            "gen_ai.usage.prompt_tokens": 1200,
            "gen_ai.usage.completion_tokens": 300,
            "gen_ai.response.finish_reasons": ["length"],
            "tenant.id": "initech",
        },
    )
    resource = {"service.name": "billing-api", "host.name": "billing-7f9c"}
    row = llm_row(export([s], resource, scope="opentelemetry.instrumentation.openai"))
    assert row == exact(
        {
            "operation": None,
            "is_llm": True,
            "llm_role": "client",
            "provider": "openai",
            "model": "gpt-4o-2024-08-06",
            "input_tokens": 1200,
            "output_tokens": 300,
            "cached_input_tokens": None,
            "ttft_ms": None,
            "tpot_ms": None,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 4000.0,
            "finish_reason": "length",
            "cache_hit_ratio": None,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": "initech",
            "replica_id": "billing-7f9c",
            "deployment": "billing-api",
        }
    )


def test_litellm_proxy_request_span() -> None:
    """LiteLLM proxy: litellm_request with team metadata as tenant."""
    s = span(
        "litellm_request",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_INTERNAL,
        duration_ns=1_900_000_000,
        attributes={
            "gen_ai.system": "hosted_vllm",
            "llm.request.type": "chat",
            "gen_ai.request.model": f"hosted_vllm/{LLAMA}",
            "gen_ai.response.model": LLAMA,
            "gen_ai.request.id": "chatcmpl-0b1c2d3e",
            "gen_ai.usage.input_tokens": 900,
            "gen_ai.usage.output_tokens": 150,
            "gen_ai.usage.total_tokens": 1050,
            "gen_ai.response.finish_reasons": ["stop"],
            "llm.is_streaming": "False",
            "llm.user": "",
            "metadata.user_api_key_team_id": "team-acme",
            "metadata.user_api_key_team_alias": "acme",
            "metadata.user_api_key_org_id": "org-1",
            "metadata.user_api_key_user_id": "u-9",
            "metadata.user_api_key_hash": "88dc28d0f030c55ed4ab77ed8faf098196cb1c05df778539800c9f1243fe6b4b",
        },
    )
    resource = {"service.name": "litellm", "k8s.pod.name": "litellm-proxy-5c8d7-abcde"}
    row = llm_row(export([s], resource, scope="litellm"))
    assert row == exact(
        {
            "operation": "chat",
            "is_llm": True,
            "llm_role": "client",
            "provider": "hosted_vllm",
            "model": LLAMA,
            "input_tokens": 900,
            "output_tokens": 150,
            "cached_input_tokens": None,
            "ttft_ms": None,
            "tpot_ms": None,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": None,
            "e2e_ms": 1900.0,
            "finish_reason": "stop",
            "cache_hit_ratio": None,
            "queue_depth": None,
            "replica_count": None,
            "batch_size": None,
            "prefill_tokens_in_batch": None,
            "quantization": None,
            "tenant_id": "team-acme",
            "replica_id": "litellm-proxy-5c8d7-abcde",
            "deployment": "litellm",
        }
    )


# --------------------------------------------------------------------------------------------------
# Targeted rules
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributes", "operation"),
    [
        ({"openinference.span.kind": "TOOL", "tool.name": "search_docs"}, "tool"),
        # An operation decides: a chain that reports aggregated token usage is still not a request.
        ({"openinference.span.kind": "CHAIN", "llm.token_count.prompt": 812}, "chain"),
        ({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather"}, "execute_tool"),
        ({"traceloop.span.kind": "workflow", "traceloop.workflow.name": "triage"}, "workflow"),
        ({"http.request.method": "GET", "url.path": "/health"}, None),
    ],
)
def test_non_llm_span_has_no_role_and_no_e2e(attributes: dict[str, Any], operation: str | None) -> None:
    s = span("search_docs", kind=Span.SPAN_KIND_INTERNAL, duration_ns=150_000_000, attributes=attributes)
    row = llm_row(export([s], {"service.name": "rag-api"}))
    assert row["operation"] == operation
    assert row["is_llm"] is False
    assert row["llm_role"] is None
    assert row["e2e_ms"] is None
    assert row["tpot_ms"] is None


@pytest.mark.parametrize(
    ("name", "is_llm"),
    [
        ("llm_request", True),
        (" Req 1a2b3c4d", True),
        ("prefill Req 1a2b3c4d", True),
        ("decode Req 1a2b3c4d", True),
        ("Scheduler [TP 0] (host:abcd1234 | pid:123)", False),
        ("Overall Loading", False),
    ],
)
def test_engine_spans_are_recognised_by_name(name: str, is_llm: bool) -> None:
    row = llm_row(export([span(name, duration_ns=500_000_000)], {"service.name": "engine"}))
    assert row["is_llm"] is is_llm
    assert row["llm_role"] == ("server" if is_llm else None)
    assert row["e2e_ms"] == (500.0 if is_llm else None)


def test_llm_span_of_kind_server_has_server_role() -> None:
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5}
    row = llm_row(export([span("chat my-model", kind=Span.SPAN_KIND_SERVER, attributes=attrs)], {}))
    assert (row["is_llm"], row["llm_role"]) == (True, "server")


@pytest.mark.parametrize(
    "attributes",
    [
        # decode time known
        {
            "gen_ai.usage.prompt_tokens": 50,
            "gen_ai.usage.completion_tokens": 1,
            "gen_ai.latency.time_in_model_decode": 0.0,
        },
        # e2e and TTFT known
        {
            "gen_ai.usage.prompt_tokens": 50,
            "gen_ai.usage.completion_tokens": 1,
            "gen_ai.latency.e2e": 0.3,
            "gen_ai.latency.time_to_first_token": 0.25,
        },
    ],
)
def test_single_output_token_has_no_tpot(attributes: dict[str, Any]) -> None:
    row = llm_row(export([span("llm_request", attributes=attributes)], {}))
    assert row["output_tokens"] == 1
    assert row["tpot_ms"] is None


def test_tpot_prefers_decode_time_over_e2e_minus_ttft() -> None:
    attrs = {
        "gen_ai.usage.completion_tokens": 11,
        "gen_ai.latency.time_in_model_decode": 0.5,
        "gen_ai.latency.e2e": 1.0,
        "gen_ai.latency.time_to_first_token": 0.2,
    }
    row = llm_row(export([span("llm_request", attributes=attrs)], {}))
    assert row["tpot_ms"] == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("attributes", "ratio"),
    [
        ({"gen_ai.usage.input_tokens": 1000, "gen_ai.usage.cache_read.input_tokens": 250}, 0.25),
        # Anthropic-style accounting can report more cached than input tokens: clamped to 1.
        ({"gen_ai.usage.input_tokens": 812, "gen_ai.usage.cache_read.input_tokens": 900}, 1.0),
        ({"gen_ai.usage.input_tokens": 0, "gen_ai.usage.cache_read.input_tokens": 0}, None),
        ({"gen_ai.usage.input_tokens": 1000}, None),
        ({"gen_ai.usage.cache_read.input_tokens": 250}, None),
        # An explicit ratio wins over the derived 0.25 ...
        (
            {
                "gen_ai.usage.input_tokens": 1000,
                "gen_ai.usage.cache_read.input_tokens": 250,
                "llm.vllm.cache_hit_ratio": 0.42,
            },
            0.42,
        ),
        # ... is clamped to 0..1 ...
        ({"llm.vllm.cache_hit_ratio": 1.7}, 1.0),
        ({"llm.vllm.cache_hit_ratio": -0.2}, 0.0),
        # ... and needs no token counts.
        ({"llm.vllm.cache_hit_ratio": 0.5}, 0.5),
    ],
)
def test_cache_hit_ratio(attributes: dict[str, Any], ratio: float | None) -> None:
    s = span("chat m", kind=Span.SPAN_KIND_CLIENT, attributes={"gen_ai.operation.name": "chat", **attributes})
    row = llm_row(export([s], {}))
    assert row["cache_hit_ratio"] == (None if ratio is None else pytest.approx(ratio))


def test_tenant_is_null_when_no_tenant_source_exists() -> None:
    """Sessions, end users of the provider API, projects and resource metadata never become a tenant."""
    attrs = {
        "openinference.span.kind": "LLM",
        "llm.token_count.prompt": 10,
        "session.id": "s-42",
        "gen_ai.user": "u-7",
        "llm.user": "u-7",
        "gen_ai.conversation.id": "conv-1",
        "metadata": '{"region":"eu"}',
        "traceloop.association.properties.user_id": "u-7",
    }
    resource = {
        "service.name": "rag-api",
        "openinference.project.name": "default",
        "project_name": "support-bot",
        "metadata": '{"tenant":"acme"}',
        "k8s.namespace.name": "prod",
    }
    row = llm_row(export([span("ChatCompletion", kind=Span.SPAN_KIND_INTERNAL, attributes=attrs)], resource))
    assert row["tenant_id"] is None


@pytest.mark.parametrize(
    ("resource", "attributes", "tenant"),
    [
        ({"tenant.id": "res"}, {"tenant.id": "span", "user.id": "u"}, "res"),
        ({}, {"tenant.id": "span", "metadata.user_api_key_team_id": "team"}, "span"),
        ({"tenant_id": "res_"}, {"tenant_id": "span_"}, "res_"),
        ({}, {"metadata.user_api_key_org_id": "org", "metadata": '{"tenant":"m"}'}, "org"),
        ({}, {"traceloop.association.properties.tenant": "tl", "metadata": '{"tenant_id":"m"}'}, "tl"),
        ({}, {"metadata": '{"tenant_id":"mid","tenant":"m"}'}, "mid"),
        ({"service.namespace": "ns"}, {"user.id": "u"}, "ns"),
        ({}, {"user.id": "u"}, "u"),
        ({}, {"metadata": "not json", "user.id": "u"}, "u"),
    ],
)
def test_tenant_priority(resource: dict[str, Any], attributes: dict[str, Any], tenant: str) -> None:
    attrs = {"gen_ai.operation.name": "chat", **attributes}
    row = llm_row(export([span("chat m", kind=Span.SPAN_KIND_CLIENT, attributes=attrs)], resource))
    assert row["tenant_id"] == tenant


@pytest.mark.parametrize(
    ("resource", "attributes", "replica"),
    [
        # The pod name wins over the SDK's random per-process id: operators know the pod.
        ({"service.instance.id": "inst", "k8s.pod.name": "pod", "host.name": "host"}, {"replica_id": "r"}, "pod"),
        ({"service.instance.id": "inst", "host.name": "host", "vllm.process_id": "4121"}, {}, "inst"),
        ({"k8s.pod.name": "pod", "host.name": "host", "vllm.process_id": "4121"}, {}, "pod"),
        ({"host.name": "host", "vllm.process_id": "4121"}, {"replica_id": "r"}, "host"),
        ({"vllm.process_id": "4121"}, {"replica_id": "r"}, "r"),
        ({"vllm.process_id": "4121"}, {}, "4121"),
        ({}, {}, None),
    ],
)
def test_replica_priority(resource: dict[str, Any], attributes: dict[str, Any], replica: str | None) -> None:
    row = llm_row(export([span("llm_request", attributes=attributes)], resource))
    assert row["replica_id"] == replica


@pytest.mark.parametrize(
    ("resource", "attributes", "deployment"),
    [
        ({"service.name": "vllm-llama8b"}, {"deployment": "LlamaDeployment"}, "vllm-llama8b"),
        ({"service.name": "unknown_service:python"}, {"deployment": "LlamaDeployment"}, "LlamaDeployment"),
        ({"service.name": "unknown_service"}, {}, None),
        ({}, {"deployment": "LlamaDeployment"}, "LlamaDeployment"),
    ],
)
def test_deployment_source(resource: dict[str, Any], attributes: dict[str, Any], deployment: str | None) -> None:
    row = llm_row(export([span("llm_request", attributes=attributes)], resource))
    assert row["deployment"] == deployment


def test_ray_serve_replica_span_is_not_an_llm_request_but_names_deployment_and_replica() -> None:
    attrs = {
        "request_id": "7c1e2f3a-0b4d-4e5f-8a9b-1c2d3e4f5a6b",
        "deployment": "LlamaDeployment",
        "app": "llm-app",
        "call_method": "__call__",
        "replica_id": "x8k2m1qp",
        "is_streaming": True,
        "resource.name": "replica_handle_request",
    }
    s = span("replica_handle_request LlamaDeployment __call__", kind=Span.SPAN_KIND_SERVER, attributes=attrs)
    row = llm_row(export([s], {"service.name": "unknown_service", "telemetry.sdk.language": "python"}))
    assert row == exact(
        {
            **dict.fromkeys(LLM_KEYS),
            "is_llm": False,
            "replica_id": "x8k2m1qp",
            "deployment": "LlamaDeployment",
        }
    )


@pytest.mark.parametrize(
    ("attributes", "column", "expected"),
    [
        # A number sent as a numeric string is a number (OTEL_RESOURCE_ATTRIBUTES only has strings).
        ({"gen_ai.usage.input_tokens": "812", "gen_ai.usage.prompt_tokens": 800}, "input_tokens", 812),
        ({"gen_ai.latency.time_to_first_token": "0.183"}, "ttft_ms", 183.0),
        ({"cluster.queue_depth": "9", "vllm.num_requests_waiting": 4}, "queue_depth", 9),
        # A string that is not a number is skipped; the next source is used, or the column stays NULL.
        ({"gen_ai.usage.input_tokens": "n/a", "gen_ai.usage.prompt_tokens": 800}, "input_tokens", 800),
        (
            {"gen_ai.latency.time_to_first_token": "fast", "gen_ai.response.time_to_first_chunk": 0.2},
            "ttft_ms",
            200.0,
        ),
        ({"cluster.queue_depth": "unknown", "vllm.num_requests_waiting": 4}, "queue_depth", 4),
        ({"gen_ai.usage.input_tokens": "n/a"}, "input_tokens", None),
    ],
)
def test_string_where_a_number_belongs_is_skipped(attributes: dict[str, Any], column: str, expected: Any) -> None:
    row = llm_row(export([span("llm_request", duration_ns=2_000_000_000, attributes=attributes)], {}))
    assert row[column] == (pytest.approx(expected) if isinstance(expected, float) else expected)


def test_numeric_strings_from_otel_resource_attributes_are_numbers() -> None:
    """OTEL_RESOURCE_ATTRIBUTES values always arrive as strings; numeric ones fill numeric columns."""
    resource = {"service.name": "vllm-llama8b", "cluster.queue_depth": "7", "cluster.replica_count": "3"}
    row = llm_row(export([span("llm_request", attributes={"vllm.num_requests_waiting": 2})], resource))
    assert (row["queue_depth"], row["replica_count"]) == (7, 3)


def test_cluster_and_batch_columns_from_resource_and_span() -> None:
    """Resource attributes (set by the process or a collector) fill queue depth, replicas and quantization."""
    resource = {
        "service.name": "vllm-llama8b",
        "tenant.id": "acme",
        "k8s.pod.name": "vllm-llama8b-0",
        "cluster.queue_depth": 7,
        "cluster.replica_count": 3,
        "llm.vllm.quantization": "FP8",
    }
    attrs = {
        "gen_ai.usage.prompt_tokens": 100,
        "gen_ai.usage.completion_tokens": 21,
        "gen_ai.latency.time_in_model_decode": 0.4,
        "gen_ai.latency.e2e": 0.6,
        "llm.vllm.batch_size": 32,
        "llm.vllm.prefill_in_batch": 2048,
    }
    row = llm_row(export([span("llm_request", attributes=attrs)], resource, scope="vllm.tracing.otel"))
    assert row == exact(
        {
            "operation": None,
            "is_llm": True,
            "llm_role": "server",
            "provider": None,
            "model": None,
            "input_tokens": 100,
            "output_tokens": 21,
            "cached_input_tokens": None,
            "ttft_ms": None,
            "tpot_ms": 400.0 / 20,
            "queue_ms": None,
            "prefill_ms": None,
            "decode_ms": 400.0,
            "e2e_ms": 600.0,
            "finish_reason": None,
            "cache_hit_ratio": None,
            "queue_depth": 7,
            "replica_count": 3,
            "batch_size": 32,
            "prefill_tokens_in_batch": 2048,
            "quantization": "fp8",
            "tenant_id": "acme",
            "replica_id": "vllm-llama8b-0",
            "deployment": "vllm-llama8b",
        }
    )


@pytest.mark.parametrize(
    ("attributes", "queue_depth", "replica_count", "quantization"),
    [
        ({"cluster.queue_depth": 2, "cluster.replica_count": 5, "llm.vllm.quantization": "INT4"}, 2, 5, "int4"),
        ({"vllm.num_requests_waiting": 11, "quantization": "awq"}, 7, 3, "fp8"),
    ],
)
def test_span_cluster_attributes_beat_resource(
    attributes: dict[str, Any], queue_depth: int, replica_count: int, quantization: str
) -> None:
    resource = {"cluster.queue_depth": 7, "cluster.replica_count": 3, "llm.vllm.quantization": "fp8"}
    row = llm_row(export([span("llm_request", attributes=attributes)], resource))
    assert (row["queue_depth"], row["replica_count"], row["quantization"]) == (queue_depth, replica_count, quantization)


def test_quantization_falls_back_to_plain_keys() -> None:
    row = llm_row(export([span("llm_request", attributes={})], {"quantization": "GPTQ"}))
    assert row["quantization"] == "gptq"
    row = llm_row(export([span("llm_request", attributes={"quantization": "AWQ"})], {"quantization": "GPTQ"}))
    assert row["quantization"] == "awq"


def test_custom_normalize_config_changes_the_tenant_source() -> None:
    plan = build_plan(NormalizeConfig(tenant_keys=("resource:team",)))
    attrs = {"gen_ai.operation.name": "chat", "tenant.id": "acme"}
    payload = export([span("chat m", kind=Span.SPAN_KIND_CLIENT, attributes=attrs)], {"team": "payments"})
    assert llm_row(payload, plan)["tenant_id"] == "payments"
    assert llm_row(payload)["tenant_id"] == "acme"
    # The configured list replaces the defaults: without `team`, span `tenant.id` is not consulted.
    payload = export([span("chat m", kind=Span.SPAN_KIND_CLIENT, attributes=attrs)], {})
    assert llm_row(payload, plan)["tenant_id"] is None


def test_custom_normalize_config_reads_a_json_field() -> None:
    plan = build_plan(NormalizeConfig(tenant_keys=("span:langfuse.trace.metadata#org",)))
    attrs = {"gen_ai.operation.name": "chat", "langfuse.trace.metadata": '{"org":"initech"}', "user.id": "u"}
    assert llm_row(export([span("chat m", attributes=attrs)], {}), plan)["tenant_id"] == "initech"


def test_model_prefers_served_over_requested() -> None:
    cases = [
        ({"gen_ai.request.model": "req", "llm.request.model_name": "oi-req"}, "req"),
        ({"llm.request.model_name": "oi-req", "langfuse.observation.model.name": "lf"}, "lf"),
        ({"llm.model_name": "oi", "llm.response.model_name": "oi-resp"}, "oi-resp"),
        ({"gen_ai.response.model": "served", "llm.response.model_name": "oi-resp"}, "served"),
        ({"llm.request.model_name": "oi-req"}, "oi-req"),
        ({"embedding.model_name": "emb", "gen_ai.request.model": "req"}, "emb"),
        ({"llm.model_name": "oi", "embedding.model_name": "emb"}, "oi"),
    ]
    for attrs, model in cases:
        row = llm_row(export([span("chat m", attributes={"gen_ai.operation.name": "chat", **attrs})], {}))
        assert row["model"] == model, attrs


def test_finish_reason_takes_the_first_array_entry_and_falls_through() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"gen_ai.response.finish_reasons": ["length", "stop"]}, "length"),
        ({"gen_ai.response.finish_reasons": '["tool_calls","stop"]'}, "tool_calls"),
        ({"llm.finish_reason": "stop", "gen_ai.response.finish_reason": "length"}, "stop"),
        ({"gen_ai.response.finish_reason": "length", "llm.response.finish_reason": "stop"}, "length"),
        ({"llm.response.finish_reason": "end_turn"}, "end_turn"),
        # An object (or an array of them) names its reason under `type` or, failing that, `finish_reason`.
        ({"gen_ai.response.finish_reasons": '{"type":"length","finish_reason":"stop"}'}, "length"),
        ({"gen_ai.response.finish_reasons": '[{"type":null,"finish_reason":"tool_calls"}]'}, "tool_calls"),
    ]
    for attrs, reason in cases:
        row = llm_row(export([span("chat m", attributes={"gen_ai.operation.name": "chat", **attrs})], {}))
        assert row["finish_reason"] == reason, attrs


def test_operation_source_priority_and_lower_case() -> None:
    cases: list[tuple[dict[str, Any], str, bool]] = [
        ({"gen_ai.operation.name": "Chat", "openinference.span.kind": "TOOL"}, "chat", True),
        ({"openinference.span.kind": "EMBEDDING", "gen_ai.span.kind": "LLM"}, "embedding", True),
        ({"gen_ai.span.kind": "AGENT", "fi.span.kind": "LLM"}, "agent", False),
        ({"fi.span.kind": "RETRIEVER", "traceloop.span.kind": "task"}, "retriever", False),
        ({"traceloop.span.kind": "task", "llm.request.type": "chat"}, "task", False),
        ({"llm.request.type": "completion"}, "completion", True),
        ({"gen_ai.operation.name": "text_completion"}, "text_completion", True),
        ({"gen_ai.operation.name": "generate_content"}, "generate_content", True),
        ({"gen_ai.operation.name": "embeddings"}, "embeddings", True),
        ({"gen_ai.operation.name": "invoke_agent", "gen_ai.usage.input_tokens": 10}, "invoke_agent", False),
    ]
    for attrs, operation, is_llm in cases:
        row = llm_row(export([span("op", kind=Span.SPAN_KIND_INTERNAL, attributes=attrs)], {}))
        assert (row["operation"], row["is_llm"]) == (operation, is_llm), attrs


# --------------------------------------------------------------------------------------------------
# Quality scores
# --------------------------------------------------------------------------------------------------


def score_rows(out: Decoded) -> list[dict[str, Any]]:
    table = out.scores.set_column(
        out.scores.schema.get_field_index("observed_at"),
        "observed_at",
        out.scores.column("observed_at").cast(pa.int64()),
    )
    return sorted(table.to_pylist(), key=lambda r: (r["span_id"], r["name"]))


def score(
    name: str,
    value: float | None,
    *,
    trace_id: bytes = TRACE,
    span_id: bytes = SPAN_A,
    label: str | None = None,
    explanation: str | None = None,
    source: str = "attribute",
    observed_at: int,
) -> dict[str, Any]:
    return {
        "trace_id": trace_id.hex(),
        "span_id": span_id.hex(),
        "name": name,
        "score": value,
        "label": label,
        "explanation": explanation,
        "source": source,
        "observed_at": observed_at,
    }


def test_traceai_evaluation_attributes_with_target_span() -> None:
    """traceAI gen_ai.evaluation.* on an evaluator span judge the span named by target_span_id."""
    llm = span("ChatCompletion", trace_id=TRACE, span_id=SPAN_A, kind=Span.SPAN_KIND_INTERNAL)
    evaluator = span(
        "groundedness_eval",
        trace_id=TRACE,
        span_id=SPAN_B,
        parent_span_id=SPAN_A,
        kind=Span.SPAN_KIND_INTERNAL,
        start=T0 + 2_000_000_000,
        duration_ns=400_000_000,
        attributes={
            "gen_ai.span.kind": "EVALUATOR",
            "gen_ai.evaluation.name": "groundedness",
            "gen_ai.evaluation.score.value": 0.82,
            "gen_ai.evaluation.score.label": "grounded",
            "gen_ai.evaluation.explanation": "All claims are supported by the retrieved context.",
            "gen_ai.evaluation.target_span_id": SPAN_A.hex(),
        },
    )
    out = decode(export([llm, evaluator], TRACEAI_RESOURCE))
    assert score_rows(out) == [
        score(
            "groundedness",
            0.82,
            span_id=SPAN_A,
            label="grounded",
            explanation="All claims are supported by the retrieved context.",
            observed_at=T0 + 2_400_000_000,
        )
    ]


def test_traceai_evaluation_attributes_without_target_judge_their_own_span() -> None:
    s = span(
        "ChatCompletion",
        trace_id=TRACE,
        span_id=SPAN_A,
        attributes={
            "gen_ai.span.kind": "LLM",
            "gen_ai.evaluation.name": "is_json",
            "gen_ai.evaluation.score.value": True,
        },
    )
    assert score_rows(decode(export([s], TRACEAI_RESOURCE))) == [score("is_json", 1.0, observed_at=T0 + 2_000_000_000)]


def test_openinference_inline_evaluations_and_annotations() -> None:
    s = span(
        "ChatCompletion",
        trace_id=TRACE,
        span_id=SPAN_A,
        kind=Span.SPAN_KIND_INTERNAL,
        duration_ns=1_000_000_000,
        attributes={
            "openinference.span.kind": "LLM",
            "evaluations.0.evaluation.name": "hallucination",
            "evaluations.0.evaluation.score": 0.0,
            "evaluations.0.evaluation.label": "factual",
            "evaluations.0.evaluation.explanation": "Matches the reference.",
            "evaluations.1.evaluation.name": "relevance",
            "evaluations.1.evaluation.score": 0.9,
            "annotations.0.annotation.name": "user_feedback",
            "annotations.0.annotation.score": 1,
            "annotations.0.annotation.label": "thumbs_up",
            "annotations.0.annotation.annotator_kind": "HUMAN",
            # Nameless: no score (a score is known by its name).
            "evaluations.2.evaluation.name": "",
            "evaluations.2.evaluation.score": 0.5,
        },
    )
    end = T0 + 1_000_000_000
    assert score_rows(decode(export([s], {"service.name": "rag-api"}))) == [
        score("hallucination", 0.0, label="factual", explanation="Matches the reference.", observed_at=end),
        score("relevance", 0.9, observed_at=end),
        score("user_feedback", 1.0, label="thumbs_up", observed_at=end),
    ]


def test_plain_eval_attributes() -> None:
    s = span(
        "chat m",
        trace_id=TRACE,
        span_id=SPAN_A,
        duration_ns=500_000_000,
        attributes={
            "gen_ai.operation.name": "chat",
            "eval.json_adherence": 1.0,
            "eval.toxicity.score": 0.03,
            "eval.toxicity.label": "non_toxic",
        },
    )
    end = T0 + 500_000_000
    assert score_rows(decode(export([s], {}))) == [
        score("json_adherence", 1.0, observed_at=end),
        score("toxicity", 0.03, label="non_toxic", observed_at=end),
    ]


def test_evaluation_result_span_event() -> None:
    """A gen_ai.evaluation.result span event is a score of its span, observed at the event time."""
    s = span(f"chat {LLAMA}", trace_id=TRACE, span_id=SPAN_A, kind=Span.SPAN_KIND_CLIENT, duration_ns=2_000_000_000)
    add_event(
        s,
        "gen_ai.evaluation.result",
        T0 + 2_500_000_000,
        {
            "gen_ai.evaluation.name": "Relevance",
            "gen_ai.evaluation.score.value": 4.0,
            "gen_ai.evaluation.score.label": "relevant",
            "gen_ai.evaluation.explanation": "Answers the question asked.",
            "gen_ai.response.id": "chatcmpl-123",
        },
    )
    add_event(s, "gen_ai.content.completion", T0 + 1_000_000_000, {"gen_ai.completion": "..."})
    assert score_rows(decode(export([s], {}))) == [
        score(
            "Relevance",
            4.0,
            label="relevant",
            explanation="Answers the question asked.",
            source="event",
            observed_at=T0 + 2_500_000_000,
        )
    ]


def test_openinference_evaluator_span_with_one_link_scores_the_linked_span() -> None:
    """Post-hoc feedback: an EVALUATOR carrier span with exactly one link judges the linked span."""
    carrier = span(
        "correctness",
        trace_id=OTHER_TRACE,
        span_id=SPAN_C,
        kind=Span.SPAN_KIND_INTERNAL,
        start=T0 + 60_000_000_000,
        duration_ns=1_000_000,
        attributes={
            "openinference.span.kind": "EVALUATOR",
            "annotations.0.annotation.name": "correctness",
            "annotations.0.annotation.score": 1.0,
            "annotations.0.annotation.label": "correct",
            "annotations.0.annotation.annotator_kind": "LLM",
        },
    )
    add_link(carrier, TRACE, SPAN_A)
    out = decode(export([carrier], {"service.name": "phoenix-evals"}))
    assert score_rows(out) == [
        score(
            "correctness",
            1.0,
            trace_id=TRACE,
            span_id=SPAN_A,
            label="correct",
            observed_at=T0 + 60_001_000_000,
        )
    ]
    # The carrier itself is not an LLM request.
    [row] = llm_rows(out)
    assert (row["operation"], row["is_llm"], row["e2e_ms"]) == ("evaluator", False, None)


def test_traceai_01_eval_input_string_is_not_a_score() -> None:
    s = span(
        "ChatCompletion",
        attributes={
            "fi.span.kind": "LLM",
            "eval.input": "What is the refund policy?",
            "eval.output": "Refunds are accepted within 30 days.",
        },
    )
    assert decode(export([s], TRACEAI_RESOURCE)).scores.num_rows == 0
