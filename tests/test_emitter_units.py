"""Unit conversions of the normalizer, one focused case per emitter and column (docs/columns.md).

Every value is chosen so that a wrong factor (s taken as ms, 1e3 for 1e6), swapped operands or a
subtraction the wrong way round lands on a different number; floats are compared to 1e-9 relative.
Times are anchored on whole seconds so the ISO timestamps of Langfuse convert without rounding.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from builders import kvs, span
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector.decode import Encoding, decode_traces

START = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START_NS = int(START.timestamp()) * 1_000_000_000
MS = 1_000_000  # ns
FIRST_TOKEN = "First Token Stream Event"
COMPLETION_START = "langfuse.observation.completion_start_time"
CLIENT = Span.SPAN_KIND_CLIENT
INTERNAL = Span.SPAN_KIND_INTERNAL
SERVER = Span.SPAN_KIND_SERVER

# The golden cases pin normalization through each decoder's walk.
pytestmark = pytest.mark.usefixtures("each_decoder")


def make_span(
    name: str,
    attributes: dict[str, Any],
    *,
    kind: int = SERVER,
    start: int = START_NS,
    duration_ns: int = 2_000 * MS,
    events: tuple[tuple[str, int], ...] = (),
) -> Span:
    """A span starting at `start`; each event is (name, ns after the span's start, possibly negative)."""
    s = span(name, kind=kind, start=start, duration_ns=duration_ns, attributes=attributes)
    for event_name, offset_ns in events:
        event = s.events.add()
        event.name = event_name
        event.time_unix_nano = start + offset_ns
    return s


def decoded(spans: list[Span], resource: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(kvs(resource or {}))
    rs.scope_spans.add().spans.extend(spans)
    out = decode_traces(req.SerializeToString(), Encoding.PROTOBUF)
    assert out.rejections.total == 0
    assert out.spans is not None
    # Start and end stay nanosecond timestamps, which Python's datetime cannot hold: left out.
    rows: list[dict[str, Any]] = out.spans.drop_columns(["start_time", "end_time"]).to_pylist()
    return rows


def decoded_row(s: Span, resource: dict[str, Any] | None = None) -> dict[str, Any]:
    [row] = decoded([s], resource)
    return row


def exactly(expected: Any) -> Any:
    return pytest.approx(expected, rel=1e-9) if type(expected) is float else expected


def assert_value(actual: Any, expected: Any) -> None:
    assert actual == exactly(expected)
    if expected is not None:
        assert type(actual) is type(expected), (actual, expected)


# --------------------------------------------------------------------------------------------------
# Attribute conversions: one attribute, one column.
# --------------------------------------------------------------------------------------------------

VLLM = "llm_request"
SGLANG = " Req 1a2b3c4d"
CHAT = "chat meta-llama/Llama-3.1-8B-Instruct"
OI = "ChatCompletion"

# (span name, kind, attribute, value as the emitter sends it, column, value in the column's unit)
CONVERSIONS = [
    pytest.param(VLLM, SERVER, "gen_ai.latency.time_to_first_token", 0.183, "ttft_ms", 183.0, id="vllm-ttft_ms-s"),
    pytest.param(SGLANG, INTERNAL, "gen_ai.latency.time_to_first_token", 0.095, "ttft_ms", 95.0, id="sglang-ttft_ms-s"),
    pytest.param(CHAT, CLIENT, "gen_ai.response.time_to_first_chunk", 0.21, "ttft_ms", 210.0, id="semconv-ttft_ms-s"),
    pytest.param(CHAT, CLIENT, "gen_ai.server.time_to_first_token", 182.5, "ttft_ms", 182.5, id="traceai-ttft_ms-ms"),
    pytest.param(CHAT, CLIENT, "gen_ai.server.time_per_output_token", 8.75, "tpot_ms", 8.75, id="traceai-tpot_ms-ms"),
    pytest.param(VLLM, SERVER, "gen_ai.latency.time_in_queue", 0.004, "queue_ms", 4.0, id="vllm-queue_ms-s"),
    pytest.param(CHAT, CLIENT, "gen_ai.server.queue_time", 12.5, "queue_ms", 12.5, id="traceai-queue_ms-ms"),
    pytest.param(VLLM, SERVER, "gen_ai.latency.time_in_model_prefill", 0.171, "prefill_ms", 171.0,
                 id="vllm-prefill_ms-s"),
    pytest.param(SGLANG, INTERNAL, "gen_ai.latency.time_in_model_prefill", 0.08, "prefill_ms", 80.0,
                 id="sglang-prefill_ms-s"),
    pytest.param(VLLM, SERVER, "gen_ai.latency.time_in_model_decode", 2.226, "decode_ms", 2226.0,
                 id="vllm-decode_ms-s"),
    pytest.param(SGLANG, INTERNAL, "gen_ai.latency.time_in_model_decode", 1.2065, "decode_ms", 1206.5,
                 id="sglang-decode_ms-s"),
    pytest.param(VLLM, SERVER, "gen_ai.latency.e2e", 2.412, "e2e_ms", 2412.0, id="vllm-e2e_ms-s"),
    pytest.param(VLLM, SERVER, "gen_ai.latency.e2e", 3, "e2e_ms", 3000.0, id="vllm-e2e_ms-whole-seconds"),
    pytest.param(SGLANG, INTERNAL, "gen_ai.latency.e2e", 1.35, "e2e_ms", 1350.0, id="sglang-e2e_ms-s"),
    pytest.param(CHAT, CLIENT, "gen_ai.usage.input_tokens", 812, "input_tokens", 812, id="semconv-input_tokens"),
    pytest.param(VLLM, SERVER, "gen_ai.usage.prompt_tokens", 813, "input_tokens", 813, id="vllm-input_tokens"),
    pytest.param(OI, INTERNAL, "llm.token_count.prompt", 814, "input_tokens", 814, id="openinference-input_tokens"),
    pytest.param(CHAT, CLIENT, "gen_ai.usage.output_tokens", 256, "output_tokens", 256, id="semconv-output_tokens"),
    pytest.param(VLLM, SERVER, "gen_ai.usage.completion_tokens", 257, "output_tokens", 257, id="vllm-output_tokens"),
    pytest.param(OI, INTERNAL, "llm.token_count.completion", 258, "output_tokens", 258,
                 id="openinference-output_tokens"),
    pytest.param(CHAT, CLIENT, "gen_ai.usage.cache_read.input_tokens", 768, "cached_input_tokens", 768,
                 id="semconv-cached_input_tokens"),
    pytest.param(OI, INTERNAL, "llm.token_count.prompt_details.cache_read", 769, "cached_input_tokens", 769,
                 id="openinference-cached_input_tokens"),
    pytest.param(SGLANG, INTERNAL, "gen_ai.usage.cached_tokens", 512, "cached_input_tokens", 512,
                 id="sglang-cached_input_tokens"),
    pytest.param(CHAT, CLIENT, "gen_ai.usage.input_tokens.cache_read", 513, "cached_input_tokens", 513,
                 id="traceai-cached_input_tokens"),
    pytest.param(CHAT, CLIENT, "gen_ai.usage.cache_read_input_tokens", 514, "cached_input_tokens", 514,
                 id="openllmetry04-cached_input_tokens"),
    pytest.param(CHAT, CLIENT, "gen_ai.usage.cache_read_tokens", 515, "cached_input_tokens", 515,
                 id="traceai-constant-cached_input_tokens"),
    pytest.param(OI, INTERNAL, "llm.token_count.prompt_details.cache_input", 516, "cached_input_tokens", 516,
                 id="openinference-cache_input-cached_input_tokens"),
    pytest.param(VLLM, SERVER, "vllm.num_requests_waiting", 7, "queue_depth", 7, id="vllm-queue_depth"),
    pytest.param(CHAT, CLIENT, "cluster.queue_depth", 9, "queue_depth", 9, id="gateway-queue_depth"),
    pytest.param(CHAT, CLIENT, "cluster.replica_count", 4, "replica_count", 4, id="gateway-replica_count"),
    pytest.param(VLLM, SERVER, "llm.vllm.batch_size", 48, "batch_size", 48, id="vllm-batch_size"),
    pytest.param(VLLM, SERVER, "llm.vllm.prefill_in_batch", 6144, "prefill_tokens_in_batch", 6144,
                 id="vllm-prefill_tokens_in_batch"),
    pytest.param(VLLM, SERVER, "llm.vllm.cache_hit_ratio", 0.625, "cache_hit_ratio", 0.625, id="vllm-cache_hit_ratio"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "kind", "key", "value", "column", "expected"), CONVERSIONS)
def test_each_emitter_attribute_is_converted_to_the_unit_of_its_column(
    name: str, kind: int, key: str, value: Any, column: str, expected: Any
) -> None:
    row = decoded_row(make_span(name, {key: value}, kind=kind))
    assert_value(row[column], expected)


@pytest.mark.parametrize(("name", "kind", "key", "value", "column", "expected"), CONVERSIONS)
def test_a_numeric_string_beside_a_number_in_one_batch_gets_the_same_conversion(
    name: str, kind: int, key: str, value: Any, column: str, expected: Any
) -> None:
    # The string sends the whole column down the per-value path; both spans must agree with the table.
    rows = decoded([make_span(name, {key: value}, kind=kind), make_span(name, {key: str(value)}, kind=kind)])
    assert_value(rows[0][column], expected)
    assert_value(rows[1][column], expected)


@pytest.mark.parametrize(
    ("scope", "key", "value", "column", "expected"),
    [
        ("resource", "cluster.queue_depth", "12", "queue_depth", 12),
        ("resource", "cluster.replica_count", "3", "replica_count", 3),
        ("resource", "llm.vllm.quantization", "FP8", "quantization", "fp8"),
        ("span", "gen_ai.usage.input_tokens", 812.0, "input_tokens", 812),
        ("span", "gen_ai.usage.input_tokens", -1, "input_tokens", None),
        ("span", "gen_ai.usage.input_tokens", "-1", "input_tokens", None),
        ("span", "llm.vllm.cache_hit_ratio", "0.375", "cache_hit_ratio", 0.375),
    ],
    ids=[
        "resource-string-queue_depth",
        "resource-string-replica_count",
        "resource-quantization-lower-cased",
        "float-token-count-is-an-integer",
        "negative-token-count-is-null",
        "negative-string-token-count-is-null",
        "string-cache_hit_ratio",
    ],
)
def test_counts_and_ratios_from_strings_floats_and_resources(
    scope: str, key: str, value: Any, column: str, expected: Any
) -> None:
    attributes = {key: value} if scope == "span" else {}
    resource = {key: value} if scope == "resource" else {}
    row = decoded_row(make_span(VLLM, attributes), resource)
    assert_value(row[column], expected)


# --------------------------------------------------------------------------------------------------
# Span timestamps: nanoseconds to milliseconds.
# --------------------------------------------------------------------------------------------------


def test_span_duration_in_nanoseconds_becomes_duration_ms_and_the_e2e_of_an_llm_span() -> None:
    row = decoded_row(make_span(CHAT, {"gen_ai.operation.name": "chat"}, kind=CLIENT, duration_ns=2_345_678_901))
    assert_value(row["duration_ms"], 2345.678901)
    assert_value(row["e2e_ms"], 2345.678901)


def test_e2e_attribute_in_seconds_wins_over_the_span_duration() -> None:
    row = decoded_row(make_span(VLLM, {"gen_ai.latency.e2e": 2.412}, duration_ns=2_413_500_000))
    assert_value(row["duration_ms"], 2413.5)
    assert_value(row["e2e_ms"], 2412.0)


def test_a_non_llm_span_keeps_its_duration_but_gets_no_e2e() -> None:
    row = decoded_row(make_span("retrieve", {"openinference.span.kind": "RETRIEVER"}, duration_ns=15_250_000))
    assert_value(row["duration_ms"], 15.25)
    assert row["e2e_ms"] is None


# --------------------------------------------------------------------------------------------------
# TTFT from OpenInference's first-token event (ns) and Langfuse's completion start (ISO time).
# --------------------------------------------------------------------------------------------------

OI_LLM = {"openinference.span.kind": "LLM", "llm.token_count.completion": 256}


def test_openinference_ttft_is_the_first_token_event_time_minus_span_start_in_ms() -> None:
    row = decoded_row(make_span(OI, OI_LLM, kind=INTERNAL, events=((FIRST_TOKEN, 210_123_456),)))
    assert_value(row["ttft_ms"], 210.123456)


def test_openinference_ttft_uses_the_span_start_not_the_epoch_or_the_end() -> None:
    start = START_NS + 7_654_321
    row = decoded_row(make_span(OI, OI_LLM, kind=INTERNAL, start=start, events=((FIRST_TOKEN, 95 * MS),)))
    assert_value(row["ttft_ms"], 95.0)


@pytest.mark.parametrize(
    "events",
    [((FIRST_TOKEN, -MS),), (("First Token", 100 * MS),), (("gen_ai.evaluation.result", 100 * MS),)],
    ids=["event-before-span-start", "other-event-name", "evaluation-event"],
)
def test_openinference_ttft_is_null_without_a_first_token_event_at_or_after_the_start(
    events: tuple[tuple[str, int], ...],
) -> None:
    row = decoded_row(make_span(OI, OI_LLM, kind=INTERNAL, events=events))
    assert row["ttft_ms"] is None


def test_openinference_first_token_event_at_the_span_start_is_a_zero_ttft() -> None:
    row = decoded_row(make_span(OI, OI_LLM, kind=INTERNAL, events=((FIRST_TOKEN, 0),)))
    assert_value(row["ttft_ms"], 0.0)


CHUNK = "gen_ai.content.completion.chunk"
OPENLLMETRY_STREAM = {"gen_ai.operation.name": "chat", "gen_ai.usage.output_tokens": 256}


@pytest.mark.parametrize(
    ("events", "ttft_ms"),
    [
        (((CHUNK, 900 * MS), (CHUNK, 312_500_000), (CHUNK, 600 * MS)), 312.5),
        (((CHUNK, -MS), (CHUNK, 250_000_123)), 250.000123),
        ((("gen_ai.content.completion", 100 * MS), (CHUNK, 275 * MS)), 275.0),
    ],
    ids=["listed-out-of-order", "chunk-before-span-start", "other-event-first"],
)
def test_openllmetry_ttft_is_the_earliest_completion_chunk_at_or_after_the_start(
    events: tuple[tuple[str, int], ...], ttft_ms: float
) -> None:
    row = decoded_row(make_span("openai.chat", OPENLLMETRY_STREAM, kind=CLIENT, events=events))
    assert_value(row["ttft_ms"], ttft_ms)


LANGFUSE = {"langfuse.observation.type": "generation", "langfuse.observation.model.name": "gpt-4o-mini"}


@pytest.mark.parametrize(
    ("completion_start", "start", "ttft_ms"),
    [
        ('"2026-11-20T12:00:00.375000Z"', START_NS, 375.0),
        ("2026-11-20T12:00:00.375Z", START_NS, 375.0),
        ("2026-11-20T12:00:01.5+00:00", START_NS, 1500.0),
        ('"2026-11-20T13:00:00.250000+01:00"', START_NS, 250.0),
        ("2026-11-20T12:00:00.015625Z", START_NS, 15.625),
        ("2026-11-20T12:00:02Z", START_NS + 500 * MS, 1500.0),
        ("2026-11-20T12:00:00.5Z", START_NS + 125 * MS + 500_000, 374.5),
        ("2026-11-20T12:00:00Z", START_NS, 0.0),
    ],
    ids=[
        "json-quoted-z",
        "unquoted-z",
        "utc-offset",
        "plus-one-hour-offset",
        "microseconds",
        "start-not-on-a-second",
        "start-with-sub-ms-part",
        "first-token-at-start",
    ],
)
def test_langfuse_ttft_is_completion_start_minus_span_start_in_ms(
    completion_start: str, start: int, ttft_ms: float
) -> None:
    row = decoded_row(make_span("generation", {**LANGFUSE, COMPLETION_START: completion_start}, start=start))
    assert_value(row["ttft_ms"], ttft_ms)


@pytest.mark.parametrize(
    "completion_start",
    ['"2026-11-20T11:59:59.999Z"', "not a time", "", 1795176000],
    ids=["before-span-start", "unparsable", "empty", "not-a-string"],
)
def test_langfuse_ttft_is_null_when_completion_start_is_before_the_span_or_unreadable(completion_start: Any) -> None:
    row = decoded_row(make_span("generation", {**LANGFUSE, COMPLETION_START: completion_start}))
    assert row["ttft_ms"] is None


@pytest.mark.parametrize(
    ("drop", "ttft_ms"),
    [(0, 100.0), (1, 200.0), (2, 300.0), (3, 400.0), (4, 500.0), (5, None)],
    ids=[
        "vllm-seconds-first",
        "semconv-seconds-next",
        "traceai-ms-next",
        "openinference-event-next",
        "langfuse-completion-start-last",
        "none",
    ],
)
def test_ttft_sources_in_priority_order_each_in_its_own_unit(drop: int, ttft_ms: float | None) -> None:
    sources: list[tuple[str, Any]] = [
        ("gen_ai.latency.time_to_first_token", 0.1),
        ("gen_ai.response.time_to_first_chunk", 0.2),
        ("gen_ai.server.time_to_first_token", 300.0),
        ("event", None),
        (COMPLETION_START, '"2026-11-20T12:00:00.500000Z"'),
    ][drop:]
    attributes = {key: value for key, value in sources if key != "event"}
    events = ((FIRST_TOKEN, 400 * MS),) if any(key == "event" for key, _ in sources) else ()
    row = decoded_row(make_span(VLLM, {"gen_ai.usage.completion_tokens": 1, **attributes}, events=events))
    assert_value(row["ttft_ms"], ttft_ms)


# --------------------------------------------------------------------------------------------------
# Derived tpot_ms: decode / (output tokens - 1), else (e2e - ttft) / (output tokens - 1).
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "attributes", "tpot_ms"),
    [
        (
            VLLM,
            {"gen_ai.usage.completion_tokens": 256, "gen_ai.latency.time_in_model_decode": 2.226},
            2226.0 / 255,
        ),
        (
            SGLANG,
            {"gen_ai.usage.completion_tokens": 128, "gen_ai.latency.time_in_model_decode": 1.2065},
            9.5,  # 1206.5 ms over 127 tokens
        ),
        (
            VLLM,
            {"gen_ai.usage.completion_tokens": 2, "gen_ai.latency.time_in_model_decode": 0.04},
            40.0,  # two tokens: the second one is the only decoded one
        ),
        (
            VLLM,
            {
                "gen_ai.usage.completion_tokens": 11,
                "gen_ai.latency.time_in_model_decode": 0.5,
                "gen_ai.latency.e2e": 1.0,
                "gen_ai.latency.time_to_first_token": 0.2,
            },
            50.0,  # decode wins over (e2e - ttft) / 10 = 80
        ),
    ],
    ids=["vllm-from-decode", "sglang-from-decode", "vllm-two-tokens", "vllm-decode-wins-over-e2e"],
)
def test_tpot_from_decode_seconds_over_output_tokens_minus_one(
    name: str, attributes: dict[str, Any], tpot_ms: float
) -> None:
    assert_value(decoded_row(make_span(name, attributes))["tpot_ms"], tpot_ms)


@pytest.mark.parametrize(
    ("attributes", "tpot_ms"),
    [
        (
            {
                "gen_ai.usage.completion_tokens": 128,
                "gen_ai.latency.e2e": 1.35,
                "gen_ai.latency.time_to_first_token": 0.095,
            },
            1255.0 / 127,
        ),
        (
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.usage.output_tokens": 41,
                "gen_ai.latency.e2e": 0.9,
                "gen_ai.server.time_to_first_token": 100.0,
            },
            20.0,  # (900 ms - 100 ms) / 40, the ttft already in ms
        ),
        (
            {
                "gen_ai.usage.completion_tokens": 5,
                "gen_ai.latency.e2e": 0.3,
                "gen_ai.latency.time_to_first_token": 0.3,
            },
            0.0,
        ),
    ],
    ids=["sglang-e2e-minus-ttft", "e2e-seconds-minus-traceai-ttft-ms", "e2e-equals-ttft"],
)
def test_tpot_from_e2e_minus_ttft_over_output_tokens_minus_one(attributes: dict[str, Any], tpot_ms: float) -> None:
    assert_value(decoded_row(make_span(VLLM, attributes))["tpot_ms"], tpot_ms)


def test_tpot_from_span_duration_minus_the_first_token_event() -> None:
    s = make_span(OI, OI_LLM, kind=INTERNAL, duration_ns=2_650 * MS, events=((FIRST_TOKEN, 210 * MS),))
    row = decoded_row(s)
    assert_value(row["ttft_ms"], 210.0)
    assert_value(row["tpot_ms"], 2440.0 / 255)


def test_tpot_from_span_duration_minus_the_langfuse_completion_start() -> None:
    attributes = {**LANGFUSE, "gen_ai.usage.output_tokens": 21, COMPLETION_START: '"2026-11-20T12:00:00.250000Z"'}
    row = decoded_row(make_span("generation", attributes, duration_ns=1_250 * MS))
    assert_value(row["ttft_ms"], 250.0)
    assert_value(row["tpot_ms"], 50.0)  # (1250 - 250) / 20


@pytest.mark.parametrize(
    "attributes",
    [
        {"gen_ai.usage.completion_tokens": 5, "gen_ai.latency.e2e": 0.2, "gen_ai.latency.time_to_first_token": 0.3},
        {"gen_ai.usage.completion_tokens": 1, "gen_ai.latency.time_in_model_decode": 0.04},
        {"gen_ai.usage.completion_tokens": 0, "gen_ai.latency.time_in_model_decode": 0.04},
        {"gen_ai.latency.time_in_model_decode": 0.04},
    ],
    ids=["e2e-before-ttft", "one-output-token", "no-output-tokens", "no-token-count"],
)
def test_tpot_is_null_when_it_cannot_be_derived(attributes: dict[str, Any]) -> None:
    assert decoded_row(make_span(VLLM, attributes))["tpot_ms"] is None


def test_traceai_tpot_in_ms_wins_over_the_derived_one() -> None:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.usage.output_tokens": 11,
        "gen_ai.server.time_per_output_token": 7.25,
        "gen_ai.latency.time_in_model_decode": 0.5,
    }
    assert_value(decoded_row(make_span(CHAT, attributes, kind=CLIENT))["tpot_ms"], 7.25)


# --------------------------------------------------------------------------------------------------
# Derived cache_hit_ratio: cached input tokens / input tokens, clamped to 0..1.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "attributes", "ratio"),
    [
        (CHAT, {"gen_ai.usage.input_tokens": 1024, "gen_ai.usage.cache_read.input_tokens": 768}, 0.75),
        (OI, {"llm.token_count.prompt": 812, "llm.token_count.prompt_details.cache_read": 768}, 768 / 812),
        (SGLANG, {"gen_ai.usage.prompt_tokens": 640, "gen_ai.usage.cached_tokens": 512}, 0.8),
        (CHAT, {"gen_ai.usage.input_tokens": 400, "gen_ai.usage.input_tokens.cache_read": 100}, 0.25),
        (CHAT, {"gen_ai.usage.input_tokens": 812, "gen_ai.usage.cache_read.input_tokens": 900}, 1.0),
        (CHAT, {"gen_ai.usage.input_tokens": 1024, "gen_ai.usage.cache_read.input_tokens": 0}, 0.0),
        (CHAT, {"gen_ai.usage.input_tokens": 0, "gen_ai.usage.cache_read.input_tokens": 0}, None),
        (
            CHAT,
            {
                "gen_ai.usage.input_tokens": 1024,
                "gen_ai.usage.cache_read.input_tokens": 768,
                "llm.vllm.cache_hit_ratio": 0.125,
            },
            0.125,
        ),
        (VLLM, {"llm.vllm.cache_hit_ratio": 1.5}, 1.0),
        (VLLM, {"llm.vllm.cache_hit_ratio": -0.25}, 0.0),
    ],
    ids=[
        "semconv",
        "openinference",
        "sglang",
        "traceai",
        "more-cached-than-input-clamped",
        "nothing-cached",
        "no-input",
        "explicit-ratio-wins",
        "explicit-ratio-clamped-high",
        "explicit-ratio-clamped-low",
    ],
)
def test_cache_hit_ratio_is_cached_over_input_tokens(
    name: str, attributes: dict[str, Any], ratio: float | None
) -> None:
    assert_value(decoded_row(make_span(name, attributes))["cache_hit_ratio"], ratio)


@pytest.mark.parametrize("value", [1e306, "1e306"])
def test_a_latency_too_large_for_milliseconds_is_left_out_not_stored_as_infinity(value: Any) -> None:
    # 1e306 s is a finite double; in milliseconds it is not.
    row = decoded_row(make_span(VLLM, {"gen_ai.latency.time_to_first_token": value}, kind=SERVER))
    assert row["ttft_ms"] is None
