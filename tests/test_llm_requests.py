"""End to end through real exporters: one row per LLM request, and scores from every source joined to spans."""

from __future__ import annotations

import json
import time

from conftest import RunningService
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from test_otlp_http import post

NS = 1_000_000_000


def tracer(provider_resource: dict[str, str], exporter: object) -> tuple[TracerProvider, trace.Tracer]:
    provider = TracerProvider(resource=Resource.create(provider_resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[arg-type]
    return provider, provider.get_tracer("tests")


def send_evaluation(exporter: object, trace_id: int, span_id: int, name: str, score: float) -> None:
    provider = LoggerProvider(resource=Resource.create({"service.name": "evaluator"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))  # type: ignore[arg-type]
    judged = trace.set_span_in_context(
        NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(1)))
    )
    provider.get_logger("evals").emit(
        event_name="gen_ai.evaluation.result",
        context=judged,
        severity_number=SeverityNumber.INFO,
        attributes={
            "gen_ai.evaluation.name": name,
            "gen_ai.evaluation.score.value": score,
            "gen_ai.evaluation.score.label": "pass" if score >= 0.5 else "fail",
        },
    )
    provider.shutdown()


def test_client_and_server_spans_of_one_request_count_once(service: RunningService) -> None:
    client_provider, client = tracer(
        {"service.name": "chat-app", "tenant.id": "acme"}, GrpcSpanExporter(endpoint=service.grpc_target, insecure=True)
    )
    server_provider, server = tracer(
        {"service.name": "vllm-llama8b", "service.instance.id": "r7"},
        HttpSpanExporter(endpoint=f"{service.http_url}/v1/traces"),
    )
    t0 = time.time_ns() - 60 * NS
    client_attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "meta-llama/Llama-3.1-8B-Instruct",
        "gen_ai.usage.input_tokens": 812,
        "gen_ai.usage.output_tokens": 256,
        "gen_ai.usage.cache_read.input_tokens": 768,
    }
    with client.start_as_current_span("chat llama", kind=SpanKind.CLIENT, attributes=client_attrs, start_time=t0) as c:
        # vLLM's span is the child of the propagated client context, and measures the request server-side.
        server_span = server.start_span(
            "llm_request",
            kind=SpanKind.SERVER,
            start_time=t0 + NS // 10,
            attributes={
                "gen_ai.request.id": "chatcmpl-1",
                "gen_ai.usage.prompt_tokens": 812,
                "gen_ai.usage.completion_tokens": 256,
                "gen_ai.latency.time_to_first_token": 0.183,
                "gen_ai.latency.time_in_queue": 0.004,
                "gen_ai.latency.time_in_model_decode": 2.04,
                "gen_ai.latency.e2e": 2.3,
            },
        )
        server_span.end(end_time=t0 + NS // 10 + int(2.3 * NS))
        client_span_id = c.get_span_context().span_id
        trace_id = c.get_span_context().trace_id
    # c ends now, after the server span: it contains it.
    lone = server.start_span(
        "llm_request", kind=SpanKind.SERVER, start_time=t0, attributes={"gen_ai.usage.prompt_tokens": 5}
    )
    lone.end(end_time=t0 + NS)
    client_provider.shutdown()
    server_provider.shutdown()

    assert service.rows("SELECT count(*) FROM spans WHERE is_llm") == [(3,)]
    rows = service.rows(
        """SELECT span_id, server_span_id IS NOT NULL, client_span_id, tenant_id, replica_id, deployment, provider,
                  ttft_ms, tpot_ms, queue_ms, cached_input_tokens, cache_hit_ratio
           FROM llm_requests WHERE trace_id = ?""",
        [f"{trace_id:032x}"],
    )
    assert len(rows) == 1
    span_id, has_server, client_id, tenant, replica, deployment, provider, ttft, tpot, queue, cached, ratio = rows[0]
    assert span_id == client_id == f"{client_span_id:016x}"
    assert has_server
    assert (tenant, replica, deployment, provider) == ("acme", "r7", "vllm-llama8b", "openai")
    assert ttft == 183.0
    assert queue == 4.0
    assert abs(tpot - 2040 / 255) < 1e-9
    assert cached == 768  # vLLM sends no cache figure; the client span's is used
    assert abs(ratio - 768 / 812) < 1e-12
    assert service.rows("SELECT count(*) FROM llm_requests") == [(2,)]


class FixedIds(IdGenerator):
    """Lets the test know a span's id before the SDK creates the span."""

    def __init__(self, trace_id: int, span_id: int) -> None:
        self.trace_id, self.span_id = trace_id, span_id

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id


def test_scores_from_attributes_events_and_logs_join_to_their_span_whenever_they_arrive(
    service: RunningService,
) -> None:
    trace_id, span_id = 0x5B8EFFF798038103D269B633813FC60C, 0xEEE19B7EC3C1B174
    grpc_logs = GrpcLogExporter(endpoint=service.grpc_target, insecure=True)
    # A log-record score that arrives before its span exists.
    send_evaluation(grpc_logs, trace_id, span_id, "relevance", 0.8)
    assert service.rows("SELECT count(*) FROM span_scores") == [(1,)]

    provider = TracerProvider(
        resource=Resource.create({"service.name": "chat-app"}), id_generator=FixedIds(trace_id, span_id)
    )
    provider.add_span_processor(SimpleSpanProcessor(GrpcSpanExporter(endpoint=service.grpc_target, insecure=True)))
    span = provider.get_tracer("tests").start_span(
        "chat",
        kind=SpanKind.CLIENT,
        attributes={"gen_ai.operation.name": "chat", "eval.json_adherence": 0.91, "eval.json_adherence.label": "ok"},
    )
    span.add_event(
        "gen_ai.evaluation.result", {"gen_ai.evaluation.name": "groundedness", "gen_ai.evaluation.score.value": 0.7}
    )
    span.end()
    provider.shutdown()
    assert span.get_span_context().span_id == span_id
    # And one after it, over OTLP/HTTP.
    send_evaluation(HttpLogExporter(endpoint=f"{service.http_url}/v1/logs"), trace_id, span_id, "toxicity", 0.1)

    scores = service.rows(
        """SELECT sc.name, sc.source, sc.score, sc.label FROM span_scores sc
           JOIN spans s USING (trace_id, span_id) ORDER BY sc.name"""
    )
    assert scores == [
        ("groundedness", "event", 0.7, None),
        ("json_adherence", "attribute", 0.91, "ok"),
        ("relevance", "log", 0.8, "pass"),
        ("toxicity", "log", 0.1, "fail"),
    ]
    assert service.rows("SELECT count(*) FROM llm_request_scores WHERE span_id = ?", [f"{span_id:016x}"]) == [(4,)]


def test_a_retried_log_request_does_not_duplicate_scores(service: RunningService) -> None:
    body = {
        "resourceLogs": [
            {
                "scopeLogs": [
                    {
                        "logRecords": [
                            {
                                "timeUnixNano": "1763700000000000000",
                                "eventName": "gen_ai.evaluation.result",
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "attributes": [
                                    {"key": "gen_ai.evaluation.name", "value": {"stringValue": "json_adherence"}},
                                    {"key": "gen_ai.evaluation.score.value", "value": {"doubleValue": 0.5}},
                                ],
                            },
                            {"timeUnixNano": "1763700000000000000", "body": {"stringValue": "an ordinary log line"}},
                            {"eventName": "gen_ai.evaluation.result", "attributes": []},
                        ]
                    }
                ]
            }
        ]
    }
    payload = json.dumps(body).encode()
    for _ in range(2):
        status, _, answer = post(f"{service.http_url}/v1/logs", payload, "application/json")
        assert status == 200
        partial = json.loads(answer)["partialSuccess"]
        assert partial["rejectedLogRecords"] == "1"
        assert "missing_span_context" in partial["errorMessage"]
    assert service.rows("SELECT name, score, source FROM span_scores") == [("json_adherence", 0.5, "log")]
    assert service.metric("tailwatch_log_records_ignored_total") == 2


def test_a_retry_inside_one_client_span_is_one_request_and_one_earlier_attempt(service: RunningService) -> None:
    client_provider, client = tracer(
        {"service.name": "gateway", "tenant.id": "acme"}, GrpcSpanExporter(endpoint=service.grpc_target, insecure=True)
    )
    replicas = {
        replica: tracer(
            {"service.name": "vllm-llama8b", "service.instance.id": replica},
            GrpcSpanExporter(endpoint=service.grpc_target, insecure=True),
        )
        for replica in ("r1", "r2")
    }
    t0 = time.time_ns() - 60 * NS
    with client.start_as_current_span(
        "chat llama",
        kind=SpanKind.CLIENT,
        start_time=t0,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "llama", "eval.json_adherence": 0.9},
    ) as c:
        # The gateway's first attempt fails on r1; it retries on r2, whose answer the client gets.
        for replica, start, seconds in (("r1", 0.1, 0.5), ("r2", 0.7, 1.2)):
            attempt = replicas[replica][1].start_span(
                "llm_request",
                kind=SpanKind.SERVER,
                start_time=t0 + int(start * NS),
                attributes={"gen_ai.usage.prompt_tokens": 812, "gen_ai.latency.e2e": seconds},
            )
            if replica == "r1":
                attempt.set_status(trace.Status(trace.StatusCode.ERROR))
            attempt.end(end_time=t0 + int((start + seconds) * NS))
        client_id = f"{c.get_span_context().span_id:016x}"
        trace_id = f"{c.get_span_context().trace_id:032x}"
    for provider, _tracer in (*replicas.values(), (client_provider, client)):
        provider.shutdown()

    rows = service.rows(
        """SELECT span_id, client_span_id, replica_id, tenant_id, status_code, e2e_ms FROM llm_requests
           WHERE trace_id = ? ORDER BY start_time""",
        [trace_id],
    )
    [first, request] = rows
    # The request: the client's id and tenant, the answering attempt's replica, status and timings.
    assert request == (client_id, client_id, "r2", "acme", "UNSET", 1200.0)
    # The earlier attempt: a row of its own under its server span's id, with the client's tenant only.
    assert first[1:] == (None, "r1", "acme", "ERROR", 500.0)
    assert first[0] not in (client_id, None)
    # The client's score belongs to the request once, not to every attempt.
    assert service.rows("SELECT span_id FROM llm_request_scores WHERE trace_id = ?", [trace_id]) == [(client_id,)]
