"""OTLP/JSON bodies → protobuf messages, so JSON and protobuf share one decoder.

OTLP/JSON differs from protobuf's canonical JSON mapping in one way that matters: trace and span ids
are hex, not base64 (spec: 'JSON Protobuf Encoding'). Enums as integers and int64 as strings are
standard proto3 JSON and `json_format` already accepts them.
"""

from __future__ import annotations

import base64
from typing import Any, TypeVar

import orjson
from google.protobuf import json_format
from google.protobuf.message import Message

from collector.errors import MalformedPayload

M = TypeVar("M", bound=Message)

_ID_KEYS = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")
# (container key, item key) paths from the request root down to the objects that carry ids.
_TRACE_PATH = (("resourceSpans", "resource_spans"), ("scopeSpans", "scope_spans"), ("spans",))
_LOGS_PATH = (("resourceLogs", "resource_logs"), ("scopeLogs", "scope_logs"), ("logRecords", "log_records"))
_METRICS_PATH = (("resourceMetrics", "resource_metrics"), ("scopeMetrics", "scope_metrics"), ("metrics",))
_METRIC_DATA = ("gauge", "sum", "histogram", "exponentialHistogram", "exponential_histogram", "summary")


def parse(payload: bytes, message: type[M]) -> M:
    """Parse an OTLP/JSON request body into `message`, raising MalformedPayload with the reason."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise MalformedPayload(f"invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedPayload("an OTLP/JSON body must be a JSON object")
    if message.DESCRIPTOR.name.startswith("ExportMetrics"):
        _drop_exemplars(doc)
    else:
        path = _LOGS_PATH if message.DESCRIPTOR.name.startswith("ExportLogs") else _TRACE_PATH
        for item in _walk(doc, path):
            _hex_ids_to_base64(item)
            for link in _list(item, ("links",)):
                _hex_ids_to_base64(link)
    try:
        return json_format.ParseDict(doc, message(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise MalformedPayload(f"not a valid OTLP/JSON {message.DESCRIPTOR.name}: {exc}") from None


def _list(obj: dict[str, Any], keys: tuple[str, ...]) -> list[Any]:
    for key in keys:
        value = obj.get(key)
        if value is not None:
            if not isinstance(value, list):
                raise MalformedPayload(f"'{key}' must be a JSON array")
            return value
    return []


def _walk(doc: dict[str, Any], path: tuple[tuple[str, ...], ...]) -> list[dict[str, Any]]:
    level: list[Any] = [doc]
    for keys in path:
        nxt: list[Any] = []
        for obj in level:
            if not isinstance(obj, dict):
                raise MalformedPayload("expected a JSON object inside the OTLP request")
            nxt.extend(_list(obj, keys))
        level = nxt
    return [o for o in level if isinstance(o, dict)]


def _hex_ids_to_base64(obj: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise MalformedPayload(f"'{key}' must be a hex string")
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise MalformedPayload(f"'{key}' is not hex: {value[:40]!r}") from None
        obj[key] = base64.b64encode(raw).decode("ascii")


def _drop_exemplars(doc: dict[str, Any]) -> None:
    # Exemplars are the only place metrics carry (hex) ids, and Tailwatch does not use them.
    for metric in _walk(doc, _METRICS_PATH):
        for key in _METRIC_DATA:
            data = metric.get(key)
            if isinstance(data, dict):
                for point in _list(data, ("dataPoints", "data_points")):
                    if isinstance(point, dict):
                        point.pop("exemplars", None)
