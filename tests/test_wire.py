"""The fast wire reading of attributes agrees with the generated OTLP classes on every value."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from builders import request, span
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.anyvalue import attributes_dict
from collector.decode import Decoder, Encoding, decode_traces
from collector.errors import MalformedPayload
from collector.wire import TraceRequest, any_value

scalars = st.one_of(
    st.text(max_size=300),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.binary(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def wire_attributes(payload: bytes) -> dict[str, Any]:
    s = TraceRequest.FromString(payload).resource_spans[0].scope_spans[0].spans[0]
    return {k: any_value(v) for k, v in s.attributes.items()}


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=20), values, max_size=12))
def test_wire_decoding_equals_the_generated_classes(attrs: dict[str, Any]) -> None:
    payload = request([span(attributes=attrs)]).SerializeToString()
    reference = attributes_dict(
        ExportTraceServiceRequest.FromString(payload).resource_spans[0].scope_spans[0].spans[0].attributes
    )
    assert wire_attributes(payload) == reference


def test_duplicate_keys_keep_the_last_value_as_the_sdks_do() -> None:
    s = span(attributes={"k": 1})
    s.attributes.extend(span(attributes={"k": 2}).attributes)
    assert wire_attributes(request([s]).SerializeToString()) == {"k": 2}


def test_nan_and_infinities_survive_as_floats() -> None:
    got = wire_attributes(request([span(attributes={"n": math.nan, "i": math.inf})]).SerializeToString())
    assert math.isnan(got["n"]) and got["i"] == math.inf


def test_invalid_utf8_in_a_string_value_is_a_malformed_request(decoder: Decoder) -> None:
    payload = request([span(attributes={"k": "abc"})]).SerializeToString()
    corrupt = payload.replace(b"\x0a\x03abc", b"\x0a\x03a\xffc")
    assert corrupt != payload
    with pytest.raises(MalformedPayload, match="not a valid OTLP protobuf ExportTraceServiceRequest"):
        decode_traces(corrupt, Encoding.PROTOBUF, decoder=decoder)


def with_raw_value(raw: bytes) -> bytes:
    """A request whose one attribute, "flag", carries `raw` as its serialized AnyValue (3 bytes)."""
    assert len(raw) == 3
    payload = request([span(attributes={"flag": "X"})]).SerializeToString()
    # A one-character string value is 3 bytes too, so no length prefix around it changes.
    patched = payload.replace(b"\x0a\x04flag\x12\x03\x0a\x01X", b"\x0a\x04flag\x12\x03" + raw)
    assert patched != payload
    return patched


def test_a_bool_in_a_longer_than_needed_varint_is_read_as_the_generated_classes_read_it(decoder: Decoder) -> None:
    # 0x80 0x00 is zero in two varint bytes: valid protobuf, but not the one-byte form the fast path reads.
    payload = with_raw_value(b"\x10\x80\x00")
    reference = attributes_dict(
        ExportTraceServiceRequest.FromString(payload).resource_spans[0].scope_spans[0].spans[0].attributes
    )
    assert reference == {"flag": False}
    assert wire_attributes(payload) == reference
    spans = decode_traces(payload, Encoding.PROTOBUF, decoder=decoder).spans
    assert spans is not None
    assert json.loads(spans.column("attributes")[0].as_py()) == reference


def test_a_bool_value_followed_by_a_truncated_field_is_a_malformed_request(decoder: Decoder) -> None:
    payload = with_raw_value(b"\x10\x01\x10")  # a second field tag with no value after it
    with pytest.raises(MalformedPayload, match="not a valid OTLP protobuf ExportTraceServiceRequest"):
        decode_traces(payload, Encoding.PROTOBUF, decoder=decoder)
