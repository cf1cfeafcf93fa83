"""The compiled decoder and the Python reference decode every request the same way.

Hypothesis builds OTLP trace requests, valid and invalid (bad ids, times, kinds, repeated keys, every
AnyValue kind, NaN and extreme numbers, events, links, scores), and damaged bytes; both decoders must
give equal batches, equal scores and equal rejections, or both refuse the request.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from builders import Pairs, any_value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from receivers import NATIVE_INSTALL, import_or_skip, require_or_skip

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
from targets import same_decoding

import collector.decode
from collector import native_walk
from collector.decode import Decoded, Decoder, Encoding, decode_traces
from collector.errors import MalformedPayload
from collector.normalize import KeyValues
from collector.span_walk import Walked


@pytest.fixture(autouse=True)
def _needs_native() -> None:
    if not native_walk.AVAILABLE:
        require_or_skip("the compiled decoder (tailwatch_native) is not installed", NATIVE_INSTALL)


# Keys normalization, scores and first-token times read, mixed with arbitrary ones.
KNOWN_KEYS = (
    "gen_ai.operation.name",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.server.time_to_first_token",
    "gen_ai.latency.e2e",
    "gen_ai.latency.time_in_model_decode",
    "gen_ai.response.model",
    "gen_ai.response.finish_reasons",
    "llm.vllm.cache_hit_ratio",
    "cluster.queue_depth",
    "tenant.id",
    "metadata",
    "service.name",
    "k8s.pod.name",
    "openinference.span.kind",
    "langfuse.observation.completion_start_time",
    "gen_ai.evaluation.name",
    "gen_ai.evaluation.score.value",
    "gen_ai.evaluation.score.label",
    "gen_ai.evaluation.explanation",
    "gen_ai.evaluation.target_span_id",
    "eval.relevance.score",
    "eval.relevance",
    "eval.relevance.label",
    "eval.relevance.explanation",
    "eval.",
    "eval..score",
    "eval.score",
    "eval.x\n",
    "evaluations.0.evaluation.name",
    "evaluations.0.evaluation.score",
    "evaluations.0.annotation.label",
    "annotations.01.annotation.name",
    "annotations.01.evaluation.explanation",
    "evaluations.\u0661.evaluation.name",
)
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=12))

scalars = st.one_of(
    st.none(),
    st.text(max_size=20),
    st.sampled_from(["12", " 7 ", "", "chat", "1e3", "nan", '["stop"]', '{"tenant_id": "t1"}', "2030-01-01T00:00:00Z"]),
    # What Python's float() reads and a plain parse may not: underscores, other digits and spaces, signs.
    st.sampled_from(["1_000", "\u0661", "\u20071", "\x1c2", "+.5", "-inf", "1e400", "0.25\n", "5.", "EVALUATOR"]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2**53 + 1, 2**63 - 1]),
    st.floats(),
    st.sampled_from([math.nan, math.inf, 1e-7, 1e16, 1e300, -0.0, 0.25]),
    st.booleans(),
    st.binary(max_size=12),
)


def _pairs(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[list[tuple[str, Any]]]:
    # Lists of pairs rather than dicts, so repeated keys happen.
    return st.lists(st.tuples(keys, inner), max_size=5)


values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | _pairs(inner).map(Pairs),
    max_leaves=6,
)


def key_values(pairs: list[tuple[str, Any]]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in pairs]


T = 1_700_000_000_000_000_000
trace_ids = st.one_of(st.binary(min_size=16, max_size=16), st.sampled_from([bytes(16), b"", b"\x01" * 8]))
span_ids = st.one_of(st.binary(min_size=8, max_size=8), st.sampled_from([bytes(8), b"\x01" * 4]))
times = st.one_of(st.integers(min_value=T, max_value=T + 10**12), st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1]))


@st.composite
def spans(draw: st.DrawFn) -> Span:
    s = Span(
        trace_id=draw(trace_ids),
        span_id=draw(span_ids),
        parent_span_id=draw(st.one_of(st.just(b""), span_ids)),
        name=draw(st.one_of(st.sampled_from(["llm_request", "chat m", "x Req 1a2b"]), st.text(max_size=8))),
        kind=draw(st.integers(min_value=-1, max_value=7)),
        start_time_unix_nano=draw(times),
        end_time_unix_nano=draw(times),
    )
    s.attributes.extend(key_values(draw(st.lists(st.tuples(keys, values), max_size=8))))
    s.status.code = draw(st.integers(min_value=-1, max_value=4))
    s.status.message = draw(st.text(max_size=6))
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        event = s.events.add(
            name=draw(
                st.sampled_from(
                    ["gen_ai.evaluation.result", "First Token Stream Event", "gen_ai.content.completion.chunk", "other"]
                )
            ),
            time_unix_nano=draw(times),
        )
        event.attributes.extend(key_values(draw(_pairs(values))))
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        link = s.links.add(trace_id=draw(trace_ids), span_id=draw(span_ids))
        link.attributes.extend(key_values(draw(_pairs(scalars))))
    return s


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        rs = request.resource_spans.add()
        rs.resource.attributes.extend(key_values(draw(_pairs(values))))
        for _ in range(draw(st.integers(min_value=1, max_value=2))):
            ss = rs.scope_spans.add()
            ss.scope.name = draw(st.text(max_size=6))
            ss.spans.extend(draw(st.lists(spans(), max_size=4)))
    return request.SerializeToString()


def assert_same(payload: bytes, *, split_attributes: bool = False) -> Decoded | None:
    """The compiled decoder's result after checking it equals the reference's; None when both refuse."""
    try:
        return same_decoding(payload, split_attributes=split_attributes)
    except MalformedPayload:
        return None


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests())
def test_both_decoders_give_the_same_batch_scores_and_rejections(payload: bytes) -> None:
    assert_same(payload)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests())
def test_both_decoders_split_attributes_the_same(payload: bytes) -> None:
    """The walks leave the same keys out of the JSON and hand over the same left-out pairs, so the split
    (shared) gives the same stored attributes and bits."""
    assert_same(payload, split_attributes=True)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests(), st.data())
def test_both_decoders_refuse_the_same_damaged_bytes(payload: bytes, data: st.DataObject) -> None:
    if not payload:
        return
    damaged = bytearray(payload)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        damaged[data.draw(st.integers(min_value=0, max_value=len(damaged) - 1))] = data.draw(
            st.integers(min_value=0, max_value=255)
        )
    cut = data.draw(st.integers(min_value=0, max_value=len(damaged)))
    assert_same(bytes(damaged[:cut]))


def test_the_differential_check_fails_when_the_compiled_walk_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The comparison itself must be able to fail: plant a one-value difference in the compiled walk's output.
    one = ExportTraceServiceRequest()
    s = (
        one.resource_spans.add()
        .scope_spans.add()
        .spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=T, end_time_unix_nano=T + 5)
    )
    s.attributes.extend(key_values([("gen_ai.usage.input_tokens", 3)]))
    payload = one.SerializeToString()
    decoded = assert_same(payload)
    assert decoded is not None and decoded.spans is not None
    assert decoded.spans["input_tokens"].to_pylist() == [3]

    compiled = native_walk.walk

    def off_by_one(
        payload: bytes, span_keys: tuple[str, ...], resource_keys: tuple[str, ...], left_out: tuple[str, ...]
    ) -> Walked:
        walked = compiled(payload, span_keys, resource_keys, left_out)
        walked.span_values["gen_ai.usage.input_tokens"] = KeyValues(pa.array([4], pa.int64()))
        return walked

    monkeypatch.setitem(collector.decode._WALKS, Decoder.NATIVE, off_by_one)
    with pytest.raises(AssertionError, match="column input_tokens differs"):
        same_decoding(payload)


def test_a_request_the_compiled_decoder_cannot_parse_is_malformed_with_the_parser_s_reason() -> None:
    with pytest.raises(MalformedPayload, match=r"ExportTraceServiceRequest: failed to decode Protobuf message: .+"):
        decode_traces(b"\x0a\xff", Encoding.PROTOBUF, decoder=Decoder.NATIVE)


def _scored_request(*labels: object) -> bytes:
    request = ExportTraceServiceRequest()
    ss = request.resource_spans.add().scope_spans.add()
    for i, label in enumerate(labels):
        s = ss.spans.add(
            trace_id=bytes([i + 1]) * 16, span_id=bytes([i + 1]) * 8, start_time_unix_nano=T, end_time_unix_nano=T + 5
        )
        s.attributes.extend(key_values([("eval.relevance", 0.5 + i / 10), ("eval.relevance.label", label)]))
    return request.SerializeToString()


def test_the_compiled_walk_reads_scores_itself() -> None:
    # Were every span handed to the reference, the differential tests would still pass: pin that it is not.
    tailwatch_native = import_or_skip("tailwatch_native", NATIVE_INSTALL)

    walked = tailwatch_native.walk_traces(_scored_request("good", 7, True), [], [], [])
    scores, left = pa.record_batch(walked[6]), walked[8]
    assert left == []
    assert scores["label"].to_pylist() == ["good", "7", "True"]
    assert scores["row"].to_pylist() == [0, 1, 2]


def test_a_span_whose_text_only_python_writes_is_read_by_the_reference_in_its_place() -> None:
    # str(0.25) is Python's to write: the middle span goes to the reference and keeps its place.
    tailwatch_native = import_or_skip("tailwatch_native", NATIVE_INSTALL)

    payload = _scored_request("good", 0.25, "bad")
    assert tailwatch_native.walk_traces(payload, [], [], [])[8] == [1]
    decoded = assert_same(payload)
    assert decoded is not None
    assert decoded.scores["label"].to_pylist() == ["good", "0.25", "bad"]
    assert decoded.scores["score"].to_pylist() == [0.5, 0.6, 0.7]


def _evaluation(s: Span, at: int, name: str = "relevance") -> None:
    event = s.events.add(name="gen_ai.evaluation.result", time_unix_nano=at)
    event.attributes.extend(key_values([("gen_ai.evaluation.name", name), ("gen_ai.evaluation.score.value", 0.5)]))


def test_an_evaluation_event_at_a_time_storage_cannot_hold_is_dated_at_its_span_s_end() -> None:
    request = ExportTraceServiceRequest()
    s = (
        request.resource_spans.add()
        .scope_spans.add()
        .spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=T, end_time_unix_nano=T + 5_000)
    )
    for at in (0, T + 1_000, 2**63):
        _evaluation(s, at)
    decoded = assert_same(request.SerializeToString())
    assert decoded is not None
    observed = decoded.scores["observed_at"].cast(pa.int64()).to_pylist()
    assert observed == [T + 5_000, T + 1_000, T + 5_000]


@pytest.mark.parametrize(("links", "on_carrier"), [(1, False), (2, True)])
def test_an_evaluator_span_s_scores_go_to_the_span_it_links_only_when_it_links_one(
    links: int, on_carrier: bool
) -> None:
    request = ExportTraceServiceRequest()
    s = (
        request.resource_spans.add()
        .scope_spans.add()
        .spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=T, end_time_unix_nano=T + 5)
    )
    s.attributes.extend(key_values([("openinference.span.kind", "EVALUATOR"), ("eval.relevance", 0.5)]))
    for i in range(links):
        s.links.add(trace_id=bytes([i + 7]) * 16, span_id=bytes([i + 7]) * 8)
    decoded = assert_same(request.SerializeToString())
    assert decoded is not None
    assert decoded.scores["span_id"].to_pylist() == ["02" * 8 if on_carrier else "07" * 8]


def test_a_completion_chunk_at_the_span_s_start_is_a_first_token_of_zero() -> None:
    request = ExportTraceServiceRequest()
    s = (
        request.resource_spans.add()
        .scope_spans.add()
        .spans.add(
            trace_id=b"\x01" * 16,
            span_id=b"\x02" * 8,
            name="chat m",
            start_time_unix_nano=T,
            end_time_unix_nano=T + 10**9,
        )
    )
    s.attributes.extend(key_values([("gen_ai.operation.name", "chat")]))
    s.events.add(name="gen_ai.content.completion.chunk", time_unix_nano=T + 3_000_000)
    s.events.add(name="gen_ai.content.completion.chunk", time_unix_nano=T)
    s.events.add(name="gen_ai.content.completion.chunk", time_unix_nano=T - 1)
    decoded = assert_same(request.SerializeToString())
    assert decoded is not None
    assert decoded.spans["ttft_ms"].to_pylist() == [0.0]
