"""Writes the fuzz corpus from real exporters: the simulator sends a few requests of every kind through the
OpenTelemetry SDK's HTTP exporters (traces with both emitters, evaluation log records, engine metrics) to a
capturing server here; each body is kept as protobuf, as OTLP/JSON and gzip-compressed, per target.

    .venv/bin/python tests/fuzz/seed.py     # rewrites tests/fuzz/corpus/
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import shutil
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from simulator import simulate  # noqa: E402

MESSAGES: dict[str, Any] = {
    "traces": ExportTraceServiceRequest,
    "logs": ExportLogsServiceRequest,
    "metrics": ExportMetricsServiceRequest,
}
ID_FIELDS = {"traceId", "spanId", "parentSpanId"}


def otlp_json(message: Any) -> bytes:
    """OTLP/JSON as the spec writes it: ids in hex (protobuf's JSON mapping would give base64)."""

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (base64_to_hex(v) if k in ID_FIELDS and isinstance(v, str) else fix(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    return json.dumps(fix(MessageToDict(message)), separators=(",", ":")).encode()


def base64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def capture() -> dict[str, list[bytes]]:
    bodies: dict[str, list[bytes]] = {signal: [] for signal in MESSAGES}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            bodies[self.path.rsplit("/", 1)[-1]].append(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    for emitter in simulate.EMITTERS:
        simulate.run(
            ["kv_eviction", "noisy_neighbor"], endpoint=endpoint, protocol="http", seed=3, end=end,
            history_hours=0.02, history_rate=0.5, rate=0.2, emitter=emitter,
        )  # fmt: skip
    server.shutdown()
    return bodies


def small(signal: str, body: bytes, per: int = 3) -> list[Any]:
    """Requests of a few items each, cut from a captured body with its resources and scopes: an exporter
    batches hundreds, and a fuzzer learns as much from a few at a fraction of the time per input."""
    message = MESSAGES[signal].FromString(body)
    out = []
    for resource in getattr(message, f"resource_{signal}" if signal != "traces" else "resource_spans"):
        scopes = resource.scope_spans if signal == "traces" else getattr(resource, f"scope_{signal}")
        for scope in scopes:
            items = scope.spans if signal == "traces" else scope.log_records if signal == "logs" else scope.metrics
            for start in range(0, len(items), per):
                part = MESSAGES[signal]()
                r = getattr(part, "resource_spans" if signal == "traces" else f"resource_{signal}").add()
                r.resource.CopyFrom(resource.resource)
                sc = (r.scope_spans if signal == "traces" else getattr(r, f"scope_{signal}")).add()
                sc.scope.CopyFrom(scope.scope)
                kept = sc.spans if signal == "traces" else sc.log_records if signal == "logs" else sc.metrics
                kept.extend(items[start : start + per])
                out.append(part)
    return out


def main() -> None:
    corpus = HERE / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    for signal, bodies in capture().items():
        parts = {p.SerializeToString(): p for body in bodies for p in small(signal, body)}
        # Every distinct shape the exporters sent, a few of each: the first few and some further in.
        kept = list(parts.items())[:: max(1, len(parts) // 16)][:16]
        for body, message in kept:
            for encoding, data in (
                ("protobuf", body),
                ("json", otlp_json(message)),
                ("gzip", gzip.compress(body, mtime=0)),
            ):
                target = corpus / f"{signal}_{encoding}"
                target.mkdir(parents=True, exist_ok=True)
                (target / hashlib.sha1(data).hexdigest()).write_bytes(data)
        print(f"{signal}: {len(kept)} seeds cut from {len(bodies)} exported bodies")


if __name__ == "__main__":
    main()
