"""The decoder entry points a request body reaches, as fuzz targets: traces, logs and metrics, each as protobuf,
OTLP/JSON and gzip-compressed protobuf, exactly as the receivers call them.

A target returns normally for every input the service answers with a defined status: a decoded request
(whatever it rejected is counted by reason in its `Decoded`), or an `ExportError` the receivers map to an
OTLP status (400 malformed, 413 too large). Anything else escaping is a bug: the request would be answered
503 with a traceback and retried forever."""

from __future__ import annotations

from collections.abc import Callable

from collector.decode import Decoded, Encoding, decode_logs, decode_metrics, decode_traces
from collector.errors import MalformedPayload, PayloadTooLarge
from collector.http_receiver import gunzip

# The default ingest.max_request_bytes: a gzip body may inflate to this much.
INFLATE_LIMIT = 16 * 1024 * 1024

DECODERS: dict[str, Callable[[bytes, Encoding], Decoded]] = {
    "traces": decode_traces,
    "logs": decode_logs,
    "metrics": decode_metrics,
}


def _target(signal: str, encoding: str) -> Callable[[bytes], Decoded]:
    decode = DECODERS[signal]
    if encoding == "gzip":
        return lambda data: decode(gunzip(data, INFLATE_LIMIT), Encoding.PROTOBUF)
    return lambda data: decode(data, Encoding(encoding))


TARGETS: dict[str, Callable[[bytes], Decoded]] = {
    f"{signal}_{encoding}": _target(signal, encoding)
    for signal in DECODERS
    for encoding in ("protobuf", "json", "gzip")
}


def answer(target: str, data: bytes) -> str:
    """What the service would answer `data` with: 'ok' (rejections counted), or the refusal's kind."""
    try:
        decoded = TARGETS[target](data)
    except MalformedPayload:
        return "malformed"
    except PayloadTooLarge:
        return "too_large"
    # Counted by reason: every rejection has one.
    assert decoded.rejections.total == sum(decoded.rejections.counts.values())
    return "ok"
