"""The decoder entry points a request body reaches, as fuzz targets: traces, logs and metrics, each as protobuf,
OTLP/JSON and gzip-compressed protobuf, exactly as the receivers call them.

A target returns normally for every input the service answers with a defined status: a decoded request
(whatever it rejected is counted by reason in its `Decoded`), or an `ExportError` the receivers map to an
OTLP status (400 malformed, 413 too large). Anything else escaping is a bug: the request would be answered
503 with a traceback and retried forever."""

from __future__ import annotations

from collections.abc import Callable

from collector import native_walk
from collector.decode import Decoded, Decoder, Encoding, decode_logs, decode_metrics, decode_traces
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


def same_decoding(payload: bytes, *, split_attributes: bool = False) -> Decoded:
    """Decode with the compiled walk and with the Python reference; they must agree on the batch, the
    scores and the rejections, or both refuse the request (MalformedPayload, raised again here)."""
    outcomes: list[Decoded | MalformedPayload] = []
    for decoder in (Decoder.PYTHON, Decoder.NATIVE):
        try:
            outcomes.append(
                decode_traces(payload, Encoding.PROTOBUF, decoder=decoder, split_attributes=split_attributes)
            )
        except MalformedPayload as exc:
            outcomes.append(exc)
    reference, native = outcomes
    if isinstance(native, MalformedPayload):
        # Two damaged encodings upb reads past and prost refuses (docs/decoder.md): a known field with the wrong
        # wire type (an unknown field to upb, protobuf's C++ rule) and an over-long or overflowing varint.
        stricter = any(why in str(native) for why in ("invalid wire type", "invalid varint"))
        assert isinstance(reference, MalformedPayload) or stricter, f"only the compiled one refused: {native}"
        raise native
    assert not isinstance(reference, MalformedPayload), f"only the reference refused it: {reference}"
    assert reference.spans is not None and native.spans is not None
    for name in reference.spans.column_names:
        assert native.spans[name].equals(reference.spans[name]), f"column {name} differs"
    assert native.scores.equals(reference.scores), "scores differ"
    assert native.rejections == reference.rejections, "rejections differ"
    return native


TARGETS: dict[str, Callable[[bytes], Decoded]] = {
    f"{signal}_{encoding}": _target(signal, encoding)
    for signal in DECODERS
    for encoding in ("protobuf", "json", "gzip")
}
# traces_protobuf runs the default decoder (the compiled one where it is built); these two add the Python
# reference alone and the two compared on every input. They start from traces_protobuf's corpus.
TARGETS["traces_reference"] = lambda data: decode_traces(data, Encoding.PROTOBUF, decoder=Decoder.PYTHON)
if native_walk.AVAILABLE:  # where cargo built it; tests/test_native_decoder.py fails CI if it did not
    TARGETS["traces_differential"] = same_decoding
CORPUS = {
    target: "traces_protobuf" if target in ("traces_reference", "traces_differential") else target for target in TARGETS
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
