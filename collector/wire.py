"""A wire-compatible reading of OTLP trace requests that is cheaper to walk from Python.

The upb protobuf runtime makes a Python wrapper object for every KeyValue and AnyValue touched,
about 1 µs per attribute, which was ~75% of decoding. This schema reads the same bytes differently:
`Span.attributes` (repeated KeyValue{key=1, value=2}) is declared as `map<string, bytes>`, whose
entries have exactly that wire layout, so upb hands over each attribute as (str, raw AnyValue bytes)
and `any_value` decodes the common scalar encodings directly. Duplicate keys resolve as in the SDKs:
the last one wins. Measured ~40% faster than walking the generated classes (docs/benchmarks.md).
"""

from __future__ import annotations

import struct
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from collector.anyvalue import convert, which_oneof

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _message(
    file: descriptor_pb2.FileDescriptorProto,
    name: str,
    fields: list[tuple[str, int, int, int, str | None]],
    nested: tuple[descriptor_pb2.DescriptorProto, ...] = (),
) -> None:
    msg = file.message_type.add(name=name)
    for n in nested:
        msg.nested_type.add().CopyFrom(n)
    for field_name, number, type_, label, type_name in fields:
        f = msg.field.add(name=field_name, number=number, type=type_, label=label)
        if type_name:
            f.type_name = type_name


def _build() -> type[Message]:
    file = descriptor_pb2.FileDescriptorProto(
        name="tailwatch_otlp_wire.proto", package="tailwatch.wire", syntax="proto3"
    )
    entry = descriptor_pb2.DescriptorProto(
        name="AttributesEntry", options=descriptor_pb2.MessageOptions(map_entry=True)
    )
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_OPT)
    entry.field.add(name="value", number=2, type=_F.TYPE_BYTES, label=_OPT)
    # Field numbers and wire types are those of opentelemetry/proto/trace/v1/trace.proto; enums read as int32.
    _message(file, "Status", [("message", 2, _F.TYPE_STRING, _OPT, None), ("code", 3, _F.TYPE_INT32, _OPT, None)])
    _message(
        file,
        "Span",
        [
            ("trace_id", 1, _F.TYPE_BYTES, _OPT, None),
            ("span_id", 2, _F.TYPE_BYTES, _OPT, None),
            ("parent_span_id", 4, _F.TYPE_BYTES, _OPT, None),
            ("name", 5, _F.TYPE_STRING, _OPT, None),
            ("kind", 6, _F.TYPE_INT32, _OPT, None),
            ("start_time_unix_nano", 7, _F.TYPE_FIXED64, _OPT, None),
            ("end_time_unix_nano", 8, _F.TYPE_FIXED64, _OPT, None),
            ("attributes", 9, _F.TYPE_MESSAGE, _REP, ".tailwatch.wire.Span.AttributesEntry"),
            ("events", 11, _F.TYPE_BYTES, _REP, None),
            ("links", 13, _F.TYPE_BYTES, _REP, None),
            ("status", 15, _F.TYPE_MESSAGE, _OPT, ".tailwatch.wire.Status"),
        ],
        nested=(entry,),
    )
    # The resource and the scope are read from the official messages, which merge a copy sent twice.
    _message(file, "ScopeSpans", [("spans", 2, _F.TYPE_MESSAGE, _REP, ".tailwatch.wire.Span")])
    _message(file, "ResourceSpans", [("scope_spans", 2, _F.TYPE_MESSAGE, _REP, ".tailwatch.wire.ScopeSpans")])
    _message(file, "TraceRequest", [("resource_spans", 1, _F.TYPE_MESSAGE, _REP, ".tailwatch.wire.ResourceSpans")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tailwatch.wire.TraceRequest"))


TraceRequest = _build()

_unpack_double = struct.Struct("<d").unpack_from
# AnyValue field tags: string_value=1 (LEN), bool_value=2 (VARINT), int_value=3 (VARINT), double_value=4 (I64).
_STRING, _BOOL, _INT, _DOUBLE = 0x0A, 0x10, 0x18, 0x21


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[i]
        result |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return result, i
        shift += 7


def any_value(raw: bytes) -> Any:  # noqa: PLR0911 - one early return per wire encoding
    """Decode a serialized AnyValue: the scalar kinds inline, the rest through the generated class."""
    if not raw:
        return None
    tag = raw[0]
    # A single field in canonical order is what every SDK writes; anything else takes the general path.
    if tag == _STRING:
        if raw[1] < 0x80:
            if len(raw) == raw[1] + 2:
                return raw[2:].decode()
        else:
            length, start = _varint(raw, 1)
            if len(raw) == start + length:
                return raw[start:].decode()
    elif tag == _INT:
        value, end = _varint(raw, 1)
        if end == len(raw):
            return value - (1 << 64) if value >= 1 << 63 else value
    elif tag == _DOUBLE and len(raw) == 9:
        return _unpack_double(raw, 1)[0]
    elif tag == _BOOL and len(raw) == 2:
        return raw[1] != 0
    general = AnyValue.FromString(raw)
    return convert(general, which_oneof(general, "value"))
